"""`zoo generate` with a timeline of its phases: where the wall time goes outside the training itself.

    python benchmarks/generate_timeline.py generate fmnist-classifiers --data-root DATA --device cuda --out S

Runs the ``zoo`` command line given (the same arguments as ``zoo``) in this process, with the
functions of each phase wrapped to record when they start and end and on which thread: importing
torch, reading the source (the images: classifier_data), the plan, choosing the device, creating the
store, the per-job host buffers, normalizing the images (normalized: once per process and device),
the trainer's group size, training a group, test accuracy, the main thread waiting for room in the
writer's queue (ChunkWriter.put), fitting a chunk of INRs (its initial parameters, the final MSE), a
chunk's moments, writing and listing chunks, the statistics, the content ID, the card, the summary.
At exit it prints one line per call (phase, thread, start, end, seconds, all from the process
start) and the exit time, to stderr. Why: issue 33's GPU runs of the
classifier zoos took 3-14x their training time and their disk time, and the progress bar alone does
not say where (benchmarks/README.md). ``gpu_session.sh clfgen`` runs the generation through it.
A phase that no longer exists under its name is skipped and listed.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import runpy
import sys
import threading
import time
from pathlib import Path

START = time.perf_counter()
SPANS: list[tuple[str, str, float, float]] = []  # (phase, thread, start, end)
# module -> functions (or Class.method) whose calls are phases
PHASES = {
    "zoo.generate.run": ("get_source", "resolve_device", "make_executor", "create_store", "_make_chunks",
                         "write_chunk", "mark_chunks_complete", "consolidate_rows", "_statistics", "write_stats",
                         "finish"),
    "zoo.generate.writeback": ("ChunkWriter.put",),  # (the main thread waiting for room in the writer's queue)
    "zoo.generate.chunk": ("finish_chunk", "chunk_train_moments", "train_moments"),
    "zoo.generate.classifiers": ("classifier_data", "host_arrays", "train_runs", "_finish_chunk",
                                 "ClassifierRecipe.plan", "ClassifierRecipe.report"),
    "zoo.generate.inr": ("InrRecipe.plan", "InrRecipe.work", "fit_batch"),  # (work: the chunk's fit)
    "zoo.fit.fitter": ("InitAhead.take", "_result"),
    "zoo.train.trainer": ("normalized", "default_group", "_train_group", "TrainedGroup.test_accuracy"),
    "zoo.store.finish": ("content_id", "write_card"),
    "zoo.inspect": ("summary",),
}


def record(label: str, real):
    @functools.wraps(real)
    def timed(*args, **kwargs):
        began = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            SPANS.append((label, threading.current_thread().name[:14], began - START, time.perf_counter() - START))
    return timed


def instrument() -> list[str]:
    """Wrap every phase; returns those not found."""
    missing = []
    for module_name, names in PHASES.items():
        module = importlib.import_module(module_name)
        for name in names:
            owner_name, _, attribute = name.rpartition(".")
            owner = getattr(module, owner_name) if owner_name else module
            if not hasattr(owner, attribute):
                missing.append(f"{module_name}.{name}")
                continue
            timed = record(name, getattr(owner, attribute))
            if isinstance(vars(owner).get(attribute), staticmethod):  # (a class's static method stays one)
                timed = staticmethod(timed)
            setattr(owner, attribute, timed)
    return missing


def report(missing: list[str]) -> None:
    print(f"{'phase':30s} {'thread':14s} {'start':>8s} {'end':>8s} {'seconds':>8s}", file=sys.stderr)
    for label, thread, began, ended in sorted(SPANS, key=lambda span: span[2]):
        print(f"{label:30s} {thread:14s} {began:8.2f} {ended:8.2f} {ended - began:8.2f}", file=sys.stderr)
    if missing:
        print(f"not timed (renamed or gone): {', '.join(missing)}", file=sys.stderr)
    print(f"exit at {time.perf_counter() - START:.2f} s (the process ends after this: the interpreter's "
          f"teardown; the progress bar's clock starts with _make_chunks)", file=sys.stderr)


def main() -> None:
    began = time.perf_counter()
    import torch  # noqa: F401  (its import is a phase of its own)

    SPANS.append(("import torch", "MainThread", began - START, time.perf_counter() - START))
    missing = instrument()
    atexit.register(report, missing)
    sys.argv = ["zoo", *sys.argv[1:]]
    runpy.run_module("cli", run_name="__main__")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's cli and packages
    main()
