"""Which parts of two zoos differ, from their checksums alone: parameters, statistics, table or metadata.

Two stores made by the same command can differ (another machine's floating point, another package
version); their content IDs then differ and say nothing more. The per-file checksums the ID hashes
(``identity.checksum_entries``) say which files differ, and so whether the networks themselves differ or
only what was computed from them. A *checksum record* (``zoo checksums``) is those entries saved as JSON
with the command, software and machine that made the store, so that a store can be compared
(``zoo compare``) with one that is no longer there.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from .format import STATS_GROUP, STATUS_COMPLETE, StoreError
from .identity import KEY as ID_KEY
from .identity import checksum_entries, column_digests, networks_id_of, short

RECORD_VERSION = 1
PARTS = ("parameters", "statistics", "table", "metadata")


def part_of(path: str) -> str:
    """The part of a store a checksummed path belongs to (one of ``PARTS``)."""
    if path.endswith("zarr.json") or path.startswith("manifest.json"):
        return "metadata"
    if path.endswith(".parquet"):
        return "table"
    if f"/{STATS_GROUP}/" in f"/{path}":
        return "statistics"
    return "parameters"


def _chunk_row(path: str) -> int | None:
    """The store chunk a file holds: a parameter chunk ``.../c/<row>/...`` (rows along the network axis)
    or a table fragment ``fragments/chunk-<row>.parquet``; ``None`` for the rest."""
    found = re.search(r"/c/(\d+)(/|$)", path) if part_of(path) == "parameters" else re.search(
        r"chunk-(\d+)\.parquet$", path)
    return int(found.group(1)) if found else None


@dataclass
class Side:
    """One side of a comparison: where it came from, its content ID, its entries, the machine that wrote it."""

    label: str
    content_id: str | None
    entries: dict[str, str]
    made_on: dict = field(default_factory=dict)
    manifest: dict = field(default_factory=dict, repr=False)
    #: for a store still being generated: its chunks finished so far (``None``: all of it is finished)
    finished_chunks: set[int] | None = None
    networks_id: str | None = None
    #: ``{column: sha256}`` of the networks table's values (``identity.column_digests``; None: unknown)
    columns: dict[str, str] | None = None

    def holds(self, path: str) -> bool:
        """Whether ``path`` is written for good: every file of a finished store; of an unfinished one, the
        chunks and fragments of its finished chunks and the metadata it has (statistics, table and
        content ID come at the end)."""
        if self.finished_chunks is None:
            return True
        row = _chunk_row(path)
        return row in self.finished_chunks if row is not None else (part_of(path) == "metadata"
                                                                    and path in self.entries)


@dataclass
class Comparison:
    """Per part: paths equal, differing, and present on one side only."""

    a: Side
    b: Side
    equal: dict[str, list[str]]
    differ: dict[str, list[str]]
    only_a: dict[str, list[str]]
    only_b: dict[str, list[str]]
    #: files left out because a side is unfinished and has not written them yet
    not_compared: int = 0

    @property
    def identical(self) -> bool:
        return not self.differing_parts()

    def differing_parts(self) -> list[str]:
        return [p for p in PARTS if self.differ[p] or self.only_a[p] or self.only_b[p]]

    def summary(self, examples: int = 3) -> str:
        lines = [f"A: {self.a.label}  {self.a.content_id or '(no content ID)'}{_made_on(self.a.made_on)}",
                 f"B: {self.b.label}  {self.b.content_id or '(no content ID)'}{_made_on(self.b.made_on)}"]
        for part in PARTS:
            counts = {"equal": self.equal[part], "differ": self.differ[part], "only in A": self.only_a[part],
                      "only in B": self.only_b[part]}
            total = sum(map(len, counts.values()))
            if not total:
                continue
            words = [f"{len(paths)} {word}" for word, paths in counts.items() if paths or word == "equal"]
            lines.append(f"{part:<11} {total:>5} files: {', '.join(words)}")
            if part == "parameters" and self.differ[part] and not self.chunked_differently:
                rows = sorted({r for r in map(_chunk_row, self.differ[part]) if r is not None})
                every = sorted({r for r in map(_chunk_row, self.differ[part] + self.equal[part]) if r is not None})
                lines.append(f"{'':<11} chunks that differ: {_ranges(rows)} (of {len(every)})")
            if part == "table" and self.differ[part] and self.a.columns and self.b.columns:
                columns = sorted(c for c in set(self.a.columns) | set(self.b.columns)
                                 if self.a.columns.get(c) != self.b.columns.get(c))
                lines.append(f"{'':<11} columns that differ: {', '.join(columns) or 'none (the same values)'}")
            shown = (self.differ[part] + self.only_a[part] + self.only_b[part])[:examples]
            if shown:
                lines.append(f"{'':<11} e.g. {', '.join(shown)}")
        for name, one in (("A", self.a), ("B", self.b)):
            if one.finished_chunks is not None:
                lines.append(f"{name} is unfinished: only its {len(one.finished_chunks)} finished chunk(s) and "
                             f"its metadata are compared ({self.not_compared} files left out)")
        if self.identical and self.not_compared:
            lines.append("equal so far: every file compared is equal")
        elif self.identical:
            lines.append("identical: every checksummed file is equal")
        else:
            lines.append(f"different: {', '.join(self.differing_parts())} ({self._networks_verdict()})")
        if self.a.networks_id and self.b.networks_id:
            same = self.a.networks_id == self.b.networks_id
            lines.append("networks ID: " + ("equal: what training reads (networks, statistics, targets, splits) is "
                                            "the same" if same else f"differs ({short(self.a.networks_id)} vs "
                                                                    f"{short(self.b.networks_id)})"
                                            + ("; it hashes chunk files, so stores chunked differently never share "
                                               "one" if self.chunked_differently else "")))
        return "\n".join(lines)

    @property
    def chunked_differently(self) -> bool:
        """Whether the two sides cut their networks into chunks of different sizes (where both manifests say),
        so that no parameter file of one can match one of the other, equal networks or not."""
        sizes = {one.manifest.get("chunk_size") for one in (self.a, self.b)}
        return None not in sizes and len(sizes) == 2

    def _networks_verdict(self) -> str:
        if "parameters" not in self.differing_parts():
            return "the networks are equal"
        if self.chunked_differently:
            return (f"checksums cannot tell whether the networks differ: A is cut into chunks of "
                    f"{self.a.manifest['chunk_size']} networks, B into chunks of {self.b.manifest['chunk_size']}; "
                    f"`zoo compare --values` decodes and compares them")
        if self.only_a["parameters"] or self.only_b["parameters"]:
            return ("the networks differ, or are cut into chunks differently: `zoo compare --values` of two stores "
                    "decodes and compares them")
        return "the networks differ"


def _made_on(made_on: dict) -> str:
    """``"\n   written on AMD EPYC (family 26, model 2; avx2, fma)"``, or nothing where unrecorded."""
    cpu = made_on.get("cpu") or {}
    if not cpu:
        return ""
    details = ", ".join(f"{k.removeprefix('cpu ')} {cpu[k]}" for k in ("cpu family", "model") if k in cpu)
    if cpu.get("flags"):
        details += "; " + ", ".join(cpu["flags"])
    name = cpu.get("model name") or cpu.get("machine", "an unnamed CPU")
    return f"\n   written on {name}" + (f" ({details})" if details else "")


def _ranges(values: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    spans, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            spans.append(f"{start}" if start == v else f"{start}-{v}")
            start = None
    return ", ".join(spans) or "none"


def compare(a: Side, b: Side) -> Comparison:
    buckets = {name: {p: [] for p in PARTS} for name in ("equal", "differ", "only_a", "only_b")}
    not_compared = 0
    for path in sorted(set(a.entries) | set(b.entries)):
        if not (a.holds(path) and b.holds(path)):
            not_compared += 1
            continue
        if path not in b.entries:
            kind = "only_a"
        elif path not in a.entries:
            kind = "only_b"
        else:
            kind = "equal" if a.entries[path] == b.entries[path] else "differ"
        buckets[kind][part_of(path)].append(path)
    return Comparison(a, b, **buckets, not_compared=not_compared)


def record(store) -> dict:
    """A store's checksum record: content ID, entries, and what its manifest says made it (command,
    software, machine: the one that wrote it, where recorded; stores made before that say nothing)."""
    found = store_side(store)
    manifest = found.manifest
    return {"checksum_record": RECORD_VERSION, ID_KEY: found.content_id, "networks_id": found.networks_id,
            "created": manifest.get("created"), "recorded": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": manifest.get("command"), "software": manifest.get("software"),
            "machine": manifest.get("machine"), "columns": found.columns, "entries": found.entries}


def store_side(store) -> Side:
    from .reader import WeightStore

    opened = WeightStore(store, require_complete=False, check_chunks=False)
    entries = checksum_entries(opened.root, opened.manifest)
    if entries is None:
        raise StoreError(f"{store} has no chunk checksums (format v1): there is nothing to compare; remake it "
                         f"with this version to compare it")
    manifest = opened.manifest
    if manifest.get("status") != STATUS_COMPLETE:
        return Side(str(store), manifest.get(ID_KEY), entries, manifest.get("machine") or {}, manifest,
                    set(manifest.get("complete_chunks", [])))
    columns = column_digests(opened.root, manifest)  # the table read once, for both
    return Side(str(store), manifest.get(ID_KEY), entries, manifest.get("machine") or {}, manifest, None,
                networks_id_of(manifest, entries, columns), columns)


def record_side(path) -> Side:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise StoreError(f"{path} is not a readable checksum record ({exc})") from exc
    if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
        raise StoreError(f"{path} is not a checksum record: it has no \"entries\" (write one with "
                         f"`zoo checksums STORE > FILE`)")
    version = data.get("checksum_record", RECORD_VERSION)
    if not isinstance(version, int) or version > RECORD_VERSION:
        raise StoreError(f"{path} is a checksum record of version {version}, newer than this version reads "
                         f"({RECORD_VERSION}): upgrade weightzoo")
    # records written by hand before this module (session 23's) carry the CPU at the top level
    machine = data.get("machine") or ({"cpu": data["cpu"]} if isinstance(data.get("cpu"), dict) else {})
    return Side(str(path), data.get(ID_KEY), data["entries"], machine, networks_id=data.get("networks_id"),
                columns=data.get("columns"))


def side(what) -> Side:
    """A store (folder or URL) or a checksum record (a ``.json`` file)."""
    if str(what).endswith(".json") and Path(what).is_file():
        return record_side(what)
    return store_side(what)
