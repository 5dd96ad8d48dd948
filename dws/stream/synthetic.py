"""A complete store of random weights, written through the store's own writer (tests, benchmarks).

Real stores take minutes to fit; the loader's behaviour and speed depend only on shapes, chunking,
splits and rows, which this reproduces in a second (``zoo.store.derive.write_store`` writes it).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from zoo.fit.siren import SirenSpec
from zoo.store.derive import write_store
from zoo.store.format import parameter_shapes


def write_synthetic_store(
    root: str | Path,
    *,
    widths=(2, 32, 32, 1),
    num_networks: int = 1000,
    chunk_size: int = 100,
    split_fractions=(0.8, 0.1, 0.1),
    num_classes: int = 10,
    seed: int = 0,
    overwrite: bool = False,
) -> Path:
    """Random ``widths`` SIRENs (one random offset per network, so networks differ in mean too).

    Rows carry ``label`` (int), ``amplitude`` and ``frequency`` (float); splits are contiguous and
    generally not aligned with chunks, like real stores.
    """
    rng = np.random.default_rng(seed)
    counts = [int(f * num_networks) for f in split_fractions[:-1]]
    counts.append(num_networks - sum(counts))
    names = ("train", "val", "test")
    starts = np.cumsum([0] + counts[:-1])
    splits = {name: {"start": int(s), "count": c, "items": c} for name, s, c in zip(names, starts, counts)}
    spec = SirenSpec(tuple(widths))
    offset = rng.normal(size=num_networks).astype(np.float32)
    params = {name: rng.normal(size=(num_networks, *shape)).astype(np.float32)
              + offset.reshape(-1, *[1] * len(shape))
              for name, shape in parameter_shapes(spec.widths).items()}
    rows = pa.table({
        "index": pa.array(np.arange(num_networks), pa.int64()),
        "split": pa.array(np.repeat(np.array(names), counts).tolist(), pa.string()),
        "label": pa.array(rng.integers(0, num_classes, num_networks), pa.int64()),
        "amplitude": pa.array(rng.uniform(0, 10, num_networks).astype(np.float32)),
        "frequency": pa.array(rng.uniform(0, 10, num_networks).astype(np.float32)),
    })
    metadata = {
        "kind": "synthetic", "description": "random weights (loader tests and benchmarks)",
        "architecture": spec.to_manifest(), "targets": ["label"],
        "generation": {"seed": seed}, "source": {"kind": "image", "image_shape": [28, 28, 1]},
    }
    return write_store(root, widths=spec.widths, params=params, rows=rows, splits=splits, metadata=metadata,
                       chunk_size=chunk_size, overwrite=overwrite)
