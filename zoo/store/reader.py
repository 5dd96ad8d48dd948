"""Opening a store (a local folder or an fsspec URL): checks it against its manifest, then reads
chunks, rows and statistics."""

from __future__ import annotations

import math
import os
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa
import zarr

from .format import (
    FRAGMENTS_DIR,
    NETWORKS_TABLE,
    REPAIR_HINT,
    STATS_GROUP,
    STATUS_COMPLETE,
    DamagedStoreError,
    IncompleteStoreError,
    StoreError,
    arrays_path,
)
from .location import UrlRoot, store_root, zarr_location
from .manifest import read_manifest
from .stats import STD_FLOOR
from .writer import arrays_root, chunk_bounds, chunk_key, missing_chunks, missing_fragments, read_table


class WeightStore:
    """A complete weight store. Raises :class:`StoreError` subclasses when it is not usable.

    ``root`` is a folder or any URL fsspec reads (``s3://bucket/zoo``, ``https://...``; see
    :mod:`zoo.store.location`).
    """

    def __init__(self, root: str | Path | UrlRoot, require_complete: bool = True, check_chunks: bool = True):
        self.root = store_root(root)
        self.manifest = read_manifest(self.root)
        if require_complete and self.manifest.get("status") != STATUS_COMPLETE:
            missing = missing_chunks(self.manifest)
            raise IncompleteStoreError(
                f"{self.root} is incomplete: {len(missing)} of {self.manifest['num_chunks']} chunks "
                f"missing (first: {missing[:5]}); rerun the same `zoo generate` command to finish it"
            )
        self.zarr_root = arrays_root(self.root, self.manifest)  # the Zarr group's folder or URL
        try:
            self.group = zarr.open_group(zarr_location(self.zarr_root), mode="r", zarr_format=3, use_consolidated=False)
        except Exception as exc:  # zarr raises several types for a missing/damaged group
            raise StoreError(f"{self.root}: cannot open the Zarr group at {self.zarr_root} ({exc}); "
                             f"{REPAIR_HINT}") from exc
        self._check_arrays()
        if check_chunks and self.manifest.get("status") == STATUS_COMPLETE:
            self._check_chunks_stored()

    def _check_arrays(self) -> None:
        n = self.manifest["num_networks"]
        for name, shape in self.manifest["parameters"].items():
            arr = self.parameter_arrays.get(name)
            if arr is None:
                raise StoreError(f"{self.root}: array {name} listed in the manifest is missing")
            if tuple(arr.shape) != (n, *shape):
                raise StoreError(
                    f"{self.root}: array {name} has shape {tuple(arr.shape)} but the manifest "
                    f"says {(n, *shape)}; the store is damaged or was modified"
                )
            if arr.dtype != np.float32:
                raise StoreError(f"{self.root}: array {name} is {arr.dtype}, expected float32")
            if self.manifest["format_version"] >= 2 and not _checksummed(arr):
                raise StoreError(f"{self.root}: array {name} has no crc32c codec, which format v2 "
                                 f"requires; it was rewritten by another tool")

    def _check_chunks_stored(self) -> None:
        """Refuse a complete store with a missing or truncated chunk file (see :meth:`damaged_chunks`)."""
        damaged = self.damaged_chunks()
        if damaged:
            shown = "; ".join(f"chunk {c}: {why}" for c, why in list(damaged.items())[:5])
            more = f"; and {len(damaged) - 5} more" if len(damaged) > 5 else ""
            raise DamagedStoreError(
                f"{self.root} is damaged: {len(damaged)} chunk(s) of a complete store have missing or "
                f"truncated files: {shown}{more}. Those networks cannot be read (a missing file reads as "
                f"NaN, the arrays' fill value); {REPAIR_HINT}"
            )

    def damaged_chunks(self) -> dict[int, str]:
        """``{chunk: why}`` for every network chunk with a parameter file that is missing or not
        at its size (the arrays are uncompressed, so every chunk file has exactly ``chunk bytes``,
        plus 4 for the checksum in format v2). Bit flips that keep the size are found on reading
        (the checksum) or by ``zoo verify``, which reads everything.

        A missing chunk file would read back as the fill value, NaN, and a truncated one fails
        deep inside zarr. Local folders: one ``stat`` per chunk file; URLs: one listing of the
        arrays. Where a URL cannot be listed (plain HTTP servers without index pages) nothing is
        reported and :meth:`read` still refuses the damage.
        """
        damaged: dict[int, list[str]] = {}
        listing = self._listing()
        for name in self.parameter_names:
            arr = self.parameter_arrays[name]
            size_of = self._stored(name, listing)
            if size_of is None:  # this URL cannot be listed: leave it to read()
                return {}
            rows, expected = _storage_chunks(arr)[0], _stored_bytes(arr)
            for coords, key in _chunk_keys(arr):
                size = size_of(key)
                if size is None:
                    why = "missing"
                elif expected is not None and size >= 0 and size != expected:
                    why = f"{size} bytes instead of {expected}"
                else:
                    continue
                lo, hi = coords[0] * rows, min((coords[0] + 1) * rows, self.num_networks)
                damaged.setdefault(coords[0], []).append(
                    f"file {'/'.join(p for p in (self.arrays_path, name, key) if p)} {why} (networks {lo}..{hi - 1})")
        return {c: ", ".join(whys) for c, whys in sorted(damaged.items())}

    def _listing(self) -> dict | None:
        """``{key: size}`` of every object under the Zarr group of a URL store, in one listing
        (``None``: a local folder, or a URL that cannot be listed)."""
        return self.zarr_root.sizes() if isinstance(self.zarr_root, UrlRoot) else None

    def _stored(self, name: str, listing: dict | None = None):
        """``key -> size in bytes`` of the objects stored under array ``name`` (``None``: not
        stored; ``-1``: stored, size unknown), or ``None`` when the store cannot be listed.
        ``listing``: :meth:`_listing`, for URL stores (listed here if not given)."""
        base = self.zarr_root / name
        if isinstance(base, UrlRoot):
            listing = self._listing() if listing is None else listing
            prefix = f"{name}/"
            found = {k[len(prefix):]: v for k, v in (listing or {}).items() if k.startswith(prefix)}
            if "zarr.json" not in found:  # zarr read that file: such a listing is not to be trusted
                return None
            return lambda key: (-1 if found[key] is None else int(found[key])) if key in found else None

        def size_of(key):
            try:
                return os.stat(os.path.join(base, key)).st_size
            except FileNotFoundError:
                return None

        return size_of

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
            if self.manifest.get("status") != STATUS_COMPLETE:
                raise IncompleteStoreError(f"{self.root}: {NETWORKS_TABLE} is not written yet; rerun the "
                                           f"same `zoo generate` command, which writes it at the end")
            raise DamagedStoreError(f"{self.root} is damaged: {NETWORKS_TABLE} is missing; {self._table_hint()}")
        table = read_table(self.root, NETWORKS_TABLE, self.manifest)
        if table.num_rows != self.num_networks:
            raise StoreError(
                f"{self.root}: {NETWORKS_TABLE} has {table.num_rows} rows, manifest says {self.num_networks}"
            )
        return table

    # ------------------------------------------------------------------ data
    @cached_property
    def parameter_arrays(self) -> dict:
        """``{name: zarr array}`` of the parameters, opened once (a missing one is left out)."""
        arrays = {}
        for name in self.parameter_names:
            try:
                arrays[name] = self.group[name]
            except KeyError:
                pass
        return arrays

    def read(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Parameters of networks ``start..stop-1`` as float32 arrays ``[n, ...]``.

        Raises :class:`DamagedStoreError` for a chunk that cannot be decoded (a truncated file, or
        in format v2 any change of its bytes: the checksum) or that holds NaN (the fill value of a
        chunk file that is gone).
        """
        out = {}
        for name, arr in self.parameter_arrays.items():
            try:
                values = arr[start:stop]
            except (ValueError, TypeError, IndexError, KeyError) as exc:  # not OSError: I/O is not damage
                damaged = self._undecodable(name, arr, start, stop, exc)
                if damaged is None:  # every chunk decodes alone: a bad argument, not a bad store
                    raise
                raise damaged from exc
            if values.size and np.isnan(values.min()):  # min propagates NaN: one pass, no temporary
                raise self._holds_nan(name, arr, start, values)
            out[name] = values
        return out

    def _undecodable(self, name, arr, start, stop, exc) -> DamagedStoreError | None:
        """The error for the first chunk of ``start..stop-1`` that fails to decode on its own
        (``None`` if none does). Runs on failures only."""
        try:
            chunks = list(_chunks_of(arr, start, stop))
        except TypeError:
            return None
        for c, lo, hi in chunks:
            try:
                arr[lo:hi]
            except Exception as own:  # noqa: BLE001 - any failure marks this chunk
                why = ("fails its crc32c checksum: its bytes changed after it was written (truncated, "
                       "overwritten or flipped)" if "checksum" in str(own)
                       else f"cannot be decoded: {exc}. The chunk file is truncated or overwritten")
                return DamagedStoreError(
                    f"{self.root} is damaged: array {name}, chunk {c} (networks {lo}..{hi - 1}, file "
                    f"{self.chunk_file(name, c)}) {why}; {REPAIR_HINT}"
                )
        return None

    def _holds_nan(self, name, arr, start, values) -> DamagedStoreError:
        bad = np.flatnonzero(np.isnan(values.reshape(len(values), -1)).any(axis=1)) + start
        rows = _storage_chunks(arr)[0]
        chunks = sorted({int(i) // rows for i in bad})
        files = ", ".join(self.chunk_file(name, c) for c in chunks[:5])
        return DamagedStoreError(
            f"{self.root} is damaged: array {name} holds NaN for {len(bad)} network(s) "
            f"({_ranges(bad)}; chunk(s) {chunks[:5]}{' ...' if len(chunks) > 5 else ''}, file(s) {files}). "
            f"Writers refuse NaN, so a chunk file is missing (NaN is the fill value) or was overwritten; "
            f"{REPAIR_HINT}"
        )

    def chunk_file(self, name: str, chunk: int) -> str:
        """Store-relative name of the file of parameter ``name``'s chunk ``chunk``."""
        return "/".join(p for p in (self.arrays_path, name, chunk_key(self.parameter_arrays[name], chunk)) if p)

    @property
    def arrays_path(self) -> str:
        """Store-relative folder of the Zarr group (``arrays``; ``""`` in format v1)."""
        return arrays_path(self.manifest)

    def _table_hint(self) -> str:
        try:
            missing = missing_fragments(self.root, self.manifest)
        except Exception:  # noqa: BLE001 - only a hint
            missing = None
        if missing == []:
            return (f"its rows are still in {FRAGMENTS_DIR}/: rerun the `zoo generate` command that made it "
                    f"(`zoo verify {self.root}` prints it), or rebuild just the table with "
                    f"`python -c \"from zoo.store import rebuild_networks_table; "
                    f"rebuild_networks_table({str(self.root)!r})\"`")
        return f"the per-chunk fragments under {FRAGMENTS_DIR}/ are gone too; {REPAIR_HINT}"

    def read_rows(self, indices) -> dict[str, np.ndarray]:
        """Parameters of the networks at ``indices`` (any order, repeats allowed), in that order.

        Reads one chunk's span at a time, so memory stays at the rows asked for plus one chunk:
        what a random subsample of a store larger than memory needs.
        """
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        if indices.size and (indices.min() < 0 or indices.max() >= self.num_networks):
            raise IndexError(f"network indices must lie in 0..{self.num_networks - 1}")
        out = {name: np.empty((indices.size, *shape), np.float32)
               for name, shape in self.manifest["parameters"].items()}
        chunk_of = indices // self.chunk_size
        for chunk in np.unique(chunk_of):
            where = np.flatnonzero(chunk_of == chunk)
            picked = indices[where]
            lo = int(picked.min())
            for name, values in self.read(lo, int(picked.max()) + 1).items():
                out[name][where] = values[picked - lo]
        return out

    def read_chunk(self, chunk: int) -> dict[str, np.ndarray]:
        return self.read(*chunk_bounds(self.manifest, chunk))

    def chunk_bounds(self, chunk: int) -> tuple[int, int]:
        return chunk_bounds(self.manifest, chunk)

    def stats(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per-entry ``(mean, std)`` over the train split, per parameter array."""
        try:
            g = self.group[STATS_GROUP]
        except KeyError:
            raise StoreError(f"{self.root}: normalization statistics are missing; {REPAIR_HINT}") from None
        listing = self._listing()
        out = {}
        for n in self.parameter_names:
            pair = []
            for stat in ("mean", "std"):
                key = f"{n}_{stat}"
                try:
                    arr = g[key]
                except KeyError:
                    raise StoreError(f"{self.root}: normalization statistic {STATS_GROUP}/{key} is missing; "
                                     f"{REPAIR_HINT}") from None
                size_of = self._stored(f"{STATS_GROUP}/{key}", listing)
                # a missing chunk reads as the fill value, 0, which is a plausible mean: look for the file
                absent = [k for _, k in _chunk_keys(arr) if size_of is not None and size_of(k) is None]
                try:
                    values = arr[...]
                except (ValueError, TypeError, IndexError, KeyError) as exc:
                    raise DamagedStoreError(f"{self.root} is damaged: {STATS_GROUP}/{key} cannot be decoded "
                                            f"({exc}); {REPAIR_HINT}") from exc
                impossible = not np.isfinite(values).all() or (stat == "std" and (values < np.float32(STD_FLOOR)).any())
                if absent or impossible:
                    file = "/".join(p for p in (self.arrays_path, STATS_GROUP, key, absent[0] if absent else "") if p)
                    why = f"file {file} is missing" if absent else "it holds impossible values"
                    raise DamagedStoreError(f"{self.root} is damaged: normalization statistic {STATS_GROUP}/{key}: "
                                            f"{why}; {REPAIR_HINT}")
                pair.append(values)
            out[n] = tuple(pair)
        return out

    def size_on_disk(self) -> int:
        if isinstance(self.root, UrlRoot):
            return self.root.total_size()
        return sum(p.stat().st_size for p in self.root.rglob("*") if p.is_file())


def _chunks_of(arr, start: int, stop: int):
    """``(chunk, lo, hi)`` of the storage chunks that networks ``start..stop-1`` touch."""
    rows = _storage_chunks(arr)[0]
    start, stop, _ = slice(start, stop).indices(arr.shape[0])
    for c in range(start // rows, (max(stop, start + 1) - 1) // rows + 1):
        yield c, c * rows, min((c + 1) * rows, arr.shape[0])


def _storage_chunks(arr) -> tuple[int, ...]:
    """Shape of one stored object of ``arr`` (the shard, where the array is sharded)."""
    return tuple(arr.shards or arr.chunks)


def raw_layout(arr) -> tuple[int, bool] | None:
    """``(bytes, checksummed)`` of every stored chunk of an array in a layout this project writes:
    unsharded, uncompressed little-endian values (edge chunks are stored whole), followed in format
    v2 by their crc32c (4 bytes); ``None`` for any other layout."""
    from zarr.codecs import BytesCodec, Crc32cCodec

    codecs = arr.metadata.codecs
    if arr.shards is not None or not codecs or not isinstance(codecs[0], BytesCodec):
        return None
    if codecs[0].endian is not None and codecs[0].endian.value != "little":
        return None
    values = math.prod(arr.chunks) * arr.dtype.itemsize
    if [type(c) for c in codecs] == [BytesCodec]:
        return values, False
    if [type(c) for c in codecs] == [BytesCodec, Crc32cCodec]:
        return values + 4, True
    return None


def _stored_bytes(arr) -> int | None:
    """Size of every stored chunk (see :func:`raw_layout`), else ``None`` (unknown)."""
    layout = raw_layout(arr)
    return None if layout is None else layout[0]


def _checksummed(arr) -> bool:
    from zarr.codecs import Crc32cCodec

    return any(isinstance(c, Crc32cCodec) for c in arr.metadata.codecs)


def _chunk_keys(arr) -> list[tuple[tuple[int, ...], str]]:
    """``(grid coordinates, key)`` of every stored object a fully written ``arr`` has."""
    grid = tuple(math.ceil(s / c) for s, c in zip(arr.shape, _storage_chunks(arr)))
    return [(coords, arr.metadata.encode_chunk_key(coords)) for coords in np.ndindex(*grid)]


def _ranges(indices) -> str:
    """``[3, 4, 5, 9]`` -> ``"networks 3..5, 9"`` (at most 5 ranges)."""
    runs, first = [], None
    for i in map(int, indices):
        if first is not None and i == prev + 1:
            prev = i
            continue
        if first is not None:
            runs.append((first, prev))
        first = prev = i
    if first is not None:
        runs.append((first, prev))
    text = ", ".join(f"{a}..{b}" if a != b else f"{a}" for a, b in runs[:5])
    return "networks " + text + (" ..." if len(runs) > 5 else "")
