"""Write a whole store from arrays in memory: for stores derived from another (e.g. aligned weights).

The result is an ordinary complete store (same format, fresh normalization statistics reduced
exactly as ``zoo generate`` reduces them), so every reader, loader and ``zoo verify`` works on it
unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa

from .finish import finish
from .location import UrlRoot, store_root
from .manifest import machine_description, software_versions
from .stats import chunk_train_moments, reduce_moments, row_status, write_stats
from .writer import chunk_bounds, chunk_layout, consolidate_rows, create_store, mark_chunks_complete, write_chunk


def write_store(
    root: str | Path,
    *,
    widths,
    params: dict[str, np.ndarray],
    rows: pa.Table,
    splits: dict[str, dict],
    metadata: dict,
    chunk_size: int = 1024,
    overwrite: bool = False,
) -> Path | UrlRoot:
    """``params[name]`` is ``[N, ...]`` for every parameter of ``widths``; ``rows`` has N rows."""
    return write_store_by_chunk(
        root, widths=widths, num_networks=rows.num_rows,
        chunk=lambda lo, hi: ({k: v[lo:hi] for k, v in params.items()}, rows.slice(lo, hi - lo)),
        splits=splits, metadata=metadata, chunk_size=chunk_size, overwrite=overwrite)


def write_store_by_chunk(
    root: str | Path,
    *,
    widths,
    num_networks: int,
    chunk: Callable[[int, int], tuple[dict[str, np.ndarray], pa.Table]],
    splits: dict[str, dict],
    metadata: dict,
    chunk_size: int = 1024,
    overwrite: bool = False,
) -> Path | UrlRoot:
    """:func:`write_store` for stores too large for memory: ``chunk(lo, hi)`` returns the parameters
    ``[hi - lo, ...]`` and the rows of networks ``lo..hi-1``, one store chunk at a time."""
    manifest = create_store(root, widths=widths, num_networks=num_networks, chunk_size=chunk_size, splits=splits,
                            metadata={**metadata, "software": software_versions(), "machine": machine_description()},
                            overwrite=overwrite)
    train_stop = splits["train"]["start"] + splits["train"]["count"]
    parts, fragments = [], {}
    for index in range(manifest["num_chunks"]):
        lo, hi = chunk_bounds(manifest, index)
        part, chunk_rows = chunk(lo, hi)
        part = {k: np.asarray(v, dtype=np.float32) for k, v in part.items()}
        fragments[index] = write_chunk(root, index, part, chunk_rows, chunk_layout(manifest))
        if lo < train_stop:
            parts.append(chunk_train_moments(part, lo, train_stop, row_status(chunk_rows, lo, hi)))
    mark_chunks_complete(root, manifest, fragments)
    consolidate_rows(root, manifest)
    moments, _ = reduce_moments(parts)
    finish(root, manifest, {"normalization": write_stats(root, moments, manifest)})
    return store_root(root)
