"""Max pools as one autograd node per input tensor, with a sparse backward.

The plain layer pools with ``amax``, one node per pool; its backward compares the input with the
pooled maximum (a full-size pass per pool) and ``amax`` over the middle axis of a hidden weight's
``[B, d_m, d_{m-1}, C]`` is about 3x slower than over the first. :class:`MaxOverDims` takes every
pool of one tensor in one node as a channels-last ``max_pool2d``, which also returns the argmax,
so the backward is one scatter into one buffer; with the native kernels, both pools in one pass.
:class:`FastPooledInputs` is :class:`dws.nn.pooling.PooledInputs` on these nodes.
"""

from __future__ import annotations

import functools
from math import prod
from typing import Iterable, Mapping

import torch

from dws.nn.fast import native_pools
from dws.nn.pooling import PooledInputs
from dws.nn.structure import Slot

Tensor = torch.Tensor


class MaxOverDims(torch.autograd.Function):
    """``amax`` over one dim (or several, one dim each) of the same input, with the positions of the
    maxima kept for a sparse backward.

    ``MaxOverDims.apply(x, use_native, (d_1,), (d_2,), ...)`` returns one pooled tensor per dim, so
    all pools taken directly from one (large) tensor share a single autograd node. Each pool runs as
    a channels-last ``max_pool2d`` over a ``[outer, inner, L, 1]`` view of ``x`` (``L`` the pooled
    axis), or, with ``use_native`` where the kernels take ``x``, in C. The backward scatters each
    pooled gradient to its argmax in one zero-filled buffer: one pass instead of a comparison, a
    multiply and an add per pool. Each pooled entry sends its whole gradient to one maximal entry
    (the first); exact ties between distinct entries have probability zero for real-valued
    features, and tied zeros after a ReLU get no gradient through the ReLU anyway.
    """

    @staticmethod
    def forward(ctx, x: Tensor, use_native: bool, *dims_list: tuple[int, ...]):
        ctx.set_materialize_grads(False)
        ctx.native = use_native and native_pools.applies(x, None, dims_list)
        if ctx.native:  # one pass for both pools, and a backward without a separate zero fill
            outs = native_pools.forward(ctx, x, None, dims_list)
        else:
            outs, positions = max_pools(x, dims_list)
            ctx.save_for_backward(*positions)
        ctx.shape, ctx.dims_list = x.shape, dims_list
        return outs[0] if len(outs) == 1 else tuple(outs)

    @staticmethod
    def backward(ctx, *grads: Tensor | None):
        none = (None,) * (1 + len(ctx.dims_list))
        present = [g for g in grads if g is not None]
        if not present:
            return (None,) + none
        if ctx.native:
            return (native_pools.backward(ctx, None, grads)[0],) + none
        out = present[0].new_zeros(ctx.shape)
        add_pool_grads_(out, ctx.saved_tensors, grads)
        return (out,) + none


def max_pools(x: Tensor, dims_list) -> tuple[list[Tensor], list[Tensor]]:
    """``amax`` of ``x`` over each ``(dim,)`` of ``dims_list`` (no autograd), with the flat position
    in ``x`` of each maximum (for :func:`add_pool_grads_`)."""
    if any(len(dims) != 1 for dims in dims_list):
        raise ValueError(f"max pools are taken one dim at a time, got {dims_list}")
    outs, positions = [], []
    for (dim,) in dims_list:
        outer, length, inner = _split_at(x.shape, dim)
        view = x.reshape(outer, length, 1, inner).permute(0, 3, 1, 2)  # channels-last [outer, inner, L, 1]
        y, idx = torch.nn.functional.max_pool2d(view, (length, 1), return_indices=True)
        outs.append(y.reshape(*x.shape[:dim], *x.shape[dim + 1 :]))
        # flat position of each maximum in x: (o * L + idx) * inner + i
        offsets = (_flat_offsets.__wrapped__ if torch.compiler.is_compiling() else _flat_offsets)  # (a traced
        # step computes them in its graph; dynamo warns of a cache it would trace through)
        positions.append(idx.view(outer, inner).mul(inner).add_(offsets(outer, length, inner, x.device)))
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


class FastPooledInputs(PooledInputs):
    """:class:`~dws.nn.pooling.PooledInputs` whose max pools are :class:`MaxOverDims` nodes, with
    pools computed elsewhere (:meth:`store`) and all direct pools of a tensor in one node
    (:meth:`prefetch`)."""

    def __init__(self, tensors: Mapping[Slot, Tensor], pool: str, use_native: bool):
        super().__init__(tensors, pool)
        self.use_native = use_native

    def pool_axis(self, x: Tensor, dim: int) -> Tensor:
        if self.pool == "max":
            return MaxOverDims.apply(x, self.use_native, (dim,))
        return super().pool_axis(x, dim)

    def prefetch(self, direct: Mapping[Slot, Mapping[tuple[int, ...], int]]) -> None:
        """Compute, for max pooling, each slot's pools taken directly from its raw tensor (``direct``,
        from :func:`direct_pools`) in a single :class:`MaxOverDims` node (one backward buffer)."""
        if self.pool != "max":
            return
        for slot, pools in direct.items():
            todo = [k for k in pools if (slot, k) not in self._pooled]
            if len(todo) < 2:
                continue
            self.store(slot, todo, MaxOverDims.apply(self.tensors[slot], self.use_native, *((pools[k],) for k in todo)))

    def store(self, slot: Slot, kept_sets: Iterable[tuple[int, ...]], pools: Iterable[Tensor]) -> None:
        """Use ``pools`` (computed elsewhere) as ``slot`` pooled to each of ``kept_sets``."""
        for kept, y in zip(kept_sets, pools):
            self._pooled[(slot, kept)] = y
