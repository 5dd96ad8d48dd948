"""Ray tasks on GPUs, checked on a CPU machine through Ray's declared resources: ``zoo generate
--workers N --device cuda`` asks for 1/N of a GPU per task, Ray places the N tasks together on one
GPU, and each task sees that GPU as ``CUDA_VISIBLE_DEVICES``."""

import os
import sys
import time
from pathlib import Path

import pytest

from zoo.generate.executors import RayExecutor

ray = pytest.importorskip("ray")


def probe(name: str, rendezvous: str, wait: float) -> dict:
    """Announce this task in ``rendezvous`` (a folder), then wait up to ``wait`` seconds for the other
    task's announcement: it comes only if both tasks run at the same time."""
    folder = Path(rendezvous)
    (folder / name).touch()
    other = "b" if name == "a" else "a"
    deadline = time.monotonic() + wait
    while not (folder / other).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "gpu_ids": ray.get_gpu_ids(),
            "met": (folder / other).exists()}


@pytest.fixture
def one_declared_gpu():
    """A local Ray cluster with 2 CPUs and 1 GPU declared (there is none: Ray only books it)."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import a test module
    ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def run_two(gpus_per_task: float, rendezvous: Path, wait: float) -> list[dict]:
    executor = RayExecutor(workers=2, gpus_per_task=gpus_per_task)
    jobs = [{"name": name, "rendezvous": str(rendezvous), "wait": wait} for name in ("a", "b")]
    try:
        return list(executor.map_unordered(probe, jobs))
    finally:
        executor.shutdown()


def test_two_workers_share_one_gpu_and_see_it(one_declared_gpu, tmp_path):
    # what generate asks for with --workers 2 --device cuda; a long wait: a worker may start slowly
    results = run_two(0.5, tmp_path, wait=120)
    assert [r["visible"] for r in results] == ["0", "0"]
    assert all(len(r["gpu_ids"]) == 1 for r in results)
    assert all(r["met"] for r in results)  # placed together on the one GPU


def test_a_whole_gpu_per_task_runs_them_one_after_the_other(one_declared_gpu, tmp_path):
    # the control: the share is what lets them run together; with a whole GPU each the first cannot
    # meet the second, however long it waits
    results = run_two(1.0, tmp_path, wait=2)
    assert [r["visible"] for r in results] == ["0", "0"]
    assert sorted(r["met"] for r in results) == [False, True]  # the second finds the first's mark


def test_generate_asks_each_task_for_its_share_of_the_gpu(monkeypatch, tmp_path):
    from zoo.generate import run

    asked = {}

    class Stop(Exception):
        pass

    def fake_executor(workers, address, use_ray, gpus_per_task=0.0):
        asked.update(workers=workers, gpus_per_task=gpus_per_task)
        raise Stop

    monkeypatch.setattr(run, "resolve_device", lambda device: "cuda")
    monkeypatch.setattr(run, "make_executor", fake_executor)
    with pytest.raises(Stop):
        run.generate(run.GenerateOptions(kind="mnist-inr", dataset="digits", limit=10, steps=1, workers=4,
                                         device="cpu", out=str(tmp_path / "s"), progress=False),
                     log=lambda *_: None)
    assert asked == {"workers": 4, "gpus_per_task": 0.25}
