"""Ray tasks on GPUs, checked on a CPU machine through Ray's declared resources: ``zoo generate
--workers N --device cuda`` asks for 1/N of a GPU per task, Ray places the N tasks together on one
GPU, and each task sees that GPU as ``CUDA_VISIBLE_DEVICES``."""

import os
import sys
import time

import pytest

from zoo.generate.executors import RayExecutor

ray = pytest.importorskip("ray")


def probe(seconds: float) -> dict:
    start = time.monotonic()
    time.sleep(seconds)
    return {"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "gpu_ids": ray.get_gpu_ids(),
            "start": start, "stop": time.monotonic()}


@pytest.fixture
def one_declared_gpu():
    """A local Ray cluster with 2 CPUs and 1 GPU declared (there is none: Ray only books it)."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import a test module
    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def run_two(gpus_per_task: float) -> list[dict]:
    executor = RayExecutor(workers=2, gpus_per_task=gpus_per_task)
    try:
        return list(executor.map_unordered(probe, [{"seconds": 1.5}, {"seconds": 1.5}]))
    finally:
        executor.shutdown()


def overlap(results) -> bool:
    a, b = results
    return a["start"] < b["stop"] and b["start"] < a["stop"]


def test_two_workers_share_one_gpu_and_see_it(one_declared_gpu):
    results = run_two(0.5)  # what generate asks for with --workers 2 --device cuda
    assert [r["visible"] for r in results] == ["0", "0"]
    assert all(len(r["gpu_ids"]) == 1 for r in results)
    assert overlap(results)  # placed together on the one GPU


def test_a_whole_gpu_per_task_runs_them_one_after_the_other(one_declared_gpu):
    results = run_two(1.0)  # the control: the share is what lets them run together
    assert [r["visible"] for r in results] == ["0", "0"]
    assert not overlap(results)


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
