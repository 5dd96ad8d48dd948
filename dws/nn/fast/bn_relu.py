"""Batch norm + ReLU in training mode as one autograd node on the native kernels.

PyTorch's ``[N, C]`` batch norm followed by an in-place ReLU makes five passes over the tensor
forward (statistics, normalization, ReLU) and backward (the ReLU mask, batch norm's two passes),
and keeps both its input and its output for the backward. :class:`BatchNormReLU` makes two passes
each way (:mod:`dws.nn.fast.native`) and keeps only the input: the backward recomputes the ReLU mask
from it. It can add a DWS layer's row and column broadcast terms on the fly (see
:mod:`dws.nn.fast.pending`), and :class:`BatchNormReLUProduct` also computes the next DWS layer's
identity product and max pools of its output without storing that output. Running statistics are
updated (in the kernel) as ``nn.BatchNorm1d`` does.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable
from torch import nn

from dws.nn.fast import native, native_pools
from dws.nn.fast.guard import fusable

Tensor = torch.Tensor


class BatchNormReLU(torch.autograd.Function):
    """``BatchNormReLU.apply(y, row, col, gamma, beta, eps, running)`` -> ``relu(batch_norm(v))`` for
    ``v = y`` or ``y + row + col``, updating ``running`` (see :func:`dws.nn.fast.native.bn_relu`)."""

    @staticmethod
    def forward(ctx, y: Tensor, row: Tensor | None, col: Tensor | None, gamma: Tensor, beta: Tensor, eps: float,
                running):
        z, stats = native.bn_relu(y, row, col, gamma, beta, eps, running)
        ctx.save_for_backward(y, row, col, gamma, beta, stats)
        return z

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_z: Tensor):
        y, row, col, gamma, beta, stats = ctx.saved_tensors
        grads = native.bn_relu_backward(y, row, col, grad_z, gamma, beta, stats)
        return (*grads, None, None)


class BatchNormReLUProduct(torch.autograd.Function):
    """``BatchNormReLUProduct.apply(y, row, col, gamma, beta, weight, eps, running, *dims_list)`` ->
    ``(z @ weight, *max pools of z over each dim)`` for ``z = relu(batch_norm(y + row + col))``
    (``[B, H, W, C]``; dims ``(1,)`` over H, ``(2,)`` over W), without materializing ``z``: a hidden
    weight's batch norm + ReLU and the next DWS layer's identity product and pools of it (what
    :class:`dws.nn.fast.identity.MatmulAndMaxPools` would compute from ``z``), see
    :func:`dws.nn.fast.native.bn_relu_product`."""

    @staticmethod
    def forward(ctx, y, row, col, gamma, beta, weight, eps, running, *dims_list):
        ctx.set_materialize_grads(False)
        y_next, pool_row, pool_col, stats = native.bn_relu_product(
            y, row, col, gamma, beta, eps, running, weight, native_pools.ROWS in dims_list,
            native_pools.COLUMNS in dims_list)
        pools, args = native_pools.split_pools(dims_list, pool_row, pool_col)
        ctx.save_for_backward(y, row, col, gamma, beta, weight, stats, *args)
        ctx.dims_list = dims_list
        return (y_next, *pools)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y_next, *grad_pools):
        y, row, col, gamma, beta, weight, stats, *args = ctx.saved_tensors
        pool_row, pool_col = native_pools.pool_gradients(ctx.dims_list, grad_pools, args)
        grads = native.bn_relu_product_backward(y, row, col, gamma, beta, stats, weight, grad_y_next, pool_row,
                                                pool_col, ctx.needs_input_grad[5])
        return (*grads, None, None) + (None,) * len(ctx.dims_list)


def native_applies(bn: nn.BatchNorm1d, y: Tensor, *terms: Tensor | None) -> bool:
    """Whether :func:`bn_relu_train` can replace ``relu(bn(v))`` for ``v = y`` (``[N, C]``) or
    ``y + row + col`` (``y`` ``[B, H, W, C]``, ``terms`` its row and column terms): training mode
    with batch statistics, affine, at least two rows, a plain ``BatchNorm1d`` without hooks (see
    :mod:`dws.nn.fast.guard`), and what the native kernels take."""
    rows = y.numel() // max(y.shape[-1], 1)
    present = [t for t in terms if t is not None]
    return (
        bn.training and bn.affine and rows >= 2 and y.dim() == (4 if terms else 2) and fusable(bn, nn.BatchNorm1d)
        and native.usable(y, bn.weight, bn.bias, *present, *_buffers(bn), channels=(y.shape[-1],))
    )


def _buffers(bn: nn.BatchNorm1d) -> list[Tensor]:
    return [t for t in (bn.running_mean, bn.running_var) if t is not None]


def _running(bn: nn.BatchNorm1d):
    """``(running_mean, running_var, factor)`` for this training step, counting the step as
    ``nn.BatchNorm1d.forward`` does (momentum, or a cumulative average when it is None); None when
    ``bn`` keeps no running statistics."""
    if not bn.track_running_stats or bn.running_mean is None:
        return None
    factor = 0.0 if bn.momentum is None else bn.momentum
    if bn.num_batches_tracked is not None:
        bn.num_batches_tracked.add_(1)
        if bn.momentum is None:
            factor = 1.0 / float(bn.num_batches_tracked)
    return bn.running_mean, bn.running_var, factor


def bn_relu_train(bn: nn.BatchNorm1d, y: Tensor, row: Tensor | None = None, col: Tensor | None = None) -> Tensor:
    """``relu(bn(v))`` over the channels (last axis) of ``v = y`` or ``y + row + col`` (see
    :func:`dws.nn.fast.native.bn_relu`) for ``bn`` in training mode, updating its running statistics."""
    return BatchNormReLU.apply(y, row, col, bn.weight, bn.bias, bn.eps, _running(bn))


def bn_relu_product_train(bn: nn.BatchNorm1d, y: Tensor, row: Tensor | None, col: Tensor | None, weight: Tensor,
                          dims_list) -> tuple[Tensor, list[Tensor]]:
    """:class:`BatchNormReLUProduct` for ``bn`` in training mode (updating its running statistics):
    ``(z @ weight, [pools of z in dims_list order])``."""
    y_next, *pools = BatchNormReLUProduct.apply(y, row, col, bn.weight, bn.bias, weight, bn.eps, _running(bn),
                                                *dims_list)
    return y_next, pools
