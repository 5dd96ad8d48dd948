"""``zoo generate``: plan the zoo, fit its missing chunks, then reduce statistics and finish.

Rerunning the same command on an interrupted store fits only the chunks its manifest does not
list as complete; since every network depends only on ``(seed, index)`` and the chunking, the
result equals an uninterrupted run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
from tqdm import tqdm

from ..devices import resolve_device
from ..fit.siren import Grid2D, SirenSpec
from ..options import require_at_least, require_positive
from ..sources import get_source
from ..sources.images import ImageSource
from ..store.format import MANIFEST, STATUS_COMPLETE, StoreError
from ..store.location import require_local
from ..store.manifest import read_manifest
from ..store.reader import WeightStore
from ..store.stats import Moments, write_stats
from ..store.writer import (
    chunk_bounds,
    consolidate_rows,
    create_store,
    finalize,
    mark_chunks_complete,
    missing_chunks,
    reopen_chunks,
)
from .chunk import chunk_moments, fit_chunk
from .executors import make_executor
from .kinds import get_kind
from .plan import LIMIT_RULE, Plan, build_plan


@dataclass
class GenerateOptions:
    kind: str
    out: str
    dataset: str | None = None  # overrides the kind's default data source
    data_root: str | None = None
    download: bool = False
    limit: int | dict[str, int] | None = None
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
    progress: bool = True


def check_options(opts: GenerateOptions) -> None:
    """Refuse values that cannot make a store before anything is created (ValueError)."""
    require_at_least({"--chunk-size": (opts.chunk_size, 1), "--workers": (opts.workers, 1),
                      "--views": (opts.views, 1), "--steps": (opts.steps, 1)})
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


def _fit_config(kind, opts: GenerateOptions):
    cfg = kind.fit
    if opts.steps is not None:
        cfg = replace(cfg, steps=opts.steps)
    if opts.lr is not None:
        cfg = replace(cfg, lr=opts.lr)
    if opts.psnr_stop is not None:
        cfg = replace(cfg, psnr_stop=opts.psnr_stop)
    if opts.no_early_stop:
        cfg = replace(cfg, psnr_stop=None)
    return cfg


def _coords(source):
    """A :class:`Grid2D` for image sources (faster fitting), the point list otherwise."""
    points = source.coords()
    if isinstance(source, ImageSource):
        h, w = source.shape[:2]
        grid = Grid2D(torch.linspace(-1, 1, h), torch.linspace(-1, 1, w))
        if not torch.equal(grid.points(), points):
            raise RuntimeError("image grid disagrees with the source's coordinates")
        return (grid.ys.numpy(), grid.xs.numpy())
    return points.numpy()


def generate(opts: GenerateOptions, log=print) -> dict:
    """Create or resume the store at ``opts.out``; returns its final manifest."""
    kind = get_kind(opts.kind)
    check_options(opts)
    dataset = opts.dataset or kind.source
    spec = SirenSpec(kind.widths, init=opts.init)
    fit = _fit_config(kind, opts)
    generation = {
        "kind": kind.name, "dataset": dataset, "limit": opts.limit, "views": opts.views,
        "seed": opts.seed, "chunk_size": opts.chunk_size, "fit": fit.to_manifest(),
        "init": opts.init,
        **({"compiled": True} if opts.compile else {}),  # absent = eager (stores made before the flag)
    }
    out = require_local(opts.out, "generate into")
    resuming = (out / MANIFEST).exists()
    if resuming:
        manifest = read_manifest(out)
        # the architecture holds every convention, the init ranges too (stores made before
        # 2026-11-23 lack them: their "reference" started the first layer wide)
        asked = {"generation": generation, "architecture": spec.to_manifest()}
        stored = {key: manifest.get(key) for key in asked}
        if stored["architecture"] and "init_ranges" not in stored["architecture"] and opts.init == "siren":
            # older stores lack the ranges; only siren's have not changed since, so those still resume
            stored["architecture"] = {**stored["architecture"], "init_ranges": asked["architecture"]["init_ranges"]}
        if stored != asked:
            differences = "\n  ".join(settings_diff(stored, asked))
            raise StoreError(
                f"{out} was generated with different settings:\n  {differences}\n"
                f"use another --out, or rerun with the store's settings to resume it"
            )
        if manifest["status"] == STATUS_COMPLETE:
            damaged = WeightStore(out, check_chunks=False).damaged_chunks()
            if not damaged:
                log(f"{out} is already complete ({manifest['num_networks']} networks)")
                return manifest
            log(f"{out} is complete but {len(damaged)} chunk(s) have missing or truncated files "
                f"({'; '.join(f'chunk {c}: {why}' for c, why in list(damaged.items())[:3])}); refitting them")
            manifest = reopen_chunks(out, manifest, damaged)

    source = get_source(dataset, root=opts.data_root, download=opts.download)
    plan = build_plan(source, limit=opts.limit, views=opts.views)
    if not resuming:
        manifest = create_store(
            out, widths=kind.widths, num_networks=plan.num_networks, chunk_size=opts.chunk_size,
            splits=plan.splits,
            metadata={
                "kind": kind.name,
                "description": kind.description,
                "architecture": spec.to_manifest(),
                "targets": list(kind.targets),
                "generation": generation,
                "source": {**source.provenance(), "limit_rule": LIMIT_RULE},
            },
        )
    elif manifest["num_networks"] != plan.num_networks:
        raise StoreError(f"{out}: the data now yields {plan.num_networks} networks, the store has "
                         f"{manifest['num_networks']}; did the data files change?")

    device = resolve_device(opts.device)
    todo = missing_chunks(manifest)
    if resuming:
        log(f"resuming {out}: {len(todo)} of {manifest['num_chunks']} chunks left")
    executor = make_executor(opts.workers, opts.address, opts.use_ray,
                             gpus_per_task=1.0 / opts.workers if device.startswith("cuda") else 0.0)
    try:
        _fit_chunks(executor, out, manifest, plan, spec, fit, opts.seed, _coords(source), device, todo, opts)
        consolidate_rows(out, manifest)
        train_stop = plan.splits["train"]["count"]
        moments = Moments.of({n: np.zeros((0, *s)) for n, s in manifest["parameters"].items()})
        jobs = [{"root": str(out), "chunk": c, "train_stop": train_stop}
                for c in range(manifest["num_chunks"]) if chunk_bounds(manifest, c)[0] < train_stop]
        for part in executor.map_unordered(chunk_moments, jobs):
            moments = moments.combine(part)
        manifest = finalize(out, manifest, {"normalization": write_stats(out, moments)})
    finally:
        executor.shutdown()
    return manifest


def _fit_chunks(executor, out, manifest, plan: Plan, spec, fit, seed, coords, device, todo, opts):
    def job(chunk):
        start, stop = chunk_bounds(manifest, chunk)
        rows = plan.item_row[start:stop]
        return {
            "root": str(out), "chunk": chunk, "start": start, "spec": spec, "config": fit,
            "seed": seed, "coords": coords, "targets": plan.targets[rows].numpy(),
            "peak": plan.peak[start:stop], "device": device,
            "columns": {k: v[start:stop] for k, v in plan.columns.items()},
            "threads": None if device.startswith("cuda") else 1, "compile": opts.compile,
        }

    done = manifest["num_networks"] - sum(np.diff(chunk_bounds(manifest, c))[0] for c in todo)
    bar = tqdm(total=manifest["num_networks"], initial=done, unit="net", desc=f"fitting {manifest['kind']}",
               disable=not opts.progress, dynamic_ncols=True)
    try:
        for result in executor.map_unordered(fit_chunk, (job(c) for c in todo)):
            mark_chunks_complete(out, manifest, [result["chunk"]])
            bar.update(result["networks"])
            bar.set_postfix(psnr=f"{result['psnr_mean']:.1f}dB", steps=f"{result['steps_mean']:.0f}")
    finally:
        bar.close()
