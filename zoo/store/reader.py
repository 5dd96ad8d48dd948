"""Opening a store (a local folder or an fsspec URL): checks it against its manifest, then reads
chunks, rows and statistics."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import zarr

from .format import (
    NETWORKS_TABLE,
    STATS_GROUP,
    STATUS_COMPLETE,
    IncompleteStoreError,
    StoreError,
)
from .location import UrlRoot, store_root
from .manifest import read_manifest
from .writer import chunk_bounds, missing_chunks


class WeightStore:
    """A complete weight store. Raises :class:`StoreError` subclasses when it is not usable.

    ``root`` is a folder or any URL fsspec reads (``s3://bucket/zoo``, ``https://...``; see
    :mod:`zoo.store.location`).
    """

    def __init__(self, root: str | Path | UrlRoot, require_complete: bool = True):
        self.root = store_root(root)
        self.manifest = read_manifest(self.root)
        if require_complete and self.manifest.get("status") != STATUS_COMPLETE:
            missing = missing_chunks(self.manifest)
            raise IncompleteStoreError(
                f"{self.root} is incomplete: {len(missing)} of {self.manifest['num_chunks']} chunks "
                f"missing (first: {missing[:5]}); rerun the same `zoo generate` command to finish it"
            )
        try:
            self.group = zarr.open_group(str(self.root), mode="r")
        except Exception as exc:  # zarr raises several types for a missing/damaged group
            raise StoreError(f"{self.root}: cannot open the Zarr group ({exc})") from exc
        self._check_arrays()

    def _check_arrays(self) -> None:
        n = self.manifest["num_networks"]
        for name, shape in self.manifest["parameters"].items():
            if name not in self.group:
                raise StoreError(f"{self.root}: array {name} listed in the manifest is missing")
            arr = self.group[name]
            if tuple(arr.shape) != (n, *shape):
                raise StoreError(
                    f"{self.root}: array {name} has shape {tuple(arr.shape)} but the manifest "
                    f"says {(n, *shape)}; the store is damaged or was modified"
                )
            if arr.dtype != np.float32:
                raise StoreError(f"{self.root}: array {name} is {arr.dtype}, expected float32")

    # ----------------------------------------------------------- description
    @property
    def widths(self) -> tuple[int, ...]:
        return tuple(self.manifest["architecture"]["widths"])

    @property
    def num_networks(self) -> int:
        return self.manifest["num_networks"]

    @property
    def chunk_size(self) -> int:
        return self.manifest["chunk_size"]

    @property
    def num_chunks(self) -> int:
        return self.manifest["num_chunks"]

    @property
    def parameter_names(self) -> list[str]:
        return list(self.manifest["parameters"])

    def split_range(self, split: str) -> tuple[int, int]:
        if split not in self.manifest["splits"]:
            raise StoreError(f"{self.root} has no split {split!r}; it has {list(self.manifest['splits'])}")
        s = self.manifest["splits"][split]
        return s["start"], s["start"] + s["count"]

    @cached_property
    def networks(self) -> pa.Table:
        path = self.root / NETWORKS_TABLE
        if not path.exists():
            raise StoreError(f"{self.root}: {NETWORKS_TABLE} is missing")
        table = pq.read_table(path if isinstance(path, Path) else pa.BufferReader(path.read_bytes()))
        if table.num_rows != self.num_networks:
            raise StoreError(
                f"{self.root}: {NETWORKS_TABLE} has {table.num_rows} rows, manifest says {self.num_networks}"
            )
        return table

    # ------------------------------------------------------------------ data
    def read(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Parameters of networks ``start..stop-1`` as float32 arrays ``[n, ...]``."""
        return {name: self.group[name][start:stop] for name in self.parameter_names}

    def read_chunk(self, chunk: int) -> dict[str, np.ndarray]:
        return self.read(*chunk_bounds(self.manifest, chunk))

    def chunk_bounds(self, chunk: int) -> tuple[int, int]:
        return chunk_bounds(self.manifest, chunk)

    def stats(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per-entry ``(mean, std)`` over the train split, per parameter array."""
        if STATS_GROUP not in self.group:
            raise StoreError(f"{self.root}: normalization statistics are missing")
        g = self.group[STATS_GROUP]
        return {n: (g[f"{n}_mean"][...], g[f"{n}_std"][...]) for n in self.parameter_names}

    def size_on_disk(self) -> int:
        if isinstance(self.root, UrlRoot):
            return self.root.total_size()
        return sum(p.stat().st_size for p in self.root.rglob("*") if p.is_file())
