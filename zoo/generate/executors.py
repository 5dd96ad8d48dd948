"""Where chunks run: in this process, or as Ray tasks (an embedded local cluster or ``--address``).

Both run ``fn(**kwargs)`` for each job and yield results as they finish. ``share(value)`` returns
what a job passes to hand every task the same large read-only value (the value itself here, one
copy in Ray's object store there, which each task reads without copying). Ray is imported only by
the Ray executor, so the fitting core works where Ray is not installed.
"""

from __future__ import annotations

import os
from typing import Callable, Iterable, Iterator


class LocalExecutor:
    """Runs jobs one after the other in this process (no Ray needed)."""

    name = "local"

    def share(self, value):
        return value

    def map_unordered(self, fn: Callable, jobs: Iterable[dict]) -> Iterator:
        for job in jobs:
            yield fn(**job)

    def shutdown(self) -> None:
        pass


class RayExecutor:
    """Runs jobs as Ray tasks, at most ``workers`` at a time, each with one CPU (or a GPU share)."""

    name = "ray"

    def __init__(self, workers: int, address: str | None = None, gpus_per_task: float = 0.0):
        # Keep the embedded cluster on loopback (see DEVELOPERS.md); harmless with --address.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        import ray

        self.ray = ray
        self.workers = workers
        self.started_here = not ray.is_initialized()
        if self.started_here:
            if address:
                ray.init(address=address, include_dashboard=False, log_to_driver=False)
            else:
                ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        self.options = {"num_cpus": 1, "num_gpus": gpus_per_task, "max_retries": 2,
                        "runtime_env": {"env_vars": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}}}

    def share(self, value):
        """An object reference; Ray resolves it to the value when it is a job's keyword argument."""
        return self.ray.put(value)

    def map_unordered(self, fn: Callable, jobs: Iterable[dict]) -> Iterator:
        remote = self.ray.remote(fn).options(**self.options)
        pending, jobs = [], iter(jobs)
        try:
            while True:
                while len(pending) < self.workers:
                    job = next(jobs, None)
                    if job is None:
                        break
                    pending.append(remote.remote(**job))
                if not pending:
                    return
                done, pending = self.ray.wait(pending, num_returns=1)
                yield self.ray.get(done[0])
        finally:
            for ref in pending:
                self.ray.cancel(ref, force=True)

    def shutdown(self) -> None:
        if self.started_here:
            self.ray.shutdown()


def uses_ray(workers: int, address: str | None, use_ray: bool | None) -> bool:
    """``use_ray=None`` picks Ray when more than one worker or an address is asked for."""
    return (workers > 1 or address is not None) if use_ray is None else use_ray


def make_executor(workers: int, address: str | None, use_ray: bool | None, gpus_per_task: float = 0.0):
    """Ray tasks where :func:`uses_ray` says so, else this process."""
    if not uses_ray(workers, address, use_ray):
        return LocalExecutor()
    try:
        return RayExecutor(workers, address, gpus_per_task)
    except ImportError as exc:
        raise RuntimeError(
            "Ray is not installed: install it (`pip install ray`) or run with --workers 1 / --no-ray"
        ) from exc
