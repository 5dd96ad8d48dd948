"""A store's content identity: one ID computed from its checksums, so that two labs can tell they
hold the same zoo without comparing the files.

``content_id`` is ``"sha256:" + sha256`` of the lines ``"<path>\\t<crc32c>\\n"``, sorted by path, of

* every chunk file of every Zarr array (parameters and statistics), by store-relative path, with
  the crc32c each chunk file ends with (zarr's ``crc32c`` codec: 4 bytes little endian);
* every file the manifest's ``checksums["files"]`` records (Parquet table and fragments,
  ``zarr.json`` files), with that checksum;
* ``manifest.json#architecture``, with the crc32c of the manifest's ``architecture`` as canonical
  JSON (``sort_keys``, no spaces): the same weights under another function are another zoo.

Paths are relative to the store and nothing else is hashed (no timestamps, no command, no
folder), so the same networks written anywhere give the same ID; one changed value changes a
chunk's crc32c and so the ID. Only stores whose chunks carry checksums (format v2) have one.

``networks_id`` is narrower: what a model trained on the store reads, and nothing else (see its
docstring). Two stores of the same networks whose tables differ (made before 2026-12-02, when PyTorch's
forward, through the BLAS, evaluated the final MSE, and MKL takes Intel-only kernels on Intel CPUs;
or one made before and one after) have different content IDs and the same networks ID, so a training
carried from one resumes on the other.
"""

from __future__ import annotations

import hashlib
import json

from .checksum import crc32c
from .format import STATS_GROUP, STATUS_COMPLETE
from .location import UrlRoot

KEY = "content_id"
PREFIX = "sha256:"


def content_id(root, manifest: dict) -> str | None:
    """The content ID of the store at ``root`` described by ``manifest`` (its files as they are now);
    ``None`` where its chunks carry no checksums (format v1)."""
    entries = checksum_entries(root, manifest)
    if entries is None:
        return None
    text = "".join(f"{path}\t{checksum}\n" for path, checksum in sorted(entries.items()))
    return PREFIX + hashlib.sha256(text.encode()).hexdigest()


def checksum_entries(root, manifest: dict) -> dict[str, str] | None:
    """``{store-relative path: crc32c}`` that the ID hashes (see the module)."""
    from .reader import WeightStore, _checksummed, _chunk_keys

    store = WeightStore(root, require_complete=False, check_chunks=False)
    arrays = {name: store.parameter_arrays[name] for name in store.parameter_names}
    try:
        stats = store.group[STATS_GROUP]
        arrays.update({f"{STATS_GROUP}/{name}": arr for name, arr in sorted(stats.arrays())})
    except KeyError:
        pass
    if not arrays or not all(_checksummed(arr) for arr in arrays.values()):
        return None
    entries = {}
    for name, arr in arrays.items():
        for _, key in _chunk_keys(arr):
            path = "/".join(p for p in (store.arrays_path, name, key) if p)
            tail = _tail(store.root / path, 4)
            entries[path] = "missing" if tail is None else f"{int.from_bytes(tail, 'little'):08x}"
    entries.update(manifest.get("checksums", {}).get("files", {}))
    architecture = json.dumps(manifest.get("architecture"), sort_keys=True, separators=(",", ":"))
    entries["manifest.json#architecture"] = crc32c(architecture.encode())
    return entries


NETWORKS_PREFIX = "networks-sha256:"
#: the table's columns a training reads besides the manifest's ``targets``
READ_COLUMNS = ("index", "split")


def column_digests(root, manifest: dict, columns=None) -> dict[str, str]:
    """``{column: sha256}`` of the networks table's values (``columns``: all), from the values, not the
    Parquet bytes (which include the writing pyarrow's version): sha256 of the column as JSON."""
    from .format import NETWORKS_TABLE
    from .writer import read_table

    table = read_table(root, NETWORKS_TABLE, manifest)
    names = table.column_names if columns is None else [c for c in columns if c in table.column_names]
    return {name: hashlib.sha256(json.dumps(table.column(name).to_pylist()).encode()).hexdigest()
            for name in names}


def networks_id(root, manifest: dict) -> str | None:
    """The identity of what training on the store reads: every parameter and statistic chunk (their
    crc32c, as in ``content_id``), the architecture, parameter shapes, splits and target names (the
    manifest's), and the values of the table's target, ``index`` and ``split`` columns. It leaves out
    the fit's diagnostics (MSE, PSNR, steps: evaluated with whatever BLAS the machine has), the Parquet
    and ``zarr.json`` bytes (a library's version is in them) and everything else; ``None`` where the
    store is unfinished or its chunks carry no checksums."""
    if manifest.get("status") != STATUS_COMPLETE:
        return None
    entries = checksum_entries(root, manifest)
    if entries is None:
        return None
    return networks_id_of(manifest, entries, column_digests(root, manifest, read_columns(manifest)))


def read_columns(manifest: dict) -> list[str]:
    """The table's columns a training reads: ``READ_COLUMNS`` and the manifest's targets."""
    return [*READ_COLUMNS, *(manifest.get("targets") or [])]


def networks_id_of(manifest: dict, entries: dict[str, str], digests: dict[str, str]) -> str:
    """:func:`networks_id` from a complete store's ``checksum_entries`` and ``column_digests`` (of at
    least its :func:`read_columns`), for a caller that holds them already."""
    lines = [f"{path}\t{crc}" for path, crc in sorted(entries.items())
             if path.startswith(f"{manifest.get('arrays', '')}/") and not path.endswith("zarr.json")]
    described = {key: manifest.get(key) for key in ("kind", "architecture", "parameters", "splits", "targets")}
    lines.append("manifest\t" + json.dumps(described, sort_keys=True, separators=(",", ":")))
    lines += [f"column {name}\t{digests[name]}" for name in sorted(read_columns(manifest)) if name in digests]
    return NETWORKS_PREFIX + hashlib.sha256("".join(f"{line}\n" for line in lines).encode()).hexdigest()


def _tail(path, size: int) -> bytes | None:
    """The last ``size`` bytes of a file (``None``: missing), without reading the rest."""
    if isinstance(path, UrlRoot):
        try:
            data = path.fs.cat_file(path.path, start=-size)
        except FileNotFoundError:
            return None
        return data if len(data) == size else None
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            if f.tell() < size:
                return None
            f.seek(-size, 2)
            return f.read(size)
    except FileNotFoundError:
        return None


def short(identity: str) -> str:
    """The first 16 hex digits, for titles (the full ID is what to compare)."""
    return identity.removeprefix(NETWORKS_PREFIX).removeprefix(PREFIX)[:16]
