"""Moving between a slot's tensor layout and the ``[B, *kept, features]`` layout of a group.

Free axes (input/output neurons) are not permuted by the group, so every linear map may mix them
with the channels; flattening them into the feature axis turns each block into a plain matmul.
"""

from __future__ import annotations

import torch

from dws.nn.structure import Slot

Tensor = torch.Tensor


def to_features(x: Tensor, slot: Slot, kept: tuple[int, ...]) -> Tensor:
    """``x`` = slot pooled to ``kept`` (axes in slot order, then C) -> ``[B, *kept, free*C]``."""
    axes = [a for a in slot.axes if a in kept or a in slot.free_axes]
    order = [1 + axes.index(a) for a in kept] + [1 + axes.index(a) for a in slot.free_axes]
    if order != sorted(order):
        x = x.permute(0, *order, x.dim() - 1)
    if x.dim() == 2 + len(kept):  # no free axes: already [B, *kept, C]
        # (a no-op reshape would be a view: autograd then sums this input's gradients out of place)
        return x
    return x.reshape(*x.shape[: 1 + len(kept)], -1)


def from_features(y: Tensor, slot: Slot, kept: tuple[int, ...], widths) -> Tensor:
    """Inverse of :func:`to_features` for an output ``[B, *kept, free*C]``, as a view shaped like
    the slot with size-1 axes where it is to be broadcast (the set axes not in ``kept``)."""
    free_sizes = [widths[a] for a in slot.free_axes]
    if free_sizes:  # (no reshape otherwise: the result stays a fresh tensor, not a view)
        y = y.reshape(*y.shape[:-1], *free_sizes, -1)
    present = list(kept) + list(slot.free_axes)
    target = [a for a in slot.axes if a in present]
    order = [1 + present.index(a) for a in target]
    if order != sorted(order):
        y = y.permute(0, *order, y.dim() - 1)
    for pos, a in enumerate(slot.axes):
        if a not in present:
            y = y.unsqueeze(1 + pos)
    return y
