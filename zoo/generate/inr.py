"""INR zoos: one SIREN fitted to each item (image or signal) of a data source.

The recipe turns the options into a SIREN spec and a fitting schedule, plans which item each
network fits (:mod:`zoo.generate.plan`), and :func:`fit_chunk` fits one chunk of networks and
writes it. Plain functions with plain arguments, so they run the same in-process, in a Ray task,
or on a machine where Ray is not installed.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pyarrow as pa
import torch

from ..devices import resolve_device
from ..fit.fitter import FitConfig, choose_step, fit_batch
from ..fit.siren import Grid2D, SirenSpec, network_seed
from ..sources.images import ImageSource
from ..store.format import bias_name, weight_name
from .chunk import ChunkTarget, finish_chunk
from .plan import LIMIT_RULE, build_plan
from .recipe import Layout, Recipe, refuse_options

CLASSIFIER_OPTIONS = {  # options of classifier kinds, at their defaults
    "epochs": None, "batch_size": None, "checkpoint_every": None, "diversity": False, "group": None}


class InrRecipe(Recipe):
    verb = "fitting"

    def __init__(self, kind, opts):
        refuse_options(opts, CLASSIFIER_OPTIONS, kind.name, "classifier zoos")
        self.kind, self.opts = kind, opts
        self.spec = SirenSpec(kind.widths, init=opts.init)
        self.fit = _fit_config(kind.fit, opts)
        self.dataset = kind.check_dataset(opts.dataset)
        self.generation = {
            "kind": kind.name, "dataset": self.dataset, "limit": opts.limit, "views": opts.views,
            "seed": opts.seed, "chunk_size": opts.chunk_size, "fit": self.fit.to_manifest(),
            "init": opts.init,
            **({"compiled": True} if opts.compile else {}),  # absent = eager (stores made before the flag)
            **({"source_options": opts.source_options} if opts.source_options else {}),
        }

    def settings(self) -> dict:
        # the architecture holds every convention, the init ranges too (stores made before
        # 2026-11-23 lack them: their "reference" started the first layer wide)
        return {"generation": self.generation, "architecture": self.spec.to_manifest()}

    def stored_settings(self, stored: dict) -> dict:
        arch = stored.get("architecture")
        if arch and "init_ranges" not in arch and self.opts.init == "siren":
            # older stores lack the ranges; only siren's have not changed since, so those still resume
            return {**stored, "architecture": {**arch, "init_ranges": self.spec.to_manifest()["init_ranges"]}}
        return stored

    def plan(self, source) -> Layout:
        self.layout = build_plan(source, limit=self.opts.limit, views=self.opts.views, proportions=self.kind.splits)
        self.coords = _coords(source)
        if self.opts.fit_backend != "auto":  # refused here, before the store is created, if it cannot run
            choose_step(self.spec, _coords_value(self.coords), resolve_device(self.opts.device), self.opts.fit_backend)
        return Layout(
            num_networks=self.layout.num_networks, splits=self.layout.splits, chunk_size=self.opts.chunk_size,
            metadata={
                "kind": self.kind.name,
                "description": self.kind.description,
                "architecture": self.spec.to_manifest(),
                "targets": list(self.kind.targets),
                "generation": self.generation,
                "source": {**source.provenance(), "limit_rule": LIMIT_RULE},
            },
        )

    def job(self, target: ChunkTarget, device: str) -> dict:
        start, stop = target.start, target.stop
        rows = self.layout.item_row[start:stop]
        return {
            "target": target, "spec": self.spec, "config": self.fit,
            "seed": self.opts.seed, "coords": self.coords, "targets": self.layout.targets[rows].numpy(),
            "peak": self.layout.peak[start:stop], "device": device,
            "columns": {k: v[start:stop] for k, v in self.layout.columns.items()},
            "threads": None if device.startswith("cuda") else 1, "compile": self.opts.compile,
            "backend": self.opts.fit_backend,
        }

    def postfix(self, result: dict) -> dict[str, str]:
        return {"psnr": f"{result['psnr_mean']:.1f}dB", "steps": f"{result['steps_mean']:.0f}"}


def _fit_config(cfg: FitConfig, opts) -> FitConfig:
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


def _coords_value(coords):
    """The coordinates as :func:`_coords` sends them (a grid travels as its two axes) -> a
    :class:`Grid2D` or a ``[P, d_0]`` tensor."""
    if isinstance(coords, tuple):
        return Grid2D(torch.as_tensor(coords[0]), torch.as_tensor(coords[1]))
    return torch.as_tensor(coords)


def fit_chunk(
    target: ChunkTarget,
    spec: SirenSpec,
    config: FitConfig,
    seed: int,
    coords,
    targets: np.ndarray,
    peak: np.ndarray,
    columns: dict[str, np.ndarray],
    device: str = "cpu",
    threads: int | None = 1,
    compile: bool = False,
    progress=None,
    backend: str = "auto",
) -> dict:
    """Fit the networks of chunk ``target`` (one per row of ``targets``) and store or return them
    (``progress(fraction)`` after every step, in-process only)."""
    if threads is not None:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    device = resolve_device(device)
    indices = list(range(target.start, target.stop))
    coords = _coords_value(coords)
    result = fit_batch(
        spec, coords.to(device), torch.as_tensor(targets), indices, seed, config,
        peak=torch.as_tensor(peak), device=device, compile=compile, progress=progress, backend=backend,
    )
    params = {}
    for m in range(spec.num_layers):
        params[weight_name(m + 1)] = result.weights[m]
        params[bias_name(m + 1)] = result.biases[m]
    rows = pa.table({
        **{k: pa.array(v) for k, v in columns.items()},
        "seed": pa.array([network_seed(seed, i) for i in indices], pa.int64()),
        "mse": pa.array(result.mse.astype(np.float32)),
        "psnr": pa.array(result.psnr.astype(np.float32)),
        "steps": pa.array(result.steps.astype(np.int32)),
        "fit_step": pa.array([result.implementation] * len(indices), pa.string()),
        # The columns classifier zoos fill; INR zoos leave them empty.
        "trajectory_id": pa.nulls(len(indices), pa.int64()),
        "step": pa.nulls(len(indices), pa.int64()),
        "test_accuracy": pa.nulls(len(indices), pa.float32()),
    })
    return finish_chunk(target, params, rows, seconds=time.perf_counter() - t0,
                        psnr_mean=float(result.psnr.mean()), steps_mean=float(result.steps.mean()))


InrRecipe.work = staticmethod(fit_chunk)
