"""``zoo info`` on a store that is still being generated, or was interrupted: how far it got.

Read from the manifest (chunks written, the planned splits) and the row fragments of the chunks
written so far, so it works while a generation is running; nothing is opened for writing.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..options import plural
from ..store.format import SPLITS, fragment_name
from ..store.location import UrlRoot
from ..store.reader import WeightStore
from ..store.writer import chunk_bounds
from .format import head_lines, percentiles, widths_text


def progress_summary(store: WeightStore) -> str:
    """The summary of an unfinished store (opened with ``require_complete=False``)."""
    m = store.manifest
    done = sorted(m["complete_chunks"])
    made = np.zeros(m["num_networks"], bool)
    for c in done:
        made[slice(*chunk_bounds(m, c))] = True
    total, count = m["num_networks"], int(made.sum())
    left = m["num_chunks"] - len(done)
    is_classifier = m.get("architecture", {}).get("family") == "mlp-classifier"
    column, label, digits = ("test_accuracy", "test acc", 3) if is_classifier else ("psnr", "psnr (dB)", 2)
    values = _finished_values(store, done, column)
    lines = [
        *head_lines(store, ": being generated, or interrupted"),
        f"source     {m['source'].get('source')}",
        f"arch       {widths_text(m['architecture'])}",
        f"progress   {len(done)} of {m['num_chunks']} chunks written: {count} of {total} networks "
        f"({100 * count / max(total, 1):.1f}%)",
        "splits     " + ", ".join(f"{s} {int(made[_split_slice(m, s)].sum())}/{m['splits'][s]['count']}"
                                  for s in SPLITS if s in m["splits"]),
        f"{label:<10} " + percentiles(values, digits) + "  (networks written so far)",
        f"left       {plural(left, 'chunk')}, {plural(total - count, 'network')}, then the rows table and the "
        f"statistics; "
        f"{_last_write(store)}",
        "           rerun the same `zoo generate` command to finish it (it makes only what is left); "
        "training and `zoo show` need the finished store",
    ]
    return "\n".join(lines)


def _split_slice(manifest: dict, split: str) -> slice:
    s = manifest["splits"][split]
    return slice(s["start"], s["start"] + s["count"])


def _finished_values(store: WeightStore, chunks: list[int], column: str) -> np.ndarray:
    """``column`` of the rows of the written chunks (their fragments), without nulls."""
    parts = []
    for c in chunks:
        path = store.root / fragment_name(c)
        source = path if not isinstance(path, UrlRoot) else pa.BufferReader(path.read_bytes())
        table = pq.read_table(source, columns=[column])
        parts.append(table.column(column).to_numpy(zero_copy_only=False).astype(np.float64))
    values = np.concatenate(parts) if parts else np.zeros(0)
    return values[~np.isnan(values)]


def _last_write(store: WeightStore) -> str:
    """When the manifest last changed (a chunk written), as "last chunk written 3 min ago"."""
    m = store.manifest
    if isinstance(store.root, UrlRoot):
        return f"started {m.get('created', '?')}"
    age = time.time() - (store.root / "manifest.json").stat().st_mtime
    started = datetime.fromisoformat(m["created"]).astimezone(timezone.utc) if "created" in m else None
    since = f" (started {started:%Y-%m-%d %H:%M} UTC)" if started else ""
    return f"manifest last written {_ago(age)} ago{since}"


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
