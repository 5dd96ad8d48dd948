"""Creating a store (a folder or a URL) and filling it chunk by chunk.

Whoever makes a chunk writes it whole (array slices aligned to the Zarr chunking, plus a Parquet
fragment of its rows); only the coordinating process touches the manifest, so concurrent workers
never race on it. A chunk counts as written only once the manifest lists it, which it does only
after the chunk's data and fragment are stored; that makes an interrupted generation safe to
resume: unlisted chunks are simply written again.

Integrity (format v2): every chunk file carries a crc32c checksum through zarr's codec pipeline;
every other file (Parquet fragments and table, Zarr metadata) has its checksum recorded in the
manifest's ``checksums`` when it is written; the manifest checks itself (:mod:`.manifest`).
"""

from __future__ import annotations

import io
import json
import os
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path

import google_crc32c
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import zarr

from .checksum import ALGORITHM, crc32c, crc32c_combine
from .format import (
    ARRAYS_GROUP,
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
    array_codecs,
    arrays_path,
    fragment_name,
    parameter_shapes,
)
from .location import is_empty, put_file, remove_tree, store_root, zarr_location
from .manifest import read_manifest, write_manifest

LAYOUT_KEYS = ("format_version", "arrays", "num_networks", "chunk_size", "parameters")


def create_store(
    root,
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
    root = store_root(root)
    chunk_size = max(1, min(chunk_size, num_networks))
    if (root / MANIFEST).exists() and not overwrite:
        raise StoreError(f"{root} already holds a store; resume it or pass overwrite")
    if overwrite:
        remove_tree(root)
    if not is_empty(root):
        raise StoreError(f"{root} exists and is not empty; choose a new --out directory")
    root.mkdir(parents=True, exist_ok=True)
    num_chunks = (num_networks + chunk_size - 1) // chunk_size
    shapes = parameter_shapes(widths)
    manifest = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "status": STATUS_IN_PROGRESS,
        "arrays": ARRAYS_GROUP,
        "num_networks": num_networks,
        "chunk_size": chunk_size,
        "num_chunks": num_chunks,
        "complete_chunks": [],
        "parameters": {name: list(shape) for name, shape in shapes.items()},
        "splits": splits,
        "checksums": {"algorithm": ALGORITHM, "files": {}},
        **metadata,
    }
    group = zarr.open_group(zarr_location(arrays_root(root, manifest)), mode="w", zarr_format=3)
    nodes = {"": group}
    for name, shape in shapes.items():
        nodes[name] = group.create_array(
            name,
            shape=(num_networks, *shape),
            chunks=(chunk_size, *shape),
            dtype="float32",
            fill_value=float("nan"),
            dimension_names=("network",) + tuple(f"dim{i}" for i in range(len(shape))),
            **array_codecs(manifest),  # float32 weights barely compress (~7%) at 2-4x the cost
        )
    record_metadata(manifest, nodes)
    (root / FRAGMENTS_DIR).mkdir(parents=True, exist_ok=True)
    write_manifest(root, manifest)
    return manifest


def arrays_root(root, manifest: dict):
    """The Zarr group's folder (or URL) of the store at ``root``."""
    root = store_root(root)
    path = arrays_path(manifest)
    return root / path if path else root


def record_metadata(manifest: dict, nodes: dict) -> None:
    """Record in ``manifest`` (not yet saved) the checksums of the ``zarr.json`` of Zarr ``nodes``
    (``{path in the group: array or group}``), from the metadata zarr wrote: the same bytes, not
    read back."""
    from zarr.buffer import default_buffer_prototype

    files = manifest.setdefault("checksums", {"algorithm": ALGORITHM, "files": {}})["files"]
    for path, node in nodes.items():
        data = node.metadata.to_buffer_dict(default_buffer_prototype())["zarr.json"].to_bytes()
        files["/".join(p for p in (arrays_path(manifest), path, "zarr.json") if p)] = crc32c(data)


def chunk_layout(manifest: dict) -> dict:
    """What a chunk writer needs of the manifest (a chunk task gets this, not the whole manifest)."""
    return {k: manifest[k] for k in LAYOUT_KEYS if k in manifest}


def chunk_bounds(manifest: dict, chunk: int) -> tuple[int, int]:
    start = chunk * manifest["chunk_size"]
    return start, min(start + manifest["chunk_size"], manifest["num_networks"])


def train_stop(manifest: dict) -> int:
    """The train networks are those below this index (the train split comes first)."""
    train = manifest["splits"]["train"]
    return train["start"] + train["count"]


def train_chunks(manifest: dict) -> list[int]:
    """The chunks that hold train networks, in order: those the statistics are reduced from."""
    return [c for c in range(manifest["num_chunks"]) if chunk_bounds(manifest, c)[0] < train_stop(manifest)]


def write_chunk(root, chunk: int, params: dict[str, np.ndarray], rows: pa.Table, layout: dict | None = None) -> str:
    """Write one chunk's parameters and rows; returns the fragment's checksum. Safe to repeat: it
    overwrites the same cells. ``layout``: :func:`chunk_layout` (read from the store if not given).

    Nothing of the chunk is written unless every value is finite. A whole chunk of a local store
    goes straight to its files (:func:`_stage_chunk_file`: one pass over the values checks them,
    checksums them and writes them while they are in cache; the files are renamed into place once
    every array passed); other chunks (URLs, the edge chunk) are checked, then written by zarr."""
    root = store_root(root)
    layout = layout or chunk_layout(read_manifest(root))
    start, stop = chunk_bounds(layout, chunk)
    if rows.num_rows != stop - start:
        raise StoreError(f"chunk {chunk} needs {stop - start} rows, got {rows.num_rows}")
    checked = {}
    for name, shape in layout["parameters"].items():  # check everything before writing anything
        values = np.asarray(params[name], dtype=np.float32)
        if values.shape != (stop - start, *shape):
            raise StoreError(f"chunk {chunk}: {name} has shape {values.shape}, expected {(stop - start, *shape)}")
        checked[name] = values
    arrays = _open_arrays(zarr_location(arrays_root(root, layout)), json.dumps(layout, sort_keys=True))
    direct = {name: _direct_chunk_file(arrays[name], chunk, values) for name, values in checked.items()}
    for name, values in checked.items():
        if direct[name] is None and not _all_finite(values):
            _refuse_non_finite(chunk, name)
    staged = _stage_chunk_files([(name, values, *direct[name]) for name, values in checked.items()
                                 if direct[name] is not None], chunk)
    try:
        for tmp, path in staged:
            os.replace(tmp, path)
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise
    for name, values in checked.items():
        if direct[name] is None:
            arrays[name][start:stop] = values
    return write_table(rows, root / fragment_name(chunk))


def _refuse_non_finite(chunk: int, name: str):
    raise StoreError(f"chunk {chunk}: {name} contains NaN or inf; refusing to store it")


#: elements checked for NaN / inf at a time (no chunk-sized temporary), and elements checked,
#: checksummed and written at a time by :func:`_stage_part`: 1 MiB of float32, which stays in a core's
#: L2 cache through the three passes (in one thread, the 482 MB chunk of a paper-sized zoo took 257 ms
#: into the page cache in blocks of 4 MiB, 185 ms in 1 MiB, 203 ms in 128 KiB; 2026-12-04, an Intel
#: Xeon with 2 cores)
_BLOCK = 1 << 18


def _all_finite(values: np.ndarray) -> bool:
    flat = values.reshape(-1)
    flags = np.empty(min(flat.size, _BLOCK), dtype=bool)
    for begin in range(0, flat.size, _BLOCK):
        block = flat[begin:begin + _BLOCK]
        if not np.isfinite(block, out=flags[:block.size]).all():
            return False
    return True


@lru_cache(maxsize=4)
def _open_arrays(group: str, layout: str) -> dict:
    """The parameter arrays of a store, opened once per process and layout: a worker writing many
    chunks of a URL store reads their metadata once, not a few requests per array and chunk.
    ``write_empty_chunks``: zarr otherwise compares every chunk with the fill value (NaN) before
    writing it, a pass over the data for nothing (a chunk with a NaN is refused above)."""
    opened = zarr.open_group(group, mode="r+", zarr_format=3, use_consolidated=False)
    arrays = {name: opened[name] for name in json.loads(layout)["parameters"]}
    if hasattr(zarr.Array, "with_config"):  # zarr >= 3.1
        arrays = {name: a.with_config({"write_empty_chunks": True}) for name, a in arrays.items()}
    return arrays


def _direct_chunk_file(arr, chunk: int, values: np.ndarray) -> tuple[Path, bool] | None:
    """``(file, with crc32c)`` where chunk ``chunk`` of a local array can be written straight to
    its file as zarr would encode it; None where zarr must write it (a URL, an edge chunk, which
    zarr pads to full size, another encoding).

    The bytes are exactly zarr's: the codecs are ``[bytes (little endian)]`` or ``[bytes (little
    endian), crc32c]`` (the Zarr v3 spec's encodings: the C-order values, then for crc32c its 4
    bytes little endian), checked on the array's metadata, so every other layout goes through
    zarr. Zarr's own path took ~2x the disk's write time for a 482 MB chunk: a pass comparing it
    with the fill value, a copy into a fresh buffer to append the checksum (page faults
    included), then the write of that copy."""
    try:
        from zarr.codecs import BytesCodec, Crc32cCodec
        from zarr.core.chunk_grids import RegularChunkGrid
        from zarr.storage import LocalStore
    except ImportError:  # another zarr layout: let zarr write
        return None
    meta, codecs = arr.metadata, arr.metadata.codecs
    if not (isinstance(arr.store, LocalStore) and isinstance(meta.chunk_grid, RegularChunkGrid)
            and tuple(meta.chunk_grid.chunk_shape) == values.shape and arr.dtype == np.dtype("float32")
            and len(codecs) in (1, 2) and type(codecs[0]) is BytesCodec and codecs[0].endian is not None
            and codecs[0].endian.value == "little"
            and (len(codecs) == 1 or type(codecs[1]) is Crc32cCodec)):
        return None
    return Path(arr.store.root) / arr.path / chunk_key(arr, chunk), len(codecs) == 2


#: threads that stage a chunk's files (:func:`_stage_chunk_files`; one where there is no ``os.pwrite``:
#: Windows), and the size above which an array is cut into one part per thread
_STAGING_THREADS = 2 if hasattr(os, "pwrite") else 1
_SPLIT_BYTES = 8 << 20


def _stage_chunk_files(arrays: list[tuple[str, np.ndarray, Path, bool]], chunk: int) -> list[tuple[Path, Path]]:
    """Write each ``(name, values, path, with crc32c)`` as zarr encodes a chunk (the values, then their
    crc32c), under a temporary name beside ``path`` (zarr's own: ``<key>.<uuid>.partial``); returns the
    ``(temporary, path)`` pairs, to be renamed. A :class:`StoreError` for a non-finite value, and nothing
    left behind.

    Block by block, each is checked for NaN/inf, checksummed and written while it is in cache, by
    :data:`_STAGING_THREADS` threads at once: an array above :data:`_SPLIT_BYTES` is cut into one part
    per thread, each written at its offset, and the parts' checksums are combined
    (:func:`~zoo.store.checksum.crc32c_combine`). ``isfinite`` and ``os.pwrite`` release the GIL, so
    one thread's checks run while another's bytes go to the disk: the 482 MB chunk of a paper-sized
    zoo took 128 ms into the page cache, as long as a plain write of its bytes (129 ms), against 207
    ms for the same passes in one thread (benchmarks/README.md, 2026-12-04)."""
    if not arrays:  # every array of the chunk goes through zarr (a URL, the edge chunk)
        return []
    staged, files, parts = [], [], []
    stop = threading.Event()  # set by a part that met a non-finite value, or by a failure here
    try:
        for name, values, path, checksum in arrays:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{uuid.uuid4().hex}.partial")
            files.append(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            staged.append((tmp, path))
            flat = np.ascontiguousarray(values, dtype="<f4").reshape(-1)
            cuts = np.linspace(0, flat.size, _STAGING_THREADS + 1 if flat.nbytes > _SPLIT_BYTES else 2).astype(int)
            parts += [(len(files) - 1, flat, int(lo), int(hi), checksum, name) for lo, hi in zip(cuts[:-1], cuts[1:])]
        with ThreadPoolExecutor(min(_STAGING_THREADS, len(parts)), thread_name_prefix="zoo-stage") as pool:
            futures = [pool.submit(_stage_part, files[i], flat, lo, hi, checksum, chunk, name, stop)
                       for i, flat, lo, hi, checksum, name in parts]
            try:
                crcs = [future.result() for future in futures]  # the first failure raises
            except BaseException:  # a NaN, a full disk, Ctrl-C: the other parts stop at their next block
                stop.set()
                raise
        whole: dict[int, int] = {}
        for (i, _, lo, hi, checksum, _), crc in zip(parts, crcs):
            if checksum:
                whole[i] = crc if i not in whole else crc32c_combine(whole[i], crc, 4 * (hi - lo))
        for i, ((_, values, _, checksum), fd) in enumerate(zip(arrays, files)):
            if checksum:
                _write_all(fd, memoryview(whole[i].to_bytes(4, "little")), values.size * 4)  # every array has a part
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise
    finally:
        for fd in files:
            os.close(fd)
    return staged


def _stage_part(fd: int, flat: np.ndarray, lo: int, hi: int, checksum: bool, chunk: int, name: str,
                stop: threading.Event) -> int:
    """Elements ``lo:hi`` of ``flat`` checked, checksummed (their crc32c returned, 0 without) and written
    at their offset in ``fd``, :data:`_BLOCK` at a time (:func:`_stage_chunk_files`); given up, half
    written, once ``stop`` is set (the chunk is refused)."""
    data, flags, crc = flat.view(np.uint8), np.empty(min(hi - lo, _BLOCK), dtype=bool), 0
    for begin in range(lo, hi, _BLOCK):
        if stop.is_set():
            return 0
        end = min(begin + _BLOCK, hi)
        if not np.isfinite(flat[begin:end], out=flags[:end - begin]).all():
            stop.set()
            _refuse_non_finite(chunk, name)
        block = data[4 * begin:4 * end]
        if checksum:
            crc = google_crc32c.extend(crc, block)
        _write_all(fd, memoryview(block), 4 * begin)
    return crc


def _write_all(fd: int, view: memoryview, offset: int) -> None:
    if not hasattr(os, "pwrite"):  # one staging thread: seek, then write
        os.lseek(fd, offset, os.SEEK_SET)
    while view:
        written = os.pwrite(fd, view, offset) if hasattr(os, "pwrite") else os.write(fd, view)
        view, offset = view[written:], offset + written


def mark_chunks_complete(root, manifest: dict, fragments: dict[int, str | None]) -> dict:
    """List ``fragments``' chunks as complete, with their fragments' checksums (``chunk -> crc32c``)."""
    files = manifest.setdefault("checksums", {"algorithm": ALGORITHM, "files": {}})["files"]
    for chunk, checksum in fragments.items():
        if checksum is not None:
            files[fragment_name(int(chunk))] = checksum
    manifest["complete_chunks"] = sorted(set(manifest["complete_chunks"]) | {int(c) for c in fragments})
    write_manifest(root, manifest)
    return manifest


def reopen_chunks(root, manifest: dict, chunks) -> dict:
    """Take ``chunks`` off a store's completed list (the store is in progress again) so that
    rerunning its generation remakes them; used for chunks whose files were lost or damaged.
    With no chunks, the store is only marked in progress: the rerun rewrites its table and
    statistics."""
    root = store_root(root)
    chunks = sorted(int(c) for c in chunks)
    if chunks:
        group = zarr.open_group(zarr_location(arrays_root(root, manifest)), mode="r", zarr_format=3, use_consolidated=False)
        for name in manifest["parameters"]:  # a damaged file must not be read back by a partial write
            for c in chunks:
                (arrays_root(root, manifest) / name / chunk_key(group[name], c)).unlink(missing_ok=True)
    files = manifest.get("checksums", {}).get("files", {})
    for c in chunks:
        files.pop(fragment_name(c), None)
    manifest["complete_chunks"] = sorted(set(manifest["complete_chunks"]) - set(chunks))
    manifest["status"] = STATUS_IN_PROGRESS
    write_manifest(root, manifest)
    return manifest


def chunk_key(arr, chunk: int) -> str:
    """Key (relative to the array) of the stored object holding networks chunk ``chunk``."""
    return arr.metadata.encode_chunk_key((chunk,) + (0,) * (arr.ndim - 1))


def missing_chunks(manifest: dict) -> list[int]:
    done = set(manifest["complete_chunks"])
    return [c for c in range(manifest["num_chunks"]) if c not in done]


def read_table(root, name: str, manifest: dict) -> pa.Table:
    """A Parquet file of the store, checked against the checksum the manifest records for it
    (:class:`DamagedStoreError` naming the file if it does not match)."""
    data = (store_root(root) / name).read_bytes()
    expected = manifest.get("checksums", {}).get("files", {}).get(name)
    if expected is not None and crc32c(data) != expected:
        raise DamagedStoreError(f"{store_root(root)} is damaged: {name} fails its crc32c checksum (the file "
                                f"changed after it was written); {REPAIR_HINT}")
    return pq.read_table(pa.BufferReader(data))


def consolidate_rows(root, manifest: dict) -> pa.Table:
    """Merge the per-chunk fragments into ``networks.parquet`` (sorted by index, checked for gaps)
    and record its checksum in ``manifest`` (saved by the caller)."""
    root = store_root(root)
    tables = [read_table(root, fragment_name(c), manifest) for c in range(manifest["num_chunks"])]
    # a store resumed across versions may have fragments without a newer column (nulls there)
    table = pa.concat_tables(tables, promote_options="default").sort_by("index")
    index = table.column("index").to_numpy()
    if not np.array_equal(index, np.arange(manifest["num_networks"])):
        raise StoreError(f"{root}: network rows have gaps or duplicates; rerun the generation")
    files = manifest.setdefault("checksums", {"algorithm": ALGORITHM, "files": {}})["files"]
    files[NETWORKS_TABLE] = write_table(table, root / NETWORKS_TABLE)
    return table


def write_table(table: pa.Table, target) -> str:
    """Write a Parquet file whole (never half-written, see :func:`put_file`); returns its checksum."""
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    data = buffer.getvalue()
    put_file(target, data)
    return crc32c(data)


def missing_fragments(root, manifest: dict) -> list[int]:
    """Chunks whose Parquet fragment is not in ``fragments/`` (``root``: a folder or a URL)."""
    root = store_root(root)
    return [c for c in range(manifest["num_chunks"]) if not (root / fragment_name(c)).exists()]


def rebuild_networks_table(root: str | Path) -> pa.Table:
    """Rebuild a complete store's ``networks.parquet`` from its per-chunk fragments (a folder or a
    URL). Rerunning the store's ``zoo generate`` command does this too, and repairs everything
    else it finds."""
    root = store_root(root)
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
    table = consolidate_rows(root, manifest)
    write_manifest(root, manifest)
    return table


def finalize(root, manifest: dict, extra: dict) -> dict:
    """Mark the store complete with ``extra`` in its manifest. Stores are finished through
    :func:`zoo.store.finish.finish`, which adds the content ID and writes the dataset card."""
    manifest.update(extra)
    manifest["status"] = STATUS_COMPLETE
    manifest["completed"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    write_manifest(root, manifest)
    return manifest
