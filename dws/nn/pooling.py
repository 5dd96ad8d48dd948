"""The POOL operation of the paper, with selectable aggregation and scale normalization.

The paper's POOL is a sum, but sums of post-ReLU features grow with the set size (even a
``1/sqrt(n)`` scaling compounds to overflow in a 10-layer stack), so ``"sum"`` is normalized by the
set size. Since the widths are fixed per layer, that makes it numerically the same map as
``"mean"``; both names are accepted. ``"max"`` (the paper's experimental choice) needs no scaling.
All compose: pooling two axes one after the other equals pooling both at once, which
:class:`PooledInputs` uses to reuse partial pools.
"""

from __future__ import annotations

import functools
from math import prod
from typing import Iterable, Mapping

import torch

from dws.nn import native_pools
from dws.nn.layout import to_features
from dws.nn.structure import Slot

Tensor = torch.Tensor
POOL_CHOICES = ("max", "mean", "sum")


def check_pool(pool: str) -> str:
    if pool not in POOL_CHOICES:
        raise ValueError(f"pool must be one of {POOL_CHOICES}, got {pool!r}")
    return pool


class MaxOverDims(torch.autograd.Function):
    """``amax`` over one dim (or several, one dim each) of the same input, with the positions of the
    maxima kept for a sparse backward.

    ``MaxOverDims.apply(x, (d_1,), (d_2,), ...)`` returns one pooled tensor per dim, so all pools
    taken directly from one (large) tensor share a single autograd node. Each pool runs as a
    channels-last ``max_pool2d`` over a ``[outer, inner, L, 1]`` view of ``x`` (``L`` the pooled
    axis): PyTorch's ``amax`` over a middle axis with a short contiguous inner axis (the hidden
    weights' ``[B, d_m, d_{m-1}, C]`` pooled over ``d_{m-1}``) is about 3x slower, and the pooling
    kernel also returns the argmax. The backward then scatters each pooled gradient to its argmax
    in one zero-filled buffer: one pass instead of a comparison, a multiply and an add per pool.
    Each pooled entry sends its whole gradient to one maximal entry; exact ties between distinct
    entries have probability zero for real-valued features, and tied zeros after a ReLU get no
    gradient through the ReLU anyway.
    """

    @staticmethod
    def forward(ctx, x: Tensor, *dims_list: tuple[int, ...]):
        ctx.set_materialize_grads(False)
        ctx.native = native_pools.applies(x, None, dims_list)
        if ctx.native:  # one pass for both pools, and a backward without a separate zero fill
            outs = native_pools.forward(ctx, x, None, dims_list)
        else:
            outs, positions = max_pools(x, dims_list)
            ctx.save_for_backward(*positions)
        ctx.shape, ctx.dims_list = x.shape, dims_list
        return outs[0] if len(outs) == 1 else tuple(outs)

    @staticmethod
    def backward(ctx, *grads: Tensor | None):
        present = [g for g in grads if g is not None]
        if not present:
            return (None,) * (1 + len(ctx.dims_list))
        if ctx.native:
            return (native_pools.backward(ctx, None, grads)[0],) + (None,) * len(ctx.dims_list)
        out = present[0].new_zeros(ctx.shape)
        add_pool_grads_(out, ctx.saved_tensors, grads)
        return (out,) + (None,) * len(ctx.dims_list)


def max_pools(x: Tensor, dims_list) -> tuple[list[Tensor], list[Tensor]]:
    """``amax`` of ``x`` over each ``(dim,)`` of ``dims_list`` (no autograd), with the flat position
    in ``x`` of each maximum (for :func:`add_pool_grads_`)."""
    if any(len(dims) != 1 for dims in dims_list):
        raise ValueError(f"max pools are taken one dim at a time, got {dims_list}")
    outs, positions = [], []
    for (dim,) in dims_list:
        outer, length, inner = _split_at(x.shape, dim)
        view = x.reshape(outer, length, 1, inner).permute(0, 3, 1, 2)  # channels-last [outer, inner, L, 1]
        y, idx = torch.nn.functional.max_pool2d_with_indices(view, (length, 1))
        outs.append(y.reshape(*x.shape[:dim], *x.shape[dim + 1 :]))
        # flat position of each maximum in x: (o * L + idx) * inner + i
        positions.append(idx.view(outer, inner).mul(inner).add_(_flat_offsets(outer, length, inner, x.device)))
    return outs, positions


def add_pool_grads_(grad_x: Tensor, positions, grads) -> None:
    """Add each pooled gradient to its maximum's entry of ``grad_x`` (contiguous), in place."""
    flat = grad_x.view(-1)
    for pos, grad in zip(positions, grads):
        if grad is not None:
            flat.scatter_add_(0, pos.view(-1), grad.reshape(-1))  # (~35% faster than index_add_ here)


@functools.lru_cache(maxsize=32)
def _flat_offsets(outer: int, length: int, inner: int, device: torch.device) -> Tensor:
    """``o * L * inner + i`` for every pooled position ``(o, i)``: [outer, inner] int64 (cached)."""
    rows = torch.arange(outer, device=device).view(-1, 1) * (length * inner)
    return rows + torch.arange(inner, device=device)


def _split_at(shape, dim: int) -> tuple[int, int, int]:
    """``(prod(shape[:dim]), shape[dim], prod(shape[dim+1:]))``."""
    return prod(shape[:dim]), shape[dim], prod(shape[dim + 1 :])


def reduce(x: Tensor, dims: tuple[int, ...], pool: str) -> Tensor:
    """Pool ``x`` over ``dims`` (dropping them)."""
    if not dims:
        return x
    if pool == "max":
        for dim in sorted(dims, reverse=True):  # one axis at a time; max over both = max of maxes
            x = MaxOverDims.apply(x, (dim,))
        return x
    return x.mean(dim=dims)  # "mean", and "sum" normalized by the set size


def remaining_axes(slot: Slot, kept: tuple[int, ...]) -> list[int]:
    """Axes of ``slot`` (in tensor order) that survive pooling down to ``kept``."""
    return [a for a in slot.axes if a in kept or a in slot.free_axes]


class PooledInputs:
    """Pooled versions of one layer input, computed lazily and shared by all groups.

    ``native(slot, kept)`` pools a slot over its set axes not in ``kept`` by removing one axis from
    the cached pool that still has it, so e.g. the full pool of a hidden weight matrix costs one pass
    over its row pool instead of one over the whole matrix.
    """

    def __init__(self, tensors: Mapping[Slot, Tensor], pool: str):
        self.tensors = tensors
        self.pool = pool
        self._native: dict[tuple[Slot, tuple[int, ...]], Tensor] = {}
        self._features: dict[tuple[Slot, tuple[int, ...]], Tensor] = {}

    def native(self, slot: Slot, kept: tuple[int, ...]) -> Tensor:
        key = (slot, kept)
        if key not in self._native:
            dropped = [a for a in slot.set_axes if a not in kept]
            if not dropped:
                self._native[key] = self.tensors[slot]
            else:
                axis = dropped[0]
                parent_kept = tuple(sorted(set(kept) | {axis}, reverse=True))
                parent = self.native(slot, parent_kept)
                dim = 1 + remaining_axes(slot, parent_kept).index(axis)
                self._native[key] = reduce(parent, (dim,), self.pool)
        return self._native[key]

    def prefetch(self, direct: Mapping[Slot, Mapping[tuple[int, ...], int]]) -> None:
        """Compute, for max pooling, each slot's pools taken directly from its raw tensor (``direct``,
        from :func:`direct_pools`) in a single :class:`MaxOverDims` node (one backward buffer)."""
        if self.pool != "max":
            return
        for slot, pools in direct.items():
            todo = [k for k in pools if (slot, k) not in self._native]
            if len(todo) < 2:
                continue
            self.store(slot, todo, MaxOverDims.apply(self.tensors[slot], *((pools[k],) for k in todo)))

    def store(self, slot: Slot, kept_sets: Iterable[tuple[int, ...]], pools: Iterable[Tensor]) -> None:
        """Use ``pools`` (computed elsewhere) as ``slot`` pooled to each of ``kept_sets``."""
        for kept, y in zip(kept_sets, pools):
            self._native[(slot, kept)] = y

    def features(self, slot: Slot, kept: tuple[int, ...]) -> Tensor:
        """``[B, *kept sizes, free_size * C]``: the slot pooled to ``kept``, free axes in features."""
        key = (slot, kept)
        if key not in self._features:
            self._features[key] = to_features(self.native(slot, kept), slot, kept)
        return self._features[key]


def direct_pools(keys: Iterable[tuple[Slot, tuple[int, ...]]]) -> dict[Slot, dict[tuple[int, ...], int]]:
    """For pools ``(slot, kept)``, the single-axis pools of each raw slot tensor they are built
    from: ``{slot: {kept: dim}}`` (``dim`` the tensor axis pooled, batch axis 0)."""
    direct: dict[Slot, dict[tuple[int, ...], int]] = {}
    for slot, kept in keys:
        while True:
            dropped = [a for a in slot.set_axes if a not in kept]
            if len(dropped) <= 1:
                if dropped:
                    direct.setdefault(slot, {})[kept] = 1 + list(slot.axes).index(dropped[0])
                break
            kept = tuple(sorted(set(kept) | {dropped[0]}, reverse=True))
    return direct
