"""``zoo generate``: plan the zoo, make its missing chunks, then reduce statistics and finish.

What is shared by every kind lives here: creating or resuming the store, refusing a resume with
other settings, repairing lost chunks, the fan-out over workers, the progress bar, merging the
rows, the statistics and the final manifest. How a kind makes its networks (fitting SIRENs,
training classifiers) is its recipe's business (:mod:`zoo.generate.recipe`).

Rerunning the same command on an interrupted store makes only the chunks its manifest does not
list as complete; since every network depends only on ``(seed, index)`` and the chunking, the
result equals an uninterrupted run. Rerun on a store that exists, it first verifies what is
stored (:func:`zoo.store.verify.verify_store`) and remakes whatever is damaged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from ..devices import resolve_device
from ..options import require_at_least, require_positive
from ..sources import get_source
from ..store.format import MANIFEST, STATUS_COMPLETE, DamagedStoreError, StoreError
from ..store.location import UrlRoot, store_root
from ..store.manifest import read_manifest
from ..store.stats import Moments, TrainMoments, reduce_moments, write_stats
from ..store.verify import verify_store
from ..store.writer import (
    chunk_bounds,
    chunk_layout,
    consolidate_rows,
    create_store,
    finalize,
    mark_chunks_complete,
    missing_chunks,
    reopen_chunks,
    train_chunks,
    train_stop,
    write_chunk,
)
from .chunk import ChunkTarget
from .command import command_line
from .executors import make_executor, uses_ray
from .kinds import get_kind


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
    elif opts.limit is not None and opts.limit < 1:
        raise ValueError(f"--limit must be at least 1, got {opts.limit}")
    resolve_device(opts.device)


def settings_diff(stored, asked, prefix: str = "") -> list[str]:
    """``key: stored != asked`` for every leaf where two nested settings dicts differ."""
    if isinstance(stored, dict) and isinstance(asked, dict):
        lines = []
        for key in list(stored) + [k for k in asked if k not in stored]:
            lines += settings_diff(stored.get(key), asked.get(key), f"{prefix}{key}.")
        return lines
    return [] if stored == asked else [f"{prefix.rstrip('.')}: store {stored!r}, asked {asked!r}"]


def generate(opts: GenerateOptions, log=print) -> dict:
    """Create, resume or repair the store at ``opts.out`` (a folder or a URL); returns its final manifest."""
    kind = get_kind(opts.kind)
    check_options(opts)
    recipe = kind.recipe(opts)
    out = store_root(opts.out)
    if isinstance(out, UrlRoot) and out.protocol == "memory" and uses_ray(opts.workers, opts.address, opts.use_ray):
        raise StoreError(f"{out}: a memory:// store lives in this process, where Ray's workers cannot write; "
                         f"use --no-ray, or a URL every worker reaches")
    resuming = (out / MANIFEST).exists()
    known: dict[int, TrainMoments] = {}  # the train moments of chunks already stored
    if resuming:
        manifest = read_manifest(out)
        asked = recipe.settings()
        stored = recipe.stored_settings({key: manifest.get(key) for key in asked})
        if stored != asked:
            differences = "\n  ".join(settings_diff(stored, asked))
            raise StoreError(
                f"{out} was generated with different settings:\n  {differences}\n"
                f"use another --out, or rerun with the store's settings to resume it"
            )
        manifest, known, finished = _check_stored(out, manifest, recipe.verb, opts.progress, log)
        if finished:
            return manifest

    dataset = opts.dataset or kind.source
    source = get_source(dataset, root=opts.data_root, download=opts.download, **(opts.source_options or {}))
    layout = recipe.plan(source)
    if not resuming:
        manifest = create_store(out, widths=kind.widths, num_networks=layout.num_networks,
                                chunk_size=layout.chunk_size, splits=layout.splits,
                                metadata={**layout.metadata, "command": command_line(opts)})
    elif manifest["num_networks"] != layout.num_networks:
        raise StoreError(f"{out}: the data now yields {layout.num_networks} networks, the store has "
                         f"{manifest['num_networks']}; did the data files change?")

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
        manifest = finalize(out, manifest, {"normalization": write_stats(out, moments, manifest), **extra})
    finally:
        executor.shutdown()
    return manifest


def _check_stored(out, manifest: dict, verb: str, progress: bool, log) -> tuple[dict, dict, bool]:
    """Verify what earlier runs stored and reopen what this run must remake (damaged chunks; a
    damaged table or statistics are rewritten at the end anyway). Returns the manifest, the
    intact chunks' train moments and whether the store is complete and intact (nothing to do)."""
    complete = manifest["status"] == STATUS_COMPLETE
    found = verify_store(out, moments=True, progress=progress)
    if not found.repairable:
        raise DamagedStoreError(f"{out} is damaged:\n  " + "\n  ".join(map(str, found.damaged[:10]))
                                + "\n" + found.repair())
    damage = found.damaged
    if complete and not damage:
        log(f"{out} is already complete ({manifest['num_networks']} networks)")
        return manifest, {}, True
    if damage:
        remake = found.chunks_to_remake()
        log(f"{out} is damaged ({'; '.join(map(str, damage[:3]))}{' ...' if len(damage) > 3 else ''}): "
            f"re{verb} {len(remake)} chunk(s), then rewriting the table and the statistics")
        manifest = reopen_chunks(out, manifest, remake)
    return manifest, {c: m for c, m in found.moments.items() if c in manifest["complete_chunks"]}, False


def _statistics(manifest: dict, moments: dict[int, TrainMoments], log) -> Moments:
    """The train split's moments, reduced in chunk order from each chunk's (from the task that made
    it, or from the verification of what an earlier run stored)."""
    reduced, fallback = reduce_moments([moments[c] for c in train_chunks(manifest)])
    if fallback:  # every train network diverged: normalize with them rather than not at all
        log("warning: no train network trained normally; the statistics include the diverged ones")
    return reduced


def _make_chunks(executor, recipe, out, manifest, device, todo, progress: bool) -> dict[int, TrainMoments]:
    """Make the chunks ``todo``; a chunk is listed complete once its data and fragment are stored
    (by its task where the store is a URL, else here). Returns their train moments."""
    layout, url = chunk_layout(manifest), (str(out) if isinstance(out, UrlRoot) else None)
    done = manifest["num_networks"] - sum(np.diff(chunk_bounds(manifest, c))[0] for c in todo)
    bar = tqdm(total=manifest["num_networks"], initial=done, unit="net", desc=f"{recipe.verb} {manifest['kind']}",
               disable=not progress, dynamic_ncols=True)
    moments = {}
    try:
        jobs = (recipe.job(ChunkTarget(c, *chunk_bounds(manifest, c), train_stop(manifest), layout, url), device) for c in todo)
        for result in executor.map_unordered(recipe.work, jobs):
            chunk = result["chunk"]
            if "fragment" in result:
                fragment = result["fragment"]
            else:
                fragment = write_chunk(out, chunk, result.pop("params"), result.pop("rows"), layout)
            mark_chunks_complete(out, manifest, {chunk: fragment})
            if result["moments"] is not None:
                moments[chunk] = result["moments"]
            bar.update(result["networks"])
            bar.set_postfix(recipe.postfix(result))
    finally:
        bar.close()
    return moments
