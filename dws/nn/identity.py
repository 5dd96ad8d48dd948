"""A hidden weight's identity term and its max pools in one autograd node.

A weight between two hidden layers (``W_m``, ``[B, d_m, d_{m-1}, C]``, both axes permuted) is the
largest tensor of a DWS layer, and the layer reads it in two ways: the channel-mixing product of
the identity term (which keeps both indices) and the max pools over its rows and its columns
(from which the row, column and global terms are built). As two autograd nodes, their backward
gives the input two full-size gradients, the product's and a zero-filled buffer into which the
pools' gradients are scattered, and autograd adds them: a fill and an add pass over the largest
tensor, every layer. Here the pools' gradients are added straight into the product's gradient.
"""

from __future__ import annotations

import torch

from dws.nn import native
from dws.nn.matmul import input_grad, product, uses_onednn, weight_grad
from dws.nn.pooling import add_pool_grads_, max_pools

Tensor = torch.Tensor


class MatmulAndMaxPools(torch.autograd.Function):
    """``MatmulAndMaxPools.apply(x, weight, (d_1,), (d_2,), ...)`` returns ``(x @ weight, amax(x, d_1),
    amax(x, d_2), ...)``; the product as a fresh tensor (the layer adds its broadcast terms into it in
    place), the pools as :class:`dws.nn.pooling.MaxOverDims` computes them."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, *dims_list: tuple[int, ...]):
        ctx.set_materialize_grads(False)
        ctx.num_pools = len(dims_list)
        ctx.native = _native_applies(x, weight, dims_list)
        if ctx.native:
            return _NativeForm.forward(ctx, x, weight, dims_list)
        onednn = uses_onednn(x, weight)
        pools, positions = max_pools(x, dims_list)
        ctx.save_for_backward(x, weight, *positions)
        ctx.onednn = onednn
        return (product(x, weight, onednn), *pools)

    @staticmethod
    def backward(ctx, grad_y: Tensor | None, *grad_pools: Tensor | None):
        if ctx.native:
            return _NativeForm.backward(ctx, grad_y, grad_pools)
        x, weight, *positions = ctx.saved_tensors
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_x = x.new_zeros(x.shape) if grad_y is None else input_grad(grad_y, weight, ctx.onednn)
            add_pool_grads_(grad_x, positions, grad_pools)
        if ctx.needs_input_grad[1] and grad_y is not None:
            grad_w = weight_grad(x, grad_y)
        return (grad_x, grad_w) + (None,) * ctx.num_pools


def _native_applies(x: Tensor, weight: Tensor, dims_list) -> bool:
    """A ``[B, H, W, C]`` input pooled over H and/or W, on tensors the native kernels take."""
    return (
        x.dim() == 4 and len(dims_list) >= 1 and len(set(dims_list)) == len(dims_list)
        and all(d in ((1,), (2,)) for d in dims_list)
        and native.usable(x, weight, channels=(x.shape[-1], weight.shape[-1]))
    )


class _NativeForm:
    """The node's native path (:mod:`dws.nn.native`): the pools and the product one network at a
    time; backward, both gradients and the pools' scatter likewise."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, dims_list):
        rows, columns = (2,) in dims_list, (1,) in dims_list  # dim 2 = W: one max per row
        y, row, col = native.pools_product(x, weight, rows, columns)
        saved = [x, weight] + ([row[1]] if rows else []) + ([col[1]] if columns else [])
        ctx.save_for_backward(*saved)
        ctx.dims_list = dims_list
        return (y, *((row if d == (2,) else col)[0] for d in dims_list))

    @staticmethod
    def backward(ctx, grad_y: Tensor | None, grad_pools):
        x, weight, *args = ctx.saved_tensors
        grads = dict(zip(ctx.dims_list, grad_pools))
        arg = dict(zip([d for d in ((2,), (1,)) if d in ctx.dims_list], args))
        row = (grads[(2,)], arg[(2,)]) if (2,) in arg else None
        col = (grads[(1,)], arg[(1,)]) if (1,) in arg else None
        grad_x, grad_w = native.pools_product_backward(
            x, weight, grad_y, row, col, ctx.needs_input_grad[0], ctx.needs_input_grad[1])
        return (grad_x, grad_w) + (None,) * ctx.num_pools
