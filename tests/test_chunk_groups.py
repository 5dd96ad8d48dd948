"""Jobs of several chunks (issue 33): a job (an in-process call, a Ray task) may train the runs of
several consecutive missing chunks as one group and return one result per chunk; each chunk is
still written, checksummed and listed complete on its own. The store does not depend on how many
chunks a job took, bit for bit; an interruption inside a job leaves whole chunks, and the rerun
makes exactly the missing ones; the job size follows the rule of :func:`zoo.generate.executors.job_size`
and :meth:`ClassifierRecipe.chunks_per_job`. The multi-chunk path is forced on the CPU with
``ZOO_JOB_CHUNKS``."""

import sys

import numpy as np
import pytest
import torch

import zoo.generate.run as run
from clf_helpers import trajectory_options, write_mnist_like
from generate_helpers import TINY, WriteFailed, assert_identical_stores, fail_writing, kill_after_chunks
from zoo.generate.classifiers import ClassifierRecipe
from zoo.generate.executors import MAX_CHUNKS_PER_JOB, LocalExecutor, job_size, split_jobs
from zoo.generate.kinds import get_kind
from zoo.generate.recipe import JOB_CHUNKS_VARIABLE
from zoo.generate.run import GenerateOptions, generate
from zoo.generate.writeback import DEPTH_VARIABLE, write_depth
from zoo.sources import get_source
from zoo.store.manifest import read_manifest
from zoo.train.trainer import GPU_GROUP_SHARE, network_bytes

QUIET = dict(log=lambda *_: None)


@pytest.fixture(scope="module")
def mnist_like(tmp_path_factory):
    return write_mnist_like(tmp_path_factory.mktemp("mnist-like"))


def options(root, **kw):
    """12 runs of 4 checkpoints, 2 runs a chunk: 6 chunks (train 9 runs, val 2, test 1 after --limit)."""
    return trajectory_options(root, **{"limit": 12, **kw})


@pytest.fixture(scope="module")
def reference(mnist_like, tmp_path_factory):
    """One chunk per job (today's path), for plain and diverse runs."""
    stores = {}
    with pytest.MonkeyPatch.context() as env:
        env.delenv(JOB_CHUNKS_VARIABLE, raising=False)
        for name, kw in {"plain": {}, "diverse": {"diversity": True}}.items():
            out = tmp_path_factory.mktemp(f"reference-{name}") / "store"
            generate(GenerateOptions(out=str(out), **options(mnist_like, **kw)), **QUIET)
            stores[name] = out
    return stores


class Recording(LocalExecutor):
    """Runs the jobs here and records each job's chunks; ``name``/``workers`` pose as Ray's."""

    def __init__(self, name: str = "local", workers: int = 1):
        self.name, self.workers, self.jobs = name, workers, []

    def map_unordered(self, fn, jobs):
        for job in jobs:
            target = job["target"]
            self.jobs.append([t.chunk for t in target] if isinstance(target, list) else [target.chunk])
            yield fn(**job)


def recording(monkeypatch, **kw) -> Recording:
    executor = Recording(**kw)
    monkeypatch.setattr(run, "make_executor", lambda *a, **k: executor)
    return executor


# ------------------------------------------------------------------------ bit for bit
@pytest.mark.parametrize("chunks, name, depth, progress", [
    ("2", "plain", "0", False), ("3", "plain", "2", True), ("6", "diverse", "0", True), ("4", "diverse", "3", False),
])
def test_jobs_of_several_chunks_make_the_single_chunk_store(reference, mnist_like, tmp_path, monkeypatch, chunks,
                                                            name, depth, progress):
    monkeypatch.setenv(JOB_CHUNKS_VARIABLE, chunks)
    monkeypatch.setenv(DEPTH_VARIABLE, depth)
    executor = recording(monkeypatch)
    out = tmp_path / "store"
    kw = {"diversity": True} if name == "diverse" else {}
    generate(GenerateOptions(out=str(out), **options(mnist_like, progress=progress, **kw)), **QUIET)
    assert executor.jobs == split_jobs(list(range(6)), int(chunks)) and max(map(len, executor.jobs)) > 1
    assert_identical_stores(reference[name], out)  # arrays, table, statistics, every file's checksum


def test_a_url_store_written_by_its_tasks_is_the_same(reference, mnist_like, tmp_path, monkeypatch):
    """Where the task writes its chunks itself (finish_chunk), a job writes each of its chunks."""
    import fsspec

    monkeypatch.setenv(JOB_CHUNKS_VARIABLE, "3")
    executor = recording(monkeypatch)
    out = f"memory://chunk-groups-{tmp_path.name}"
    try:
        generate(GenerateOptions(out=out, **options(mnist_like)), **QUIET)
        assert executor.jobs == [[0, 1, 2], [3, 4, 5]]
        assert_identical_stores(reference["plain"], out)
    finally:
        fsspec.filesystem("memory").rm(out.split("://")[1], recursive=True)


def test_ray_tasks_return_their_chunks_results(reference, mnist_like, tmp_path, monkeypatch):
    """Ray's map_unordered hands back a job's list of results; with 2 workers no job takes more
    than half the 6 chunks, whatever was asked."""
    pytest.importorskip("ray")
    monkeypatch.setenv(JOB_CHUNKS_VARIABLE, "6")
    jobs, real = [], run.split_jobs
    monkeypatch.setattr(run, "split_jobs", lambda todo, size: jobs.extend(real(todo, size)) or real(todo, size))
    out = tmp_path / "store"
    generate(GenerateOptions(out=str(out), **options(mnist_like, workers=2, use_ray=True)), **QUIET)
    assert jobs == [[0, 1, 2], [3, 4, 5]]
    assert_identical_stores(reference["plain"], out)


# ------------------------------------------------------------------------ interruptions
@pytest.mark.parametrize("depth", ["0", "3"])
def test_a_write_failing_inside_a_job_leaves_whole_chunks_and_the_rerun_makes_the_rest(reference, mnist_like,
                                                                                        tmp_path, monkeypatch, depth):
    """Jobs [0, 1, 2] and [3, 4, 5]; writing chunk 4, the second of its job, fails: chunks 0-3 are
    listed, and the rerun makes exactly 4 and 5, as one job."""
    monkeypatch.setenv(JOB_CHUNKS_VARIABLE, "3")
    monkeypatch.setenv(DEPTH_VARIABLE, depth)
    real = run.write_chunk
    failure, attempted = fail_writing(monkeypatch, 4)
    out = tmp_path / "store"
    with pytest.raises(WriteFailed) as raised:
        generate(GenerateOptions(out=str(out), **options(mnist_like)), **QUIET)
    assert raised.value is failure and attempted == [0, 1, 2, 3, 4]
    manifest = read_manifest(out)
    assert manifest["complete_chunks"] == [0, 1, 2, 3] and manifest["status"] == "in_progress"
    assert sorted(k for k in manifest["checksums"]["files"] if k.startswith("fragments/")) == [
        f"fragments/chunk-00000{c}.parquet" for c in range(4)]

    monkeypatch.setattr(run, "write_chunk", real)
    executor, logs = recording(monkeypatch), []
    generate(GenerateOptions(out=str(out), **options(mnist_like)), log=logs.append)
    assert any("2 of 6 chunks left" in line for line in logs), logs
    assert executor.jobs == [[4, 5]]  # exactly the missing chunks, nothing made twice
    assert_identical_stores(reference["plain"], out)


def test_a_process_killed_inside_a_job_resumes_without_gaps(reference, mnist_like, tmp_path, monkeypatch):
    """SIGKILL right after the first chunk of the job [0, 1, 2] is listed; the rerun (one chunk
    per job) makes 1-5, and the store equals the uninterrupted one."""
    monkeypatch.setenv(JOB_CHUNKS_VARIABLE, "3")  # the killed process inherits it
    monkeypatch.setenv(DEPTH_VARIABLE, "0")  # chunk 1 is not written before the kill
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "cli", "generate", "mnist-classifiers", "--out", str(out), "--data-root",
           str(mnist_like), "--source-option", "verify=false", "--limit", "12", "--batch-size", "32", "--steps",
           "12", "--checkpoint-every", "4", "--chunk-size", "8"]
    state = kill_after_chunks(cmd, out, chunks=1)
    assert state["complete_chunks"] == [0] and state["status"] == "in_progress"
    monkeypatch.delenv(JOB_CHUNKS_VARIABLE)
    executor = recording(monkeypatch)
    generate(GenerateOptions(out=str(out), **options(mnist_like)), **QUIET)
    assert executor.jobs == [[c] for c in range(1, 6)]
    assert_identical_stores(reference["plain"], out)


# ------------------------------------------------------------------------ the job-size rule
def test_job_size_caps_the_recipes_wish():
    chunk = 500 << 20
    assert job_size(1, 34, 1, chunk, None) == 1  # a CPU recipe: one chunk, whatever else
    assert job_size(116, 34, 1, chunk, None) == MAX_CHUNKS_PER_JOB  # a sane maximum
    assert job_size(10, 34, 1, chunk, None) == 10
    assert job_size(10, 34, 4, chunk, None) == 9  # ceil(34 / 4): every worker gets a job
    assert job_size(10, 5, 2, chunk, None) == 3
    assert job_size(10, 1, 8, chunk, None) == 1
    # the host: (workers + 1) jobs' chunks in half the available memory
    assert job_size(10, 34, 1, chunk, 12 * chunk) == 3  # 6 chunks // 2
    assert job_size(10, 34, 2, chunk, 12 * chunk) == 2  # 6 chunks // 3
    assert job_size(10, 34, 1, chunk, chunk) == 1  # never below one chunk


def test_jobs_are_consecutive_and_even():
    assert split_jobs(list(range(34)), 32) == [list(range(17)), list(range(17, 34))]
    assert split_jobs([2, 3, 7, 8, 9], 3) == [[2, 3, 7], [8, 9]]
    assert split_jobs([5], 4) == [[5]] and split_jobs([], 3) == []
    assert split_jobs(list(range(6)), 1) == [[c] for c in range(6)]
    for size in range(1, 8):
        jobs = split_jobs(list(range(10)), size)
        assert sum(jobs, []) == list(range(10)) and max(map(len, jobs)) <= size
        assert max(map(len, jobs)) - min(map(len, jobs)) <= 1


def test_the_writer_holds_a_whole_job(monkeypatch):
    monkeypatch.delenv(DEPTH_VARIABLE, raising=False)
    big = 64 << 20
    assert write_depth(big, True, 1) == 2 and write_depth(big, True, 5) == 5 and write_depth(big, False, 7) == 7
    assert write_depth(1 << 10, True, 5) == 0  # small chunks in this process: still synchronous
    monkeypatch.setenv(DEPTH_VARIABLE, "1")
    assert write_depth(big, True, 5) == 1  # forced


@pytest.fixture()
def planned(mnist_like, monkeypatch):
    """A fmnist-sized classifier recipe, planned: 149 checkpoints a run, 6 runs a chunk."""
    monkeypatch.delenv(JOB_CHUNKS_VARIABLE, raising=False)

    def plan(**kw):
        opts = GenerateOptions(out="unused", **{**options(mnist_like, steps=295, checkpoint_every=2, limit=40,
                                                         batch_size=1024, chunk_size=1024), **kw})
        recipe = get_kind(opts.kind).recipe(opts)
        recipe.plan(get_source("mnist", root=opts.data_root, verify=False))
        assert recipe.checkpoints == 149 and recipe.runs_per_chunk == 6
        return recipe
    return plan


def fake_gpu(monkeypatch, free: int) -> None:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 2 * free))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)


def test_a_gpu_job_takes_the_chunks_the_trainers_memory_budget_holds(planned, monkeypatch):
    recipe = planned()
    per_run = network_bytes(recipe.spec, recipe.schedule, 295, 149)  # the trainer's own estimate
    assert 80e6 < per_run < 120e6  # ~100 MB a Fashion-MNIST run (docs/classifiers.md)
    fake_gpu(monkeypatch, free=int(140e9))  # an H200
    group = int(GPU_GROUP_SHARE * 140e9) // per_run
    assert recipe.chunks_per_job("cuda", 1) == group // 6 > MAX_CHUNKS_PER_JOB  # job_size caps it
    assert recipe.chunks_per_job("cuda:0", 2) == group // 2 // 6  # two tasks share the GPU
    fake_gpu(monkeypatch, free=int(2e9))  # 10 runs fit: one chunk
    assert recipe.chunks_per_job("cuda", 1) == 1
    fake_gpu(monkeypatch, free=int(0.1e9))  # not even one run: still one chunk
    assert recipe.chunks_per_job("cuda", 1) == 1
    assert planned(group=30).chunks_per_job("cuda", 1) == 5  # a group given by hand: its runs
    assert recipe.chunks_per_job("cpu", 1) == 1  # a CPU: one chunk, today's path
    monkeypatch.setenv(JOB_CHUNKS_VARIABLE, "4")
    assert recipe.chunks_per_job("cpu", 1) == 4  # forced (tests, benchmarks)
    monkeypatch.setenv(JOB_CHUNKS_VARIABLE, "0")
    with pytest.raises(ValueError, match=JOB_CHUNKS_VARIABLE):
        recipe.chunks_per_job("cpu", 1)


def test_inr_jobs_take_one_chunk(monkeypatch):
    monkeypatch.setenv(JOB_CHUNKS_VARIABLE, "4")  # forces only recipes whose jobs take several
    recipe = get_kind("mnist-inr").recipe(GenerateOptions(out="unused", **TINY))
    assert recipe.chunks_per_job("cuda", 1) == 1 and recipe.chunks_per_job("cpu", 1) == 1


def test_the_run_applies_the_rule_to_the_missing_chunks(reference, mnist_like, tmp_path, monkeypatch):
    """Through generate(): the recipe's wish, capped by the workers (an executor posing as Ray's with
    4 workers: ceil(6 / 4) = 2) and by the host memory."""
    monkeypatch.setattr(ClassifierRecipe, "chunks_per_job", lambda self, device, workers: 100)
    executor = recording(monkeypatch, name="ray", workers=4)
    generate(GenerateOptions(out=str(tmp_path / "a"), **options(mnist_like)), **QUIET)
    assert executor.jobs == [[0, 1], [2, 3], [4, 5]]
    assert_identical_stores(reference["plain"], tmp_path / "a")

    executor = recording(monkeypatch)
    monkeypatch.setattr(run, "host_memory_available", lambda: 0)
    generate(GenerateOptions(out=str(tmp_path / "b"), **options(mnist_like)), **QUIET)
    assert executor.jobs == [[c] for c in range(6)]

    monkeypatch.undo()  # the real rule on this CPU: one chunk per job
    monkeypatch.delenv(JOB_CHUNKS_VARIABLE, raising=False)
    executor = recording(monkeypatch)
    generate(GenerateOptions(out=str(tmp_path / "c"), **options(mnist_like)), **QUIET)
    assert executor.jobs == [[c] for c in range(6)]
    np.testing.assert_array_equal(read_manifest(tmp_path / "c")["complete_chunks"], range(6))
