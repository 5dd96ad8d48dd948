"""Where chunks run: in this process, or as Ray tasks (an embedded local cluster or ``--address``),
and how many chunks one job makes.

Both run ``fn(**kwargs)`` for each job and yield results as they finish (a job's result is one
chunk's, or for a job of several chunks the list of theirs). ``share(value)`` returns what a job
passes to hand every task the same large read-only value (the value itself here, one copy in Ray's
object store there, which each task reads without copying). Ray is imported only by the Ray
executor, so the fitting core works where Ray is not installed.

**Jobs and chunks.** A chunk is the store's unit of storage, resume and verification; a job is the
unit of work (an in-process call, a Ray task). A job makes one chunk, or several consecutive missing
chunks together where the recipe asks for it (:meth:`zoo.generate.recipe.Recipe.chunks_per_job`:
classifier zoos on a GPU, whose trainer keeps the GPU busy only with large groups), and returns one
result per chunk, each written, checksummed and listed complete on its own. :func:`job_size` caps
the recipe's wish so that no worker starves and the chunks held at once fit the host's memory;
:func:`split_jobs` cuts the missing chunks into jobs of that size.
"""

from __future__ import annotations

import math
import os
from typing import Callable, Iterable, Iterator

#: the most chunks one job makes, whatever the device could hold (a paper-sized Fashion-MNIST chunk is 482 MB)
MAX_CHUNKS_PER_JOB = 32
#: of the host memory available when the run starts, what the chunks held at once may take
HOST_MEMORY_SHARE = 0.5


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
            else:  # "local": a cluster of its own, even where RAY_ADDRESS or a `ray start` names another
                ray.init(address="local", num_cpus=workers, include_dashboard=False, log_to_driver=False)
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


def host_memory_available() -> int | None:
    """Bytes of memory this machine can give without swapping (``MemAvailable``), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def job_size(wish: int, missing: int, workers: int, chunk_bytes: int, available: int | None) -> int:
    """Chunks per job: the recipe's ``wish``, at most :data:`MAX_CHUNKS_PER_JOB`, at most
    ``ceil(missing / workers)`` (every worker gets a job), and small enough that the chunks held at
    once fit :data:`HOST_MEMORY_SHARE` of ``available`` host bytes (None: unknown, no bound): each
    of the ``workers`` jobs being made holds its chunks (one host buffer per job), and the writer up
    to one more job's (:func:`zoo.generate.writeback.write_depth`), so ``(workers + 1) * size``
    chunks of ``chunk_bytes``. Never below 1 (a single chunk per job is today's behaviour)."""
    size = min(wish, MAX_CHUNKS_PER_JOB, math.ceil(max(1, missing) / max(1, workers)))
    if available is not None and chunk_bytes > 0:
        size = min(size, int(HOST_MEMORY_SHARE * available) // chunk_bytes // (workers + 1))
    return max(1, size)


def split_jobs(chunks: list[int], size: int) -> list[list[int]]:
    """``chunks`` (the missing ones, in order) cut into consecutive jobs of at most ``size`` chunks,
    as even as possible (34 chunks at most 32 a job: 17 + 17, not 32 + 2)."""
    if not chunks:
        return []
    count = math.ceil(len(chunks) / max(1, size))
    base, extra = divmod(len(chunks), count)
    jobs, first = [], 0
    for j in range(count):
        stop = first + base + (j < extra)
        jobs.append(list(chunks[first:stop]))
        first = stop
    return jobs
