"""Creating a store and filling it chunk by chunk.

Workers write whole chunks (array slices aligned to the Zarr chunking, plus a Parquet fragment of
their rows); only the coordinating process touches the manifest, so concurrent workers never race
on it. A chunk counts as written only once the manifest lists it, which makes an interrupted
generation safe to resume: unlisted chunks are simply written again.
"""

from __future__ import annotations

import os
import shutil
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import zarr

from .format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    FRAGMENTS_DIR,
    MANIFEST,
    NETWORKS_TABLE,
    REPAIR_HINT,
    STATUS_COMPLETE,
    STATUS_IN_PROGRESS,
    DamagedStoreError,
    StoreError,
    fragment_name,
    parameter_shapes,
)
from .location import require_local, store_root
from .manifest import read_manifest, write_manifest


def create_store(
    root: str | Path,
    *,
    widths,
    num_networks: int,
    chunk_size: int,
    splits: dict[str, dict],
    metadata: dict,
    overwrite: bool = False,
) -> dict:
    """Lay out an empty store (arrays filled with NaN) and its in-progress manifest.

    A chunk never exceeds the store: Zarr writes an edge chunk at full size, so 5 networks in
    chunks of 1,024 would take 4.7 MiB on disk instead of 24 KiB."""
    root = Path(root)
    chunk_size = max(1, min(chunk_size, num_networks))
    if (root / MANIFEST).exists() and not overwrite:
        raise StoreError(f"{root} already holds a store; resume it or pass overwrite")
    if root.exists() and overwrite:
        shutil.rmtree(root)
    if root.exists() and any(root.iterdir()):
        raise StoreError(f"{root} exists and is not empty; choose a new --out directory")
    root.mkdir(parents=True, exist_ok=True)
    group = zarr.open_group(str(root), mode="w", zarr_format=3)
    shapes = parameter_shapes(widths)
    for name, shape in shapes.items():
        group.create_array(
            name,
            shape=(num_networks, *shape),
            chunks=(chunk_size, *shape),
            dtype="float32",
            compressors=None,  # float32 weights barely compress (~7%) at 2-4x the cost
            fill_value=float("nan"),
            dimension_names=("network",) + tuple(f"dim{i}" for i in range(len(shape))),
        )
    (root / FRAGMENTS_DIR).mkdir()
    num_chunks = (num_networks + chunk_size - 1) // chunk_size
    manifest = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "status": STATUS_IN_PROGRESS,
        "num_networks": num_networks,
        "chunk_size": chunk_size,
        "num_chunks": num_chunks,
        "complete_chunks": [],
        "parameters": {name: list(shape) for name, shape in shapes.items()},
        "splits": splits,
        **metadata,
    }
    write_manifest(root, manifest)
    return manifest


def chunk_bounds(manifest: dict, chunk: int) -> tuple[int, int]:
    start = chunk * manifest["chunk_size"]
    return start, min(start + manifest["chunk_size"], manifest["num_networks"])


def write_chunk(root: str | Path, chunk: int, params: dict[str, np.ndarray], rows: pa.Table) -> None:
    """Write one chunk's parameters and rows. Safe to repeat: it overwrites the same cells."""
    root = Path(root)
    manifest = read_manifest(root)
    start, stop = chunk_bounds(manifest, chunk)
    if rows.num_rows != stop - start:
        raise StoreError(f"chunk {chunk} needs {stop - start} rows, got {rows.num_rows}")
    checked = {}
    for name, shape in manifest["parameters"].items():  # check everything before writing anything
        values = np.asarray(params[name], dtype=np.float32)
        if values.shape != (stop - start, *shape):
            raise StoreError(f"chunk {chunk}: {name} has shape {values.shape}, expected {(stop - start, *shape)}")
        if not np.isfinite(values).all():
            raise StoreError(f"chunk {chunk}: {name} contains NaN or inf; refusing to store it")
        checked[name] = values
    group = zarr.open_group(str(root), mode="r+")
    for name, values in checked.items():
        group[name][start:stop] = values
    _write_table_atomically(rows, root / fragment_name(chunk))


def mark_chunks_complete(root: str | Path, manifest: dict, chunks) -> dict:
    manifest["complete_chunks"] = sorted(set(manifest["complete_chunks"]) | set(int(c) for c in chunks))
    write_manifest(root, manifest)
    return manifest


def reopen_chunks(root: str | Path, manifest: dict, chunks) -> dict:
    """Take ``chunks`` off a store's completed list (the store is in progress again) so that
    rerunning its generation refits them; used for chunks whose files were lost or damaged."""
    root = Path(root)
    group = zarr.open_group(str(root), mode="r")
    for name in manifest["parameters"]:  # a damaged file must not be read back by a partial write
        for c in chunks:
            (root / name / chunk_key(group[name], int(c))).unlink(missing_ok=True)
    manifest["complete_chunks"] = sorted(set(manifest["complete_chunks"]) - set(int(c) for c in chunks))
    manifest["status"] = STATUS_IN_PROGRESS
    write_manifest(root, manifest)
    return manifest


def chunk_key(arr, chunk: int) -> str:
    """Key (relative to the array) of the stored object holding networks chunk ``chunk``."""
    return arr.metadata.encode_chunk_key((chunk,) + (0,) * (arr.ndim - 1))


def missing_chunks(manifest: dict) -> list[int]:
    done = set(manifest["complete_chunks"])
    return [c for c in range(manifest["num_chunks"]) if c not in done]


def consolidate_rows(root: str | Path, manifest: dict) -> pa.Table:
    """Merge the per-chunk fragments into ``networks.parquet`` (sorted by index, checked for gaps)."""
    root = Path(root)
    tables = [pq.read_table(root / fragment_name(c)) for c in range(manifest["num_chunks"])]
    # a store resumed across versions may have fragments without a newer column (nulls there)
    table = pa.concat_tables(tables, promote_options="default").sort_by("index")
    index = table.column("index").to_numpy()
    if not np.array_equal(index, np.arange(manifest["num_networks"])):
        raise StoreError(f"{root}: network rows have gaps or duplicates; rerun the generation")
    _write_table_atomically(table, root / NETWORKS_TABLE)
    return table


def _write_table_atomically(table: pa.Table, target: Path) -> None:
    """Write a Parquet file under a temporary name, then rename it: a reader (or a rerun after a
    crash) never sees a half-written one."""
    tmp = target.with_suffix(".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, target)


def missing_fragments(root, manifest: dict) -> list[int]:
    """Chunks whose Parquet fragment is not in ``fragments/`` (``root``: a folder or a URL)."""
    root = store_root(root)
    return [c for c in range(manifest["num_chunks"]) if not (root / fragment_name(c)).exists()]


def rebuild_networks_table(root: str | Path) -> pa.Table:
    """Rebuild a complete store's ``networks.parquet`` from its per-chunk fragments.

    For a store whose table was deleted or damaged while ``fragments/`` survived. ``zoo generate``
    does not do it: rerun on a complete store, it stops at "already complete".
    """
    root = require_local(root, "rebuild the table of")
    manifest = read_manifest(root)
    if manifest.get("status") != STATUS_COMPLETE:
        raise StoreError(f"{root} is not complete; rerun the same `zoo generate` command, which "
                         f"writes {NETWORKS_TABLE} when the last chunk is in")
    missing = missing_fragments(root, manifest)
    if missing:
        raise DamagedStoreError(
            f"{root}: cannot rebuild {NETWORKS_TABLE}: {len(missing)} of {manifest['num_chunks']} "
            f"fragments are missing from {FRAGMENTS_DIR}/ (first: {missing[:5]}); {REPAIR_HINT}"
        )
    return consolidate_rows(root, manifest)


def finalize(root: str | Path, manifest: dict, extra: dict) -> dict:
    manifest.update(extra)
    manifest["status"] = STATUS_COMPLETE
    manifest["completed"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    write_manifest(root, manifest)
    return manifest
