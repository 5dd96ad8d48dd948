"""What the ``zoo info`` and ``zoo show`` views of every zoo family share: percentile lines, counts."""

from __future__ import annotations

import numpy as np


def percentiles(values: np.ndarray, digits: int) -> str:
    """``p5 .. p25 .. p50 .. p75 .. p95 ..  mean ..`` of ``values``, or ``none`` when there are none."""
    if len(values) == 0:
        return "none"
    quantiles = "  ".join(f"p{q} {np.percentile(values, q):.{digits}f}" for q in (5, 25, 50, 75, 95))
    return f"{quantiles}  mean {np.mean(values):.{digits}f}"


def shown(count: int, available: int, what: str, log) -> int:
    """``count`` capped at the ``available`` networks or runs, saying so when it is."""
    if count > available:
        log(f"note: the store has {available} {what}: drawing all of them, not {count}")
    return min(count, available)
