"""Only making chunks runs on the thread that makes them (issue 33): a chunk the driver writes has its
train moments taken by the background writer, as it writes it, a block of entries at a time
(:mod:`zoo.store.stats`); the statistics are the same bits as the whole-chunk formula's, the store
the same as the synchronous path's; the writer still holds a bounded number of chunks, and a
failure in its new work loses nothing written and the rerun resumes. None of these tests depends
on timing."""

import threading
import time

import numpy as np
import pytest

import zoo.generate.run as run
from clf_helpers import trajectory_options, write_mnist_like
from generate_helpers import assert_identical_stores
from zoo.generate.classifiers import ClassifierRecipe
from zoo.generate.recipe import JOB_CHUNKS_VARIABLE
from zoo.generate.run import GenerateOptions, generate
from zoo.generate.writeback import DEPTH_VARIABLE
from zoo.store import WeightStore
from zoo.store.manifest import read_manifest
from zoo.store.stats import BLOCK_ENTRIES, STD_FLOOR, Moments, TrainMoments, reduce_moments

QUIET = dict(log=lambda *_: None)
ZOOS = {"plain": {}, "wild": {"lr": 1e12}}  # wild: runs diverge, the statistics keep only the "ok" networks


def options(root, **kw):
    """12 runs of 4 checkpoints, 2 runs a chunk: 6 chunks (train 9 runs, val 2, test 1)."""
    return trajectory_options(root, **{"limit": 12, **kw})


def whole_chunk_moments(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The formula the blocked moments must match bit for bit: the whole array in float64."""
    values = np.asarray(values, dtype=np.float64)
    mean = values.mean(0)
    return mean, ((values - mean) ** 2).sum(0)


def as_moments(arrays: dict[str, np.ndarray]) -> Moments:
    """:class:`Moments` by :func:`whole_chunk_moments` (zeros for no networks, as stored)."""
    if not len(next(iter(arrays.values()))):
        return Moments(0, {k: np.zeros(v.shape[1:]) for k, v in arrays.items()},
                       {k: np.zeros(v.shape[1:]) for k, v in arrays.items()})
    pairs = {k: whole_chunk_moments(v) for k, v in arrays.items()}
    return Moments(len(next(iter(arrays.values()))), {k: p[0] for k, p in pairs.items()},
                   {k: p[1] for k, p in pairs.items()})


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.view(np.uint64), b.view(np.uint64))


@pytest.fixture(scope="module")
def mnist_like(tmp_path_factory):
    return write_mnist_like(tmp_path_factory.mktemp("mnist-like"))


@pytest.fixture(scope="module")
def synchronous(mnist_like, tmp_path_factory):
    """The reference stores: one chunk a job, each written and its moments taken in the main thread."""
    stores = {}
    with pytest.MonkeyPatch.context() as env:
        env.setenv(DEPTH_VARIABLE, "0")
        env.delenv(JOB_CHUNKS_VARIABLE, raising=False)
        for name, kw in ZOOS.items():
            out = tmp_path_factory.mktemp(f"sync-{name}") / "store"
            generate(GenerateOptions(out=str(out), **options(mnist_like, **kw)), **QUIET)
            stores[name] = out
    return stores


# ---------------------------------------------------------------- the moments, block by block
def test_blocked_moments_are_the_whole_arrays_bit_for_bit():
    """Random architectures (entry counts around the block size, single-entry arrays), random
    subsets of networks, one or several threads: the same float64 bits as the whole-array formula."""
    rng = np.random.default_rng(7)
    sizes = [1, 2, 3, 2 * BLOCK_ENTRIES, 2 * BLOCK_ENTRIES + 1, 3 * BLOCK_ENTRIES + 1, 5 * BLOCK_ENTRIES - 3]
    for trial in range(12):
        n = int(rng.integers(1, 40))
        shapes = {f"a{i}": (int(s),) if rng.random() < 0.5 else (int(rng.integers(1, 9)), int(s))
                  for i, s in enumerate(rng.choice(sizes, size=3))}
        arrays = {k: (rng.standard_normal((n, *shape)) * 10.0 ** rng.uniform(-4, 4)).astype(np.float32)
                  for k, shape in shapes.items()}
        arrays["a0"][rng.random(arrays["a0"].shape) < 0.2] = -0.0
        rows = np.flatnonzero(rng.random(n) < 0.6) if trial % 2 else None
        if rows is not None and len(rows) == 0:
            rows = np.array([n - 1])
        got = Moments.of(arrays, rows=rows, threads=1 + trial % 3)
        assert got.count == (n if rows is None else len(rows))
        for k, v in arrays.items():
            mean, m2 = whole_chunk_moments(v if rows is None else v[rows])
            assert same_bits(got.mean[k], mean) and same_bits(got.m2[k], m2), (k, v.shape, rows)


def test_no_networks_give_zero_moments():
    got = Moments.of({"W1": np.ones((5, 3, 700), np.float32)}, rows=np.array([], dtype=np.int64), threads=2)
    assert got.count == 0 and not got.mean["W1"].any() and got.mean["W1"].shape == (3, 700)


# ---------------------------------------------------------------- the store
@pytest.mark.parametrize("name", ZOOS)
@pytest.mark.parametrize("chunks, depth", [("1", "2"), ("3", "3")])
def test_moments_taken_by_the_writer_make_the_synchronous_store(synchronous, mnist_like, tmp_path, monkeypatch,
                                                               name, chunks, depth):
    monkeypatch.setenv(JOB_CHUNKS_VARIABLE, chunks)
    monkeypatch.setenv(DEPTH_VARIABLE, depth)
    threads, real = set(), run.train_moments

    def train_moments(*args):
        threads.add(threading.current_thread().name)
        return real(*args)

    monkeypatch.setattr(run, "train_moments", train_moments)
    out = tmp_path / "store"
    generate(GenerateOptions(out=str(out), **options(mnist_like, **ZOOS[name])), **QUIET)
    assert threads == {"zoo-chunk-writer"}  # never the thread that trains
    assert_identical_stores(synchronous[name], out)  # arrays, table, statistics, checksums
    assert read_manifest(out)["content_id"] == read_manifest(synchronous[name])["content_id"]


@pytest.mark.parametrize("name", ZOOS)
def test_the_statistics_are_the_whole_chunk_formulas(synchronous, name):
    """From the stored arrays, each chunk's train networks that trained normally by the whole-array
    formula, reduced in chunk order: the stored statistics, bit for bit."""
    store = WeightStore(synchronous[name])
    m, table = store.manifest, store.networks.to_pydict()
    train = m["splits"]["train"]["count"]
    status = np.array(table["status"], dtype=object)
    assert (name == "wild") == bool((status[:train] != "ok").any())
    parts = []
    for start in range(0, train, m["chunk_size"]):
        stop = min(start + m["chunk_size"], train)
        values = store.read(start, stop)
        keep = np.flatnonzero(status[start:stop] == "ok")
        parts.append(TrainMoments(as_moments({k: v[keep] for k, v in values.items()}), as_moments(values)))
    reduced, _ = reduce_moments(parts)
    for k, (mean, std) in store.stats().items():
        assert np.array_equal(mean, reduced.mean[k].astype(np.float32))
        assert np.array_equal(std, np.maximum(reduced.std()[k], STD_FLOOR).astype(np.float32))


# ---------------------------------------------------------------- bounded, and failures
def test_a_slow_writer_holds_a_bounded_number_of_chunks(synchronous, mnist_like, tmp_path, monkeypatch):
    """Writes slowed down: the chunks made and not yet written never exceed the writer's depth plus
    the job being handed over, and the producer had to wait for room."""
    depth, per_job = 2, 2
    monkeypatch.setenv(JOB_CHUNKS_VARIABLE, str(per_job))
    monkeypatch.setenv(DEPTH_VARIABLE, str(depth))
    made, written, held, writers = [0], [0], [], []
    work, real_write, real_writer = ClassifierRecipe.work, run.write_chunk, run.ChunkWriter

    def counted_work(**job):
        results = work(**job)
        made[0] += len(results) if isinstance(results, list) else 1
        return results

    def slow_write(*args, **kwargs):
        held.append(made[0] - written[0])
        time.sleep(0.2)
        fragment = real_write(*args, **kwargs)
        written[0] += 1
        return fragment

    def writer(*args, **kwargs):
        writers.append(real_writer(*args, **kwargs))
        return writers[-1]

    monkeypatch.setattr(ClassifierRecipe, "work", staticmethod(counted_work))
    monkeypatch.setattr(run, "write_chunk", slow_write)
    monkeypatch.setattr(run, "ChunkWriter", writer)
    out = tmp_path / "store"
    generate(GenerateOptions(out=str(out), **options(mnist_like)), **QUIET)
    assert written[0] == 6 and max(held) <= depth + per_job, held
    assert writers[0].depth == depth and writers[0].blocked >= 1
    assert_identical_stores(synchronous["plain"], out)


def test_a_failure_taking_the_moments_loses_nothing_and_the_rerun_resumes(synchronous, mnist_like, tmp_path,
                                                                        monkeypatch):
    """The writer's new work fails for chunk 2 (its files already written): chunks 0 and 1 stay
    listed, chunk 2 is not, the error is the run's; the rerun makes the rest, the same store."""
    monkeypatch.setenv(JOB_CHUNKS_VARIABLE, "3")
    monkeypatch.setenv(DEPTH_VARIABLE, "3")
    real = run.train_moments

    class MomentsFailed(Exception):
        pass

    def train_moments(start, *args):
        if start == 2 * 8:  # chunk 2 (chunks of 8 networks)
            raise MomentsFailed("out of memory")
        return real(start, *args)

    monkeypatch.setattr(run, "train_moments", train_moments)
    out = tmp_path / "store"
    with pytest.raises(MomentsFailed):
        generate(GenerateOptions(out=str(out), **options(mnist_like)), **QUIET)
    manifest = read_manifest(out)
    assert manifest["complete_chunks"] == [0, 1] and manifest["status"] == "in_progress"
    monkeypatch.setattr(run, "train_moments", real)
    logs = []
    generate(GenerateOptions(out=str(out), **options(mnist_like)), log=logs.append)
    assert any("4 of 6 chunks left" in line for line in logs), logs
    assert_identical_stores(synchronous["plain"], out)
