"""The POOL operation of the paper, with selectable aggregation and scale normalization.

The paper's POOL is a sum, but sums of post-ReLU features grow with the set size (even a
``1/sqrt(n)`` scaling compounds to overflow in a 10-layer stack), so ``"sum"`` is normalized by the
set size. Since the widths are fixed per layer, that makes it numerically the same map as
``"mean"``; both names are accepted. ``"max"`` (the paper's experimental choice) needs no scaling.
All compose: pooling two axes one after the other equals pooling both at once, which
:class:`PooledInputs` uses to reuse partial pools.
"""

from __future__ import annotations

from typing import Mapping

import torch

from dws.nn.layout import to_features
from dws.nn.structure import Slot

Tensor = torch.Tensor
POOL_CHOICES = ("max", "mean", "sum")


def check_pool(pool: str) -> str:
    if pool not in POOL_CHOICES:
        raise ValueError(f"pool must be one of {POOL_CHOICES}, got {pool!r}")
    return pool


def reduce(x: Tensor, dims: tuple[int, ...], pool: str) -> Tensor:
    """Pool ``x`` over ``dims`` (dropping them)."""
    if not dims:
        return x
    if pool == "max":
        return x.amax(dim=dims)
    return x.mean(dim=dims)  # "mean", and "sum" normalized by the set size


def remaining_axes(slot: Slot, kept: tuple[int, ...]) -> list[int]:
    """Axes of ``slot`` (in tensor order) that survive pooling down to ``kept``."""
    return [a for a in slot.axes if a in kept or a in slot.free_axes]


class PooledInputs:
    """Pooled versions of one layer input, computed lazily and shared by all groups.

    ``pooled(slot, kept)`` pools a slot over its set axes not in ``kept`` by removing one axis from
    the cached pool that still has it, so e.g. the full pool of a hidden weight matrix costs one pass
    over its row pool instead of one over the whole matrix.
    """

    def __init__(self, tensors: Mapping[Slot, Tensor], pool: str):
        self.tensors = tensors
        self.pool = pool
        self._pooled: dict[tuple[Slot, tuple[int, ...]], Tensor] = {}
        self._features: dict[tuple[Slot, tuple[int, ...]], Tensor] = {}

    def pool_axis(self, x: Tensor, dim: int) -> Tensor:
        """``x`` pooled over its axis ``dim`` (batch axis 0)."""
        return reduce(x, (dim,), self.pool)

    def pooled(self, slot: Slot, kept: tuple[int, ...]) -> Tensor:
        """The slot's tensor pooled over its set axes not in ``kept`` (its other axes in order, then C)."""
        key = (slot, kept)
        if key not in self._pooled:
            dropped = [a for a in slot.set_axes if a not in kept]
            if not dropped:
                self._pooled[key] = self.tensors[slot]
            else:
                axis = dropped[0]
                parent_kept = tuple(sorted(set(kept) | {axis}, reverse=True))
                parent = self.pooled(slot, parent_kept)
                self._pooled[key] = self.pool_axis(parent, 1 + remaining_axes(slot, parent_kept).index(axis))
        return self._pooled[key]

    def features(self, slot: Slot, kept: tuple[int, ...]) -> Tensor:
        """``[B, *kept sizes, free_size * C]``: the slot pooled to ``kept``, free axes in features."""
        key = (slot, kept)
        if key not in self._features:
            self._features[key] = to_features(self.pooled(slot, kept), slot, kept)
        return self._features[key]
