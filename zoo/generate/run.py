"""``zoo generate``: plan the zoo, make its missing chunks, then reduce statistics and finish.

What is shared by every kind lives here: creating or resuming the store, refusing a resume with
other settings, repairing lost chunks, the fan-out over workers, the progress bar, merging the
rows, the statistics and the final manifest. How a kind makes its networks (fitting SIRENs,
training classifiers) is its recipe's business (:mod:`zoo.generate.recipe`).

Rerunning the same command on an interrupted store makes only the chunks its manifest does not
list as complete; since every network depends only on ``(seed, index)`` and the chunking, the
result equals an uninterrupted run.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import numpy as np

from ..devices import resolve_device
from ..options import (MIN_SELECTION_NETWORKS, MIN_SELECTION_RUNS, plural, require_at_least, require_positive,
                       require_writable_folder, settings_diff)
from ..sources import get_source
from ..store.format import MANIFEST, SPLITS, STATUS_COMPLETE, DamagedStoreError, StoreError
from ..store.location import UrlRoot, is_empty, store_root
from ..store.manifest import machine_description, read_manifest, software_versions
from ..store.stats import Moments, TrainMoments, reduce_moments, write_stats
from ..store.verify import verify_store
from ..store.writer import (
    chunk_bounds,
    chunk_layout,
    consolidate_rows,
    create_store,
    mark_chunks_complete,
    missing_chunks,
    reopen_chunks,
    train_chunks,
    train_stop,
    write_chunk,
)
from ..store.card import CARD, write_card
from ..store.finish import finish
from .chunk import ChunkTarget, train_moments
from .command import command_line
from .executors import host_memory_available, job_size, make_executor, split_jobs, uses_ray
from .kinds import KINDS, get_kind
from .progress import GenerateProgress
from .writeback import ChunkWriter, write_depth

#: the most threads a chunk's moments take (beyond a few, memory bandwidth bounds them)
MAX_MOMENT_THREADS = 8


@dataclass
class GenerateOptions:
    kind: str
    out: str
    dataset: str | None = None  # overrides the kind's default data source
    data_root: str | None = None
    download: bool = False
    source_options: dict | None = None  # keyword options of the data source (e.g. {"verify": False})
    limit: int | dict[str, int] | None = None  # items (INR kinds) or runs (classifier kinds)
    views: int = 1
    seed: int = 0
    chunk_size: int = 1024
    workers: int = 1
    address: str | None = None
    use_ray: bool | None = None
    device: str = "auto"
    init: str = "siren"  # standard SIREN init; "reference" = the published DWSNets INR, small output layer
    steps: int | None = None  # override the kind's schedule (tests, quick looks)
    lr: float | None = None
    psnr_stop: float | None = None
    no_early_stop: bool = False
    compile: bool = False  # torch.compile the fitting step (faster; float rounding differs from eager)
    fit_backend: str = "auto"  # INR kinds: the fitting step (zoo.fit.fitter.FIT_BACKENDS), speed only
    epochs: int | None = None  # classifier kinds: override the schedule
    batch_size: int | None = None
    checkpoint_every: int | None = None
    diversity: bool = False  # classifier kinds: sample hyperparameters per run
    group: int | None = None  # classifier kinds: networks trained together (speed only)
    progress: bool = True


def check_options(opts: GenerateOptions) -> None:
    """Refuse values that cannot make a store before anything is created (ValueError)."""
    require_at_least({"--chunk-size": (opts.chunk_size, 1), "--workers": (opts.workers, 1),
                      "--views": (opts.views, 1), "--steps": (opts.steps, 1), "--epochs": (opts.epochs, 1),
                      "--batch-size": (opts.batch_size, 1), "--checkpoint-every": (opts.checkpoint_every, 1),
                      "group": (opts.group, 1)})
    require_positive("--lr", opts.lr)
    if isinstance(opts.limit, dict):
        negative = {split: n for split, n in opts.limit.items() if n < 0}
        if negative:
            raise ValueError(f"--limit: a split's count cannot be negative ({negative})")
        if not any(opts.limit.values()):
            raise ValueError("--limit keeps no networks at all")
        if not opts.limit.get("train"):
            raise ValueError("--limit keeps no train networks (a split it does not name keeps none), and a store "
                             "normalizes with its train networks' statistics: name train=N")
    elif opts.limit is not None and opts.limit < 1:
        raise ValueError(f"--limit must be at least 1, got {opts.limit}")
    if opts.use_ray is False and (opts.workers > 1 or opts.address is not None):
        given = f"--workers {opts.workers}" if opts.workers > 1 else f"--address {opts.address}"
        raise ValueError(f"{given} asks for Ray, --no-ray for this process alone: drop one of them")
    resolve_device(opts.device)


def refuse_unmakeable(out, manifest: dict) -> None:
    """StoreError for an unfinished store whose kind cannot be made from its data set: older versions
    created one before the fit crashed on the mismatch, and no rerun can finish it."""
    generation = manifest.get("generation") or {}
    kind, dataset = KINDS.get(generation.get("kind")), generation.get("dataset")
    if manifest.get("status") == STATUS_COMPLETE or kind is None or dataset is None or dataset in kind.datasets:
        return
    raise StoreError(f"{out} is an unfinished {kind.name} store of --dataset {dataset}, which {kind.name} cannot be "
                     f"made from (an older version started it, then the fit failed); nothing in it can be kept: "
                     f"delete the folder ({out}) and start over; {kind.name} takes --dataset "
                     f"{', '.join(kind.datasets)}")


def generate(opts: GenerateOptions, log=print) -> dict:
    """Create, resume or repair the store at ``opts.out`` (a folder or a URL); returns its final manifest."""
    kind = get_kind(opts.kind)
    out = store_root(opts.out)
    resuming = (out / MANIFEST).exists()
    if resuming:
        manifest = read_manifest(out)
        refuse_unmakeable(out, manifest)
    check_options(opts)
    check_out(out, manifest if resuming else None)
    recipe = kind.recipe(opts)
    if isinstance(out, UrlRoot) and out.protocol == "memory" and uses_ray(opts.workers, opts.address, opts.use_ray):
        raise StoreError(f"{out}: a memory:// store lives in this process, where Ray's workers cannot write; "
                         f"use --no-ray, or a URL every worker reaches")
    known: dict[int, TrainMoments] = {}  # the train moments of chunks already stored
    if resuming:
        asked = recipe.settings()
        stored = recipe.stored_settings({key: manifest.get(key) for key in asked})
        if stored != asked:
            differences = "\n  ".join(settings_diff(stored, asked))
            raise StoreError(
                f"{out} was generated with different settings:\n  {differences}\n"
                f"use another --out, or rerun with the store's settings to resume it"
            )
        found = _verify_stored(out, manifest, opts.progress)
        if manifest["status"] == STATUS_COMPLETE and not found.damaged:
            if not (out / CARD).exists():  # interrupted between the manifest and the card
                try:
                    write_card(out)
                except (OSError, StoreError):  # a read-only copy: `zoo card` makes it on the fly
                    pass
            log(f"{out} is already complete ({manifest['num_networks']} networks)")
            return manifest
        require_writable_folder("--out", out)  # a damaged complete store is repaired in place

    source = get_source(recipe.dataset, root=opts.data_root, download=opts.download, **(opts.source_options or {}))
    layout = recipe.plan(source)
    if not resuming:
        warn_small_splits(layout.splits, log)
        manifest = create_store(out, widths=kind.widths, num_networks=layout.num_networks,
                                chunk_size=layout.chunk_size, splits=layout.splits,
                                metadata={**layout.metadata, "command": command_line(opts),
                                          "software": software_versions(), "machine": machine_description()})
    else:
        check_same_splits(out, manifest, layout)  # before anything of the store is reopened
        manifest, known = _reopen_damaged(out, manifest, found, recipe.verb, log)

    device = resolve_device(opts.device)
    todo = missing_chunks(manifest)
    if resuming:
        log(f"resuming {out}: {len(todo)} of {manifest['num_chunks']} chunks left")
    executor = make_executor(opts.workers, opts.address, opts.use_ray,
                             gpus_per_task=1.0 / opts.workers if device.startswith("cuda") else 0.0)
    try:
        recipe.share(executor)
        known.update(_make_chunks(executor, recipe, out, manifest, device, todo, opts.progress))
        table = consolidate_rows(out, manifest)
        moments = _statistics(manifest, known, log)
        extra = recipe.report(table, log)
        manifest = finish(out, manifest, {"normalization": write_stats(out, moments, manifest), **extra})
    finally:
        executor.shutdown()
    return manifest


def _split_counts(splits: dict) -> str:
    return " / ".join(f"{s} {splits[s]['count']}" for s in SPLITS)


def check_same_splits(out, manifest: dict, layout) -> None:
    """StoreError unless a resumed store's splits are those the data and options give now."""
    if manifest["num_networks"] == layout.num_networks and all(
            manifest["splits"][s]["count"] == layout.splits[s]["count"] for s in SPLITS):
        return
    raise StoreError(f"{out} has {_split_counts(manifest['splits'])} networks, the same command now plans "
                     f"{_split_counts(layout.splits)}: the data files changed, or an older version made the store "
                     f"with its --limit rules (docs: a --limit split=N list keeps none of the splits it omits; "
                     f"--limit N follows the kind's paper splits); use another --out")


def check_out(out, manifest: dict | None) -> None:
    """Before any work: refuse an ``--out`` that cannot hold the store (a file, a read-only folder, a
    folder of other files). A complete store is left to its verification (a rerun only reads it)."""
    if manifest is not None and manifest.get("status") == STATUS_COMPLETE:
        return
    require_writable_folder("--out", out)
    if manifest is None and not is_empty(out):
        raise StoreError(f"{out} exists and is not empty (and is not a weight store); choose a new --out folder")


def warn_small_splits(splits: dict, log) -> None:
    """A line for a val split too small to select on, or a split left empty (the store is still made).
    Classifier zoos count their val split by runs (a run's checkpoints are alike), INR zoos by networks."""
    empty = [s for s in SPLITS if splits[s]["count"] == 0]
    val = splits["val"]
    if empty:
        log(f"warning: no {' or '.join(empty)} networks ({_split_counts(splits)}): zoo train needs networks in "
            f"every split")
    elif val.get("runs") is not None and val["runs"] < MIN_SELECTION_RUNS:
        log(f"warning: the val split has only {plural(val['runs'], 'run')} ({_split_runs(splits)}): zoo train "
            f"chooses its learning rate and best epoch on its checkpoints, which are alike within a run; "
            f"{MIN_SELECTION_RUNS} or more runs are better (a larger --limit, or --limit train=N,val=N,test=N)")
    elif val["count"] < MIN_SELECTION_NETWORKS:
        log(f"warning: the val split has only {plural(val['count'], 'network')} ({_split_counts(splits)}): zoo "
            f"train chooses its learning rate and best epoch on them; {MIN_SELECTION_NETWORKS} or more are better "
            f"(a larger --limit, or --limit train=N,val=N,test=N)")


def _split_runs(splits: dict) -> str:
    return " / ".join(f"{s} {splits[s]['runs']}" for s in SPLITS) + " runs"


def _verify_stored(out, manifest: dict, progress: bool):
    """What earlier runs stored, verified (read only); refuses damage a rerun cannot repair."""
    found = verify_store(out, moments=True, progress=progress)
    if not found.repairable:
        raise DamagedStoreError(f"{out} is damaged:\n  " + "\n  ".join(map(str, found.damaged[:10]))
                                + "\n" + found.repair())
    return found


def _reopen_damaged(out, manifest: dict, found, verb: str, log) -> tuple[dict, dict[int, TrainMoments]]:
    """Reopen the chunks this run must remake (a damaged table or statistics are rewritten at the end
    anyway). Returns the manifest and the intact chunks' train moments."""
    damage = found.damaged
    if damage:
        remake = found.chunks_to_remake()
        log(f"{out} is damaged ({'; '.join(map(str, damage[:3]))}{' ...' if len(damage) > 3 else ''}): "
            f"re{verb} {len(remake)} chunk(s), then rewriting the table and the statistics")
        manifest = reopen_chunks(out, manifest, remake)
    return manifest, {c: m for c, m in found.moments.items() if c in manifest["complete_chunks"]}


def _statistics(manifest: dict, moments: dict[int, TrainMoments], log) -> Moments:
    """The train split's moments, reduced in chunk order from each chunk's (from the task that made
    it, or from the verification of what an earlier run stored)."""
    reduced, fallback = reduce_moments([moments[c] for c in train_chunks(manifest)])
    if fallback:  # every train network diverged: normalize with them rather than not at all
        log("warning: no train network trained normally; the statistics include the diverged ones")
    return reduced


def moment_threads() -> int:
    """Threads the driver takes a chunk's moments with: the cores beside the one making chunks, at
    most :data:`MAX_MOMENT_THREADS`."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(MAX_MOMENT_THREADS, cores - 1))


def _make_chunks(executor, recipe, out, manifest, device, todo, progress: bool) -> dict[int, TrainMoments]:
    """Make the chunks ``todo``; a chunk is listed complete once its data and fragment are stored
    and its train moments taken (by its task where the store is a URL, else by the background
    writer while the next job runs: :mod:`zoo.generate.writeback`). A job makes one chunk or several
    consecutive ones (:mod:`zoo.generate.executors`: the recipe's wish, capped) and returns one
    result per chunk, each written and listed on its own, so an interrupted job leaves whole chunks
    listed and the rest to remake. Returns the chunks' train moments."""
    layout, url = chunk_layout(manifest), (str(out) if isinstance(out, UrlRoot) else None)
    done = manifest["num_networks"] - sum(np.diff(chunk_bounds(manifest, c))[0] for c in todo)
    in_process = executor.name == "local"
    workers = 1 if in_process else getattr(executor, "workers", 1)
    chunk_bytes = 4 * manifest["chunk_size"] * sum(int(np.prod(s)) for s in manifest["parameters"].values())
    per_job = job_size(recipe.chunks_per_job(device, workers), len(todo), workers, chunk_bytes,
                       host_memory_available())
    jobs = split_jobs(todo, per_job)
    depth = write_depth(chunk_bytes, in_process, per_job)
    bar = GenerateProgress(manifest["num_networks"], done, f"{recipe.verb} {manifest['kind']}", enabled=progress,
                           chunks_left=len(todo), workers=None if in_process else workers * per_job)
    bar_lock = threading.Lock()  # the bar moves from the chunk being made and from the writer
    moments, threads = {}, moment_threads()

    def store(result: dict) -> None:
        """Write a finished chunk and take its train moments (unless its task did), list it complete,
        move the bar: the writer's work, in the order the chunks finished; the one place that
        rewrites the manifest here."""
        chunk = result["chunk"]
        if "fragment" in result:
            fragment = result["fragment"]
        else:
            params, rows = result.pop("params"), result.pop("rows")
            fragment = write_chunk(out, chunk, params, rows, layout)
            result["moments"] = train_moments(*chunk_bounds(manifest, chunk), train_stop(manifest), params, rows,
                                              threads)
        mark_chunks_complete(out, manifest, {chunk: fragment})
        if result["moments"] is not None:
            moments[chunk] = result["moments"]
        with bar_lock:
            bar.chunk_written(chunk, result["networks"], recipe.postfix(result))

    writer = ChunkWriter(store, depth)

    def reporter(targets: list[ChunkTarget]):
        reports = [bar.reporter(t.chunk, t.stop - t.start) for t in targets]  # a job's chunks move together

        def progress(fraction: float) -> None:
            writer.check()  # a failed write stops the job being made, not only the next one
            with bar_lock:
                for report in reports:
                    report(fraction)
        return progress

    def target(chunk: int) -> ChunkTarget:
        start, stop = chunk_bounds(manifest, chunk)
        return ChunkTarget(chunk, start, stop, train_stop(manifest), layout, url)

    def job(chunks: list[int]) -> dict:
        targets = [target(c) for c in chunks]
        kwargs = recipe.job(targets[0] if len(targets) == 1 else targets, device)
        if in_process and progress:  # a callable cannot travel to a Ray task; there the bar ticks instead
            kwargs["progress"] = reporter(targets)
        return kwargs

    try:
        results = executor.map_unordered(recipe.work, (job(chunks) for chunks in jobs))
        try:
            for made in results:
                made = [made] if isinstance(made, dict) else list(made)  # one result per chunk
                made.reverse()
                while made:  # handed over one by one, each result released once written
                    writer.put(made.pop())  # blocks while the writer holds its limit; raises its error
            writer.close()  # every chunk written and listed, or the writer's error
        except BaseException:
            writer.stop()  # the chunks already made are still written (a second Ctrl-C abandons them)
            raise
        finally:
            getattr(results, "close", lambda: None)()  # Ray: cancels the tasks still running
    finally:
        bar.close()
    return moments
