"""What the ``zoo info`` and ``zoo show`` views of every zoo family share: percentile lines, counts."""

from __future__ import annotations

import numpy as np

from ..store.card import percentiles  # noqa: F401  (one definition, shared with the dataset card)


def shown(count: int, available: int, what: str, log) -> int:
    """``count`` capped at the ``available`` networks or runs, saying so when it is."""
    if count > available:
        log(f"note: the store has {available} {what}: drawing all of them, not {count}")
    return min(count, available)
