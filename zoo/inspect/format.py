"""What the ``zoo info`` and ``zoo show`` views of every zoo family share: the summary's first and last lines,
percentile lines, counts."""

from __future__ import annotations

import numpy as np

from ..store.card import percentiles  # noqa: F401  (one definition, shared with the dataset card)


def shown(count: int, available: int, what: str, log) -> int:
    """``count`` capped at the ``available`` networks or runs, saying so when it is."""
    if count > available:
        log(f"note: the store has {available} {what}: drawing all of them, not {count}")
    return min(count, available)


def head_lines(store, state: str = "") -> list[str]:
    """A summary's first lines: where the store is, its format and status (and ``state``, said after it),
    its kind."""
    m = store.manifest
    return [f"store      {store.root}  (format v{m['format_version']}, {m['status']}{state})",
            f"kind       {m['kind']}: {m.get('description', '')}"]


def widths_text(architecture: dict) -> str:
    """``784 -> 128 -> 10``."""
    return " -> ".join(map(str, architecture["widths"]))


def disk_line(store) -> str:
    return f"disk       {store.size_on_disk() / 2**20:.1f} MiB"
