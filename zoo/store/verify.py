"""Checking a whole store: ``zoo verify``, and what a rerun of ``zoo generate`` repairs.

Everything is read once, chunk by chunk: every chunk file at its size and matching its crc32c (a
format-v1 store has no checksums: its values are checked for NaN), every fragment and the table
against the checksums the manifest records and against each other, the Zarr metadata likewise,
and the statistics recomputed from the train networks (in chunk order, exactly as the generation
reduced them) and compared with the stored ones.

Each problem is attributed to the part a rerun of the store's own ``zoo generate`` command
remakes: a chunk (its arrays and fragment are refitted), the table (rebuilt from the fragments),
the statistics (recomputed). Damage to the manifest or the Zarr metadata cannot be repaired in
place: restore those files from a copy, or regenerate the store into a new folder.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from ..options import RUNTIME_BYTES, require_memory
from .checksum import chunk_checksum_ok, crc32c
from .format import (FRAGMENTS_DIR, MANIFEST, NETWORKS_TABLE, STATUS_COMPLETE, DamagedStoreError, StoreError,
                     values_per_network)
from .identity import KEY as ID_KEY, content_id
from .location import read_files, store_root
from .manifest import read_manifest
from .reader import WeightStore, raw_layout
from .stats import STD_FLOOR, TrainMoments, chunk_train_moments, reduce_moments, row_status
from .writer import chunk_bounds, chunk_key, fragment_name, missing_chunks, train_chunks, train_stop

REMADE_BY_RERUN = ("chunk", "table", "statistics", "incomplete")


@dataclass
class Problem:
    part: str  # chunk, table, statistics, incomplete (a rerun remakes them); manifest, metadata (it cannot)
    what: str
    chunk: int | None = None

    def __str__(self) -> str:
        return self.what


@dataclass
class Verification:
    """What :func:`verify_store` found: ``problems`` (empty: intact) and what it checked."""

    root: object
    manifest: dict | None
    problems: list[Problem] = field(default_factory=list)
    checked: list[tuple[str, str]] = field(default_factory=list)  # (part, what was checked and found)
    moments: dict[int, TrainMoments] = field(default_factory=dict)  # intact train chunks (when asked)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def damaged(self) -> list[Problem]:
        return [p for p in self.problems if p.part != "incomplete"]

    @property
    def repairable(self) -> bool:
        """Whether rerunning the generating command repairs everything found."""
        return all(p.part in REMADE_BY_RERUN for p in self.problems)

    def chunks_to_remake(self) -> list[int]:
        return sorted({p.chunk for p in self.problems if p.part == "chunk"})

    def repair(self) -> str:
        """How to repair what was found (empty when nothing was)."""
        if not self.problems:
            return ""
        command = rerun_command(self.manifest, self.root) if self.manifest else None
        if not self.repairable:
            parts = sorted({p.part for p in self.problems if p.part not in REMADE_BY_RERUN})
            new = f"; the command that made it (with another --out): {command}" if command else ""
            return (f"the {' and '.join(parts)} cannot be rewritten in place: restore {', '.join(parts)} "
                    f"files from a copy, or regenerate the store into a new folder{new}")
        what = "finish it" if all(p.part == "incomplete" for p in self.problems) else (
            "repair it (the rerun finds the damage and remakes exactly those parts)")
        return f"rerun the command that generated the store to {what}:\n  {command}"

    def summary(self) -> str:
        lines = [f"{part:<10} {what}" for part, what in self.checked]
        if self.ok:
            lines.append(f"{'result':<10} OK: no damage found")
            return "\n".join(lines)
        label = "DAMAGED" if self.damaged else "INCOMPLETE"
        lines.append(f"{'result':<10} {label}: {len(self.problems)} problem(s)")
        lines += [f"  {p}" for p in self.problems[:50]]
        if len(self.problems) > 50:
            lines.append(f"  ... and {len(self.problems) - 50} more")
        lines.append("repair: " + self.repair())
        return "\n".join(lines)


def rerun_command(manifest: dict, root) -> str:
    """The store's ``zoo generate`` command as its manifest records it, writing into ``root``."""
    argv = manifest.get("command")
    if not argv:
        g = manifest.get("generation") or {}
        settings = ", ".join(f"{k} {v}" for k, v in g.items() if k in ("kind", "dataset", "limit", "seed", "chunk_size"))
        return (f"the `zoo generate` command that made it ({settings}; manifest `generation` lists every "
                f"setting) with --out {root}")
    argv = list(argv)
    if "--out" in argv:
        argv[argv.index("--out") + 1] = str(root)
    return shlex.join(argv)


def verify_store(root, *, recompute_stats: bool = True, moments: bool = False, progress: bool = False,
                 max_memory: int | None = None) -> Verification:
    """Check the store at ``root`` (a folder or a URL). ``moments``: keep every intact train
    chunk's moments (a resumed generation reduces its statistics from them). ``max_memory``: refuse
    (ValueError, one line) a budget below what checking one chunk holds (:func:`memory_needs`)."""
    root = store_root(root)
    try:
        manifest = read_manifest(root)
    except DamagedStoreError as exc:
        return Verification(root, None, [Problem("manifest", str(exc))])
    if max_memory is not None:
        require_memory("--max-memory", max_memory, memory_needs(manifest, recompute_stats or moments),
                       f"verifying {root.name}")
    found = Verification(root, manifest)
    status = manifest.get("status")
    found.checked.append(("store", f"{root} ({manifest['format']} v{manifest['format_version']}, {status}, "
                                   f"{manifest['num_networks']} networks in {manifest['num_chunks']} chunks)"))
    found.checked.append(("manifest", "checksum ok (crc32c)" if "checksum" in manifest else
                          "readable (no checksum: written before format v2)"))
    _check_layout(manifest, found)
    _check_metadata(root, manifest, found)
    try:
        store = WeightStore(root, require_complete=False, check_chunks=False)
    except StoreError as exc:
        found.problems.append(Problem("metadata", f"the Zarr arrays cannot be opened: {exc}"))
        return found
    complete = status == STATUS_COMPLETE
    keep_moments = moments or (recompute_stats and complete)
    fragments = _check_chunks(store, found, keep_moments, progress)
    if complete:
        _check_table(store, fragments, found)
        _check_stats(store, found, recompute_stats)
        _check_identity(root, manifest, found)
    else:
        missing = missing_chunks(manifest)
        found.problems.append(Problem("incomplete", f"{len(missing)} of {manifest['num_chunks']} chunks are "
                                                    f"not written yet (an interrupted or running generation)"))
    if not moments:
        found.moments = {}
    return found


# A chunk is checked alone: its files' bytes, the values read from them in place, and for a train
# chunk whose moments are computed (stats.Moments.of) a float64 copy of all its values plus
# float64 temporaries of its largest array: ~5 chunks measured on classifier-sized chunks
# (benchmarks/window_memory.py --commands), counted as 6; ~1 without the moments, counted as 2.
CHUNK_COPIES, MOMENTS_COPIES = 2, 6


def memory_needs(manifest: dict, moments: bool) -> dict[str, int]:
    """What verifying a store holds at once, by part: the runtime and one chunk (its moments too:
    the networks table and the fragments' rows are small beside it)."""
    chunk = 4 * manifest["chunk_size"] * values_per_network(manifest)
    copies = MOMENTS_COPIES if moments else CHUNK_COPIES
    return {"the runtime": RUNTIME_BYTES, f"one chunk checked{' with its moments' if moments else ''}": copies * chunk}


def _check_layout(manifest: dict, found: Verification) -> None:
    n, size = manifest["num_networks"], manifest["chunk_size"]
    if manifest["num_chunks"] != math.ceil(n / size):
        found.problems.append(Problem("manifest", f"{MANIFEST}: {manifest['num_chunks']} chunks listed, but "
                                                  f"{n} networks in chunks of {size} make {math.ceil(n / size)}"))
    start = 0
    for split, s in manifest["splits"].items():
        if s["start"] != start:
            found.problems.append(Problem("manifest", f"{MANIFEST}: split {split} starts at {s['start']}, "
                                                      f"expected {start}"))
        start = s["start"] + s["count"]
    if start != n:
        found.problems.append(Problem("manifest", f"{MANIFEST}: the splits cover {start} networks, not {n}"))


def _check_metadata(root, manifest: dict, found: Verification) -> None:
    """The ``zarr.json`` files against the checksums the manifest records (format v2)."""
    names = [name for name in manifest.get("checksums", {}).get("files", {}) if name.endswith("zarr.json")]
    if not names:
        return
    bad = 0
    for name, data in zip(names, read_files([root / name for name in names])):
        if data is None or crc32c(data) != manifest["checksums"]["files"][name]:
            bad += 1
            found.problems.append(Problem("metadata", f"{name} is {'missing' if data is None else 'changed'} "
                                                      f"(crc32c recorded in {MANIFEST})"))
    found.checked.append(("metadata", f"{len(names) - bad} of {len(names)} zarr.json files ok (crc32c)"))


def _check_chunks(store: WeightStore, found: Verification, keep_moments: bool, progress: bool) -> dict[int, pa.Table]:
    """Every finished chunk's files and fragment; returns the readable fragments' rows."""
    manifest = store.manifest
    first_not_train = train_stop(manifest)
    chunks = sorted(manifest["complete_chunks"]) if manifest["status"] != STATUS_COMPLETE else range(manifest["num_chunks"])
    fragments, files, read_bytes, bad = {}, 0, 0, set()
    for c in tqdm(chunks, desc="verifying chunks", unit="chunk", disable=not progress, leave=False):
        lo, hi = chunk_bounds(manifest, c)
        what = f"chunk {c} (networks {lo}..{hi - 1})"
        arrays = [store.parameter_arrays[name] for name in store.parameter_names]
        paths = [store.zarr_root / name / chunk_key(arr, c) for name, arr in zip(store.parameter_names, arrays)]
        blobs = read_files(paths + [store.root / fragment_name(c)])
        values, reasons = {}, []
        for name, arr, blob in zip(store.parameter_names, arrays, blobs):
            files += 1
            read_bytes += len(blob or b"")
            value, why = _chunk_values(store, name, arr, c, lo, hi, blob)
            if why:
                reasons.append(why)
            else:
                values[name] = value
        rows, why = _fragment(store, c, lo, hi, blobs[-1])
        if why:
            reasons.append(why)
        else:
            fragments[c] = rows
        for why in reasons:
            found.problems.append(Problem("chunk", f"{what}: {why}", c))
        if reasons:
            bad.add(c)
        elif keep_moments and lo < first_not_train:
            found.moments[c] = chunk_train_moments(values, lo, first_not_train, row_status(rows, lo, hi))
    found.checked.append(("chunks", f"{len(chunks) - len(bad)} of {len(chunks)} ok: {files} chunk files, "
                                    f"{read_bytes / 2**20:.1f} MiB read, "
                                    f"{'crc32c' if manifest['format_version'] >= 2 else 'sizes and NaN (v1: no checksums)'}; "
                                    f"{len(fragments)} fragments ok"))
    return fragments


def _chunk_values(store, name, arr, chunk, lo, hi, blob) -> tuple[np.ndarray | None, str | None]:
    """The values of one chunk file and ``None``, or ``None`` and what is wrong with it."""
    file = store.chunk_file(name, chunk)
    if blob is None:
        return None, f"{file} is missing"
    layout = raw_layout(arr)
    if layout is None:  # not a layout this project writes: let zarr decode it
        try:
            values = arr[lo:hi]
        except Exception as exc:  # noqa: BLE001 - any failure is damage here
            return None, f"{file} cannot be decoded ({exc})"
    else:
        size, checksummed = layout
        if len(blob) != size:
            return None, f"{file} has {len(blob)} bytes instead of {size}"
        if checksummed and not chunk_checksum_ok(blob):
            return None, f"{file} fails its crc32c checksum"
        values = np.frombuffer(blob, np.dtype(arr.dtype).newbyteorder("<"),
                               count=math.prod(arr.chunks)).reshape(arr.chunks)[: hi - lo]
    if np.isnan(values).any():
        return None, f"{file} holds NaN (writers refuse NaN: it was overwritten)"
    return values, None


def _fragment(store, chunk, lo, hi, data) -> tuple[pa.Table | None, str | None]:
    name = fragment_name(chunk)
    if data is None:
        return None, f"{name} is missing"
    expected = store.manifest.get("checksums", {}).get("files", {}).get(name)
    if expected is not None and crc32c(data) != expected:
        return None, f"{name} fails its crc32c checksum"
    try:
        rows = pq.read_table(pa.BufferReader(data))
    except Exception as exc:  # noqa: BLE001 - unreadable is damage
        return None, f"{name} cannot be read ({exc})"
    if not np.array_equal(rows.column("index").to_numpy(), np.arange(lo, hi)):
        return None, f"{name} does not hold exactly the rows of networks {lo}..{hi - 1}"
    return rows, None


def _check_table(store: WeightStore, fragments: dict[int, pa.Table], found: Verification) -> None:
    manifest, path = store.manifest, store.root / NETWORKS_TABLE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = None
    expected = manifest.get("checksums", {}).get("files", {}).get(NETWORKS_TABLE)
    why, table = None, None
    if data is None:
        why = f"{NETWORKS_TABLE} is missing"
    elif expected is not None and crc32c(data) != expected:
        why = f"{NETWORKS_TABLE} fails its crc32c checksum"
    else:
        try:
            table = pq.read_table(pa.BufferReader(data))
        except Exception as exc:  # noqa: BLE001
            why = f"{NETWORKS_TABLE} cannot be read ({exc})"
    if table is not None:
        why = _table_disagrees(table, manifest, fragments)
    if why:
        found.problems.append(Problem("table", why))
        return
    found.checked.append(("table", f"{NETWORKS_TABLE} ok ({table.num_rows} rows"
                                   f"{', crc32c' if expected else ''}; splits as the manifest says"
                                   f"{'; equal to the fragments' if len(fragments) == manifest['num_chunks'] else ''})"))


def _table_disagrees(table: pa.Table, manifest: dict, fragments: dict[int, pa.Table]) -> str | None:
    n = manifest["num_networks"]
    if table.num_rows != n or not np.array_equal(table.column("index").to_numpy(), np.arange(n)):
        return f"{NETWORKS_TABLE} does not hold exactly one row per network in order ({table.num_rows} rows, {n} networks)"
    split = np.asarray(table.column("split").to_pylist(), dtype=object)
    for name, s in manifest["splits"].items():
        if (split[s["start"]: s["start"] + s["count"]] != name).any():
            return f"{NETWORKS_TABLE}: rows {s['start']}..{s['start'] + s['count'] - 1} are not all in split {name}"
    if len(fragments) == manifest["num_chunks"]:
        merged = pa.concat_tables([fragments[c] for c in sorted(fragments)], promote_options="default")
        if not _same_rows(merged, table):
            return f"{NETWORKS_TABLE} differs from the rows in {FRAGMENTS_DIR}/"
    return None


def _same_rows(a: pa.Table, b: pa.Table) -> bool:
    """Equal columns, NaN equal to NaN (Arrow's ``equals`` says NaN differs from itself)."""
    if a.schema.remove_metadata() != b.schema.remove_metadata():
        return False
    for name in a.column_names:
        x, y = a.column(name).combine_chunks(), b.column(name).combine_chunks()
        if pa.types.is_floating(x.type):
            if not (x.is_null().equals(y.is_null()) and np.array_equal(
                    x.to_numpy(zero_copy_only=False), y.to_numpy(zero_copy_only=False), equal_nan=True)):
                return False
        elif not x.equals(y):
            return False
    return True


def _check_stats(store: WeightStore, found: Verification, recompute: bool) -> None:
    try:
        stored = store.stats()
    except StoreError as exc:
        found.problems.append(Problem("statistics", str(exc)))
        return
    chunks = train_chunks(store.manifest)
    if not recompute:
        found.checked.append(("statistics", f"{2 * len(stored)} arrays ok (not recomputed)"))
        return
    if any(c not in found.moments for c in chunks):
        found.checked.append(("statistics", f"{2 * len(stored)} arrays readable; not recomputed: train chunks are damaged"))
        return
    moments, _ = reduce_moments([found.moments[c] for c in chunks])
    std = moments.std()
    worst = 0.0
    for name, (mean, sd) in stored.items():
        scale = np.maximum(std[name], STD_FLOOR)
        for stat, have, want in (("mean", mean, moments.mean[name]), ("std", sd, np.maximum(std[name], STD_FLOOR))):
            want = want.astype(np.float32)  # as stored
            diff = np.abs(have.astype(np.float64) - want)
            worst = max(worst, float(np.max(diff / scale)))
            # equal up to float32 rounding (a store reduced in another order), or to 1e-5 of the spread
            wrong = (diff > 2 * np.spacing(np.abs(want)).astype(np.float64)) & (diff > 1e-5 * scale)
            if wrong.any():
                found.problems.append(Problem("statistics", f"statistic {name}_{stat} differs from the one "
                                                            f"recomputed from the train networks in "
                                                            f"{int(wrong.sum())} entries (by up to "
                                                            f"{float(np.max(diff / scale)):.3g} std)"))
    count = (store.manifest.get("normalization") or {}).get("count")
    if count is not None and count != moments.count:
        found.problems.append(Problem("statistics", f"the statistics count {count} train networks; the store "
                                                    f"has {moments.count} that count"))
    found.checked.append(("statistics", f"{2 * len(stored)} arrays ok; recomputed over {moments.count} train "
                                        f"networks: largest difference {worst:.2g} std"))


def _check_identity(root, manifest: dict, found: Verification) -> None:
    """The content ID recomputed from the checksums (:mod:`.identity`) against the recorded one. Checked
    once everything else is intact: a damaged chunk or file changes it too, and is named above."""
    recorded = manifest.get(ID_KEY)
    if recorded is None:
        found.checked.append(("identity", "no content ID recorded (made before content IDs, 2026-11-27, or "
                                          "format v1)"))
        return
    if found.problems:
        found.checked.append(("identity", f"{recorded} not recomputed: the store is damaged"))
        return
    try:
        computed = content_id(root, manifest)
    except (StoreError, OSError) as exc:
        found.problems.append(Problem("manifest", f"content ID cannot be recomputed ({exc})"))
        return
    if computed != recorded:
        found.problems.append(Problem("manifest", f"{MANIFEST}: content ID {recorded} does not match the one "
                                                  f"recomputed from the store's checksums ({computed}): the manifest "
                                                  f"or the files changed after the store was finished; the store is "
                                                  f"damaged"))
        return
    found.checked.append(("identity", f"content ID {recorded} ok (recomputed from the checksums)"))
