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

from dws.nn.fast import native_pools
from dws.nn.fast.matmul import input_grad, product, uses_onednn, weight_grad
from dws.nn.fast.pools import add_pool_grads_, max_pools

Tensor = torch.Tensor


class MatmulAndMaxPools(torch.autograd.Function):
    """``MatmulAndMaxPools.apply(x, weight, use_native, (d_1,), (d_2,), ...)`` returns ``(x @ weight,
    amax(x, d_1), amax(x, d_2), ...)``; the product as a fresh tensor (the layer adds its broadcast
    terms into it in place), the pools as :class:`dws.nn.fast.pools.MaxOverDims` computes them;
    with ``use_native``, in C where the kernels take ``x`` and ``weight``."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, use_native: bool, *dims_list: tuple[int, ...]):
        ctx.set_materialize_grads(False)
        ctx.num_pools = len(dims_list)
        ctx.native = use_native and native_pools.applies(x, weight, dims_list)
        if ctx.native:
            return native_pools.forward(ctx, x, weight, dims_list)
        onednn = uses_onednn(x, weight)
        pools, positions = max_pools(x, dims_list)
        ctx.save_for_backward(x, weight, *positions)
        ctx.onednn = onednn
        return (product(x, weight, onednn), *pools)

    @staticmethod
    def backward(ctx, grad_y: Tensor | None, *grad_pools: Tensor | None):
        none = (None,) * (1 + ctx.num_pools)
        if ctx.native:
            return native_pools.backward(ctx, grad_y, grad_pools) + none
        x, weight, *positions = ctx.saved_tensors
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_x = x.new_zeros(x.shape) if grad_y is None else input_grad(grad_y, weight, ctx.onednn)
            add_pool_grads_(grad_x, positions, grad_pools)
        if ctx.needs_input_grad[1] and grad_y is not None:
            grad_w = weight_grad(x, grad_y)
        return (grad_x, grad_w) + none
