"""Match a baseline's capacity to a target parameter count by choosing its hidden width.

The paper compares architectures at equal capacity ("feature dimensions chosen to match the
number of parameters" of the DWSNet), so every baseline is sized through this one search.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn


def count_params(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def size_to_params(
    factory: Callable[..., nn.Module],
    target_params: int,
    width_arg: str = "hidden",
    lo: int = 1,
    hi: int = 1 << 16,
    multiple_of: int = 1,
    rtol: float | None = None,
) -> tuple[nn.Module, int]:
    """The model ``factory(**{width_arg: w})`` whose parameter count is closest to
    ``target_params`` over widths ``w`` in ``[lo, hi]`` that are multiples of ``multiple_of``;
    returns it and its count.

    Assumes the count does not decrease with the width. Candidates are built on the ``meta`` device
    (no memory), with a doubling search so that ``hi`` is never built unless needed; only the
    chosen model is built for real. With ``rtol``, a relative miss above it raises ``ValueError``.
    """
    if target_params < 1:
        raise ValueError(f"target_params must be positive, got {target_params}")
    units_lo, units_hi = -(-lo // multiple_of), hi // multiple_of
    if units_lo > units_hi:
        raise ValueError(f"no multiple of {multiple_of} in [{lo}, {hi}]")
    counts: dict[int, int] = {}

    def count(units: int) -> int:
        if units not in counts:
            with torch.device("meta"):
                counts[units] = count_params(factory(**{width_arg: units * multiple_of}))
        return counts[units]

    # doubling search for a width reaching the target, then bisection for the first such width
    a, b = units_lo, units_lo
    while count(b) < target_params and b < units_hi:
        a, b = b + 1, min(max(2 * b, b + 1), units_hi)
    while a < b:
        mid = (a + b) // 2
        a, b = (mid + 1, b) if count(mid) < target_params else (a, mid)
    candidates = [u for u in (a - 1, a) if units_lo <= u <= units_hi]
    best = min(candidates, key=lambda u: abs(count(u) - target_params))
    miss = abs(count(best) - target_params) / target_params
    if rtol is not None and miss > rtol:
        if best == units_lo and count(best) > target_params:  # no width is small enough
            raise ValueError(
                f"even the smallest size ({width_arg}={best * multiple_of}) has {count(best):,} parameters, "
                f"{miss:.0%} over the target {target_params:,} (allowed {rtol:.0%}): this architecture cannot be "
                f"made that small")
        raise ValueError(
            f"closest size has {count(best):,} parameters ({width_arg}={best * multiple_of}), "
            f"{miss:.0%} away from the target {target_params:,} (allowed {rtol:.0%})"
        )
    model = factory(**{width_arg: best * multiple_of})
    return model, count_params(model)
