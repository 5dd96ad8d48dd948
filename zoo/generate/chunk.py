"""The unit of work: fit one chunk of networks and write it into the store.

Plain functions with plain arguments, so they run the same in-process, in a Ray task, or on a
machine where Ray is not installed.
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import torch

from ..devices import resolve_device
from ..fit.fitter import FitConfig, fit_batch
from ..fit.siren import Grid2D, SirenSpec, network_seed
from ..store.format import bias_name, weight_name
from ..store.reader import WeightStore
from ..store.stats import Moments
from ..store.writer import write_chunk


def fit_chunk(
    root: str,
    chunk: int,
    start: int,
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
) -> dict:
    """Fit networks ``start .. start+len(targets)-1`` and write them as chunk ``chunk``."""
    if threads is not None:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    device = resolve_device(device)
    indices = list(range(start, start + len(targets)))
    if isinstance(coords, tuple):  # a Grid2D travels as its two axes
        coords = Grid2D(torch.as_tensor(coords[0]), torch.as_tensor(coords[1]))
    else:
        coords = torch.as_tensor(coords)
    result = fit_batch(
        spec, coords.to(device), torch.as_tensor(targets), indices, seed, config,
        peak=torch.as_tensor(peak), device=device, compile=compile,
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
        # Room for classifier zoos; INR zoos leave these empty.
        "trajectory_id": pa.nulls(len(indices), pa.int64()),
        "step": pa.nulls(len(indices), pa.int64()),
        "test_accuracy": pa.nulls(len(indices), pa.float32()),
    })
    write_chunk(root, chunk, params, rows)
    return {
        "chunk": chunk,
        "networks": len(indices),
        "seconds": time.perf_counter() - t0,
        "psnr_mean": float(result.psnr.mean()),
        "steps_mean": float(result.steps.mean()),
    }


def chunk_moments(root: str, chunk: int, train_stop: int) -> Moments:
    """Moments of this chunk's train rows (train networks are indices ``0 .. train_stop-1``)."""
    store = WeightStore(root, require_complete=False)
    start, stop = store.chunk_bounds(chunk)
    stop = min(stop, train_stop)
    if stop <= start:
        return Moments.of({n: np.zeros((0, *s)) for n, s in store.manifest["parameters"].items()})
    return Moments.of(store.read(start, stop))
