"""Index bookkeeping for the weight space: which axes of each tensor the group permutes.

Every weight-space tensor is indexed by *layer indices* ``0..M`` of the input MLP: ``W_m`` (paper
numbering, ``m = 1..M``) carries ``(m, m-1)`` (rows, columns) and ``b_m`` carries ``(m,)``. Indices
``1..M-1`` are *set* indices (hidden neurons, permuted by the group); ``0`` and ``M`` are *free*
(input/output neurons, never permuted). The paper's Section 5 rules then say, for a block
``U_j -> U_i``: keep-or-pool each *shared* set index (2 choices, the DeepSets/Hartford terms), pool
unshared input set indices, broadcast unshared output set indices, and map the free indices (together
with the channels) by an arbitrary linear map. Grouping those terms by the set of set indices
that survive pooling (``kept``) is what lets one matmul serve many blocks at once; this module
computes that grouping for any depth ``M >= 2``, so the small-``M`` cases where blocks merge (e.g.
the footnoted ``M = 2`` case) need no special code.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from math import prod
from typing import Sequence


@dataclass(frozen=True)
class Slot:
    """One weight-space tensor: ``W_m`` (``kind == "weight"``) or ``b_m`` (``kind == "bias"``)."""

    kind: str
    layer: int  # paper's m (1-based); position in WeightSpace.weights / .biases is layer - 1
    axes: tuple[int, ...]  # layer indices of the tensor's axes after the batch axis, in order
    set_axes: tuple[int, ...]  # the permuted ones, descending (the order used for kept axes)
    free_axes: tuple[int, ...]  # the unpermuted ones (0 and/or M), in tensor order
    free_size: int  # product of the free axes' sizes

    @property
    def name(self) -> str:
        return f"{'W' if self.kind == 'weight' else 'b'}{self.layer}"


def make_slots(widths: Sequence[int]) -> tuple[Slot, ...]:
    """All ``2M`` tensors of a weight space with widths ``(d_0, ..., d_M)``: weights then biases."""
    M = len(widths) - 1
    if M < 2:
        raise ValueError(f"need an MLP with at least 2 layers (M >= 2), got widths {tuple(widths)}")
    if any(int(d) < 1 for d in widths):
        raise ValueError(f"all widths must be positive, got {tuple(widths)}")

    def slot(kind: str, m: int, axes: tuple[int, ...]) -> Slot:
        set_axes = tuple(sorted((a for a in axes if 0 < a < M), reverse=True))
        free_axes = tuple(a for a in axes if a in (0, M))
        return Slot(kind, m, axes, set_axes, free_axes, prod(widths[a] for a in free_axes))

    weights = [slot("weight", m, (m, m - 1)) for m in range(1, M + 1)]
    biases = [slot("bias", m, (m,)) for m in range(1, M + 1)]
    return tuple(weights + biases)


@dataclass(frozen=True)
class PoolGroup:
    """All blocks whose terms keep exactly the set indices ``kept``.

    Each member slot contributes its input pooled down to ``[B, *kept sizes, free_size * C_in]``;
    the concatenation is mapped by one linear map to ``[B, *kept sizes, sum(free_size) * C_out]`` and
    each member's slice is broadcast back over that member's other set indices. A block
    ``s -> t`` therefore owns the ``(s, t)`` sub-matrix of every group containing both.
    """

    kept: tuple[int, ...]  # descending layer indices
    members: tuple[Slot, ...]


def make_groups(classes: Sequence[Sequence[Slot]]) -> tuple[PoolGroup, ...]:
    """One group per (class, kept set) where ``kept`` is a subset of some member's set indices.

    ``classes`` partitions the slots that interact (see :mod:`dws.nn.blocks`); blocks only connect
    slots within a class. With a single class of all slots, this is the full DWS layer.
    """
    groups = []
    for members in classes:
        kept_sets = sorted(
            {tuple(k) for s in members for r in range(len(s.set_axes) + 1) for k in combinations(s.set_axes, r)},
            key=lambda k: (len(k), [-a for a in k]),
        )
        for kept in kept_sets:
            in_group = tuple(s for s in members if set(kept) <= set(s.set_axes))
            groups.append(PoolGroup(kept, in_group))
    return tuple(groups)
