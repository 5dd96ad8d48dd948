"""The POOL operation of the paper, with selectable aggregation and scale normalization.

The paper's POOL is a sum, but sums of post-ReLU features grow with the set size (even a
``1/sqrt(n)`` scaling compounds to overflow in a 10-layer stack), so ``"sum"`` is normalized by the
set size. Since the widths are fixed per layer, that makes it numerically the same map as
``"mean"``; both names are accepted. ``"max"`` (the paper's experimental choice) needs no scaling.
All compose: pooling two axes one after the other equals pooling both at once, which
:class:`PooledInputs` uses to reuse partial pools.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import torch

from dws.nn.layout import to_features
from dws.nn.structure import Slot

Tensor = torch.Tensor
POOL_CHOICES = ("max", "mean", "sum")


def check_pool(pool: str) -> str:
    if pool not in POOL_CHOICES:
        raise ValueError(f"pool must be one of {POOL_CHOICES}, got {pool!r}")
    return pool


class MaxOverDims(torch.autograd.Function):
    """``amax`` over one or several dim sets of the same input, with a backward that sends each
    pooled gradient to the maximal entries.

    ``MaxOverDims.apply(x, dims_1, dims_2, ...)`` returns one pooled tensor per dim set, so all pools
    taken directly from one (large) tensor share a single autograd node: its backward builds the
    input gradient in one buffer (a comparison written straight into a float buffer, then an
    in-place multiply-add per pool) instead of one masked tensor per pool plus autograd's
    accumulation adds. PyTorch's ``amax`` backward splits the gradient evenly between ties, which
    costs a count reduction and more passes over the input; exact ties between distinct entries
    have probability zero for real-valued features (and tied zeros after a ReLU get no gradient
    through it anyway), so each maximal entry simply receives the full gradient.
    """

    @staticmethod
    def forward(ctx, x: Tensor, *dims_list: tuple[int, ...]):
        ctx.set_materialize_grads(False)
        pooled = [x.amax(dim=dims, keepdim=True) for dims in dims_list]
        ctx.save_for_backward(x, *pooled)
        ctx.dims_list = dims_list
        outs = tuple(y.squeeze(dims) for y, dims in zip(pooled, dims_list))
        return outs[0] if len(outs) == 1 else outs

    @staticmethod
    def backward(ctx, *grads: Tensor | None):
        x, *pooled = ctx.saved_tensors
        out = buf = None
        for y, grad, dims in zip(pooled, grads, ctx.dims_list):
            if grad is None:
                continue
            grad = _unsqueeze(grad, dims)
            if out is None:  # eq into a float buffer is one cheap pass (a bool mask is not)
                out = torch.eq(x, y, out=torch.empty_like(x)).mul_(grad)
            else:
                if buf is None:
                    buf = torch.empty_like(x)
                out.addcmul_(torch.eq(x, y, out=buf), grad)
        return (out,) + (None,) * len(ctx.dims_list)


def _unsqueeze(t: Tensor, dims: tuple[int, ...]) -> Tensor:
    for d in sorted(dims):
        t = t.unsqueeze(d)
    return t


def reduce(x: Tensor, dims: tuple[int, ...], pool: str) -> Tensor:
    """Pool ``x`` over ``dims`` (dropping them)."""
    if not dims:
        return x
    if pool == "max":
        return MaxOverDims.apply(x, tuple(dims))
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

    def prefetch(self, keys: Iterable[tuple[Slot, tuple[int, ...]]]) -> None:
        """Compute, for max pooling, all pools taken directly from one raw tensor that ``native``
        will need for ``keys`` in a single :class:`MaxOverDims` node (one backward buffer)."""
        if self.pool != "max":
            return
        direct: dict[Slot, dict[tuple[int, ...], int]] = {}
        for slot, kept in keys:
            while True:
                dropped = [a for a in slot.set_axes if a not in kept]
                if len(dropped) <= 1:
                    if dropped:
                        direct.setdefault(slot, {})[kept] = 1 + list(slot.axes).index(dropped[0])
                    break
                kept = tuple(sorted(set(kept) | {dropped[0]}, reverse=True))
        for slot, pools in direct.items():
            todo = [k for k in pools if (slot, k) not in self._native]
            if len(todo) < 2:
                continue
            outs = MaxOverDims.apply(self.tensors[slot], *((pools[k],) for k in todo))
            for k, y in zip(todo, outs):
                self._native[(slot, k)] = y

    def features(self, slot: Slot, kept: tuple[int, ...]) -> Tensor:
        """``[B, *kept sizes, free_size * C]``: the slot pooled to ``kept``, free axes in features."""
        key = (slot, kept)
        if key not in self._features:
            self._features[key] = to_features(self.native(slot, kept), slot, kept)
        return self._features[key]
