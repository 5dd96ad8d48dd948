"""Batch norm + ReLU in training mode as one autograd node on the native kernels.

PyTorch's ``[N, C]`` batch norm followed by an in-place ReLU makes five passes over the tensor
forward (statistics, normalization, ReLU) and backward (the ReLU mask, batch norm's two passes),
and keeps both its input and its output for the backward. :class:`BatchNormReLU` makes two passes
each way (:mod:`dws.nn.native`) and keeps only the input: the backward recomputes the ReLU mask
from it. Running statistics are updated exactly as ``nn.BatchNorm1d`` does.
"""

from __future__ import annotations

import torch
from torch import nn

from dws.nn import native

Tensor = torch.Tensor


class BatchNormReLU(torch.autograd.Function):
    """``BatchNormReLU.apply(y, row, col, gamma, beta, eps, running)`` -> ``relu(batch_norm(v))`` for
    ``v = y`` or ``y + row + col``, updating ``running`` (see :func:`dws.nn.native.bn_relu`)."""

    @staticmethod
    def forward(ctx, y: Tensor, row: Tensor | None, col: Tensor | None, gamma: Tensor, beta: Tensor, eps: float,
                running):
        z, mean, invstd = native.bn_relu(y, row, col, gamma.detach(), beta.detach(), eps, running)
        ctx.save_for_backward(y, row, col, gamma, beta, mean, invstd)
        return z

    @staticmethod
    def backward(ctx, grad_z: Tensor):
        y, row, col, gamma, beta, mean, invstd = ctx.saved_tensors
        grads = native.bn_relu_backward(y, row, col, grad_z, gamma.detach(), beta.detach(), mean, invstd)
        return (*grads, None, None)


def native_applies(bn: nn.BatchNorm1d, y: Tensor, *terms: Tensor | None) -> bool:
    """Whether :func:`bn_relu_train` can replace ``relu(bn(v))`` for ``v = y`` (``[N, C]``) or
    ``y + row + col`` (``y`` ``[B, H, W, C]``, ``terms`` its row and column terms): training mode
    with batch statistics, affine, at least two rows, and what the native kernels take."""
    rows = y.numel() // max(y.shape[-1], 1)
    present = [t for t in terms if t is not None]
    return (
        bn.training and bn.affine and rows >= 2 and y.dim() == (4 if terms else 2)
        and native.usable(y, bn.weight, bn.bias, *present, *_buffers(bn), channels=(y.shape[-1],))
    )


def _buffers(bn: nn.BatchNorm1d) -> list[Tensor]:
    return [t for t in (bn.running_mean, bn.running_var) if t is not None]


def bn_relu_train(bn: nn.BatchNorm1d, y: Tensor, row: Tensor | None = None, col: Tensor | None = None) -> Tensor:
    """``relu(bn(v))`` over the channels (last axis) of ``v = y`` or ``y + row + col`` (see
    :func:`dws.nn.native.bn_relu`) for ``bn`` in training mode, updating its running statistics as
    ``nn.BatchNorm1d.forward`` does (momentum, or a cumulative average when it is None)."""
    running = None
    if bn.track_running_stats and bn.running_mean is not None:
        factor = 0.0 if bn.momentum is None else bn.momentum
        if bn.num_batches_tracked is not None:
            bn.num_batches_tracked.add_(1)
            if bn.momentum is None:
                factor = 1.0 / float(bn.num_batches_tracked)
        running = (bn.running_mean, bn.running_var, factor)
    return BatchNormReLU.apply(y, row, col, bn.weight, bn.bias, bn.eps, running)
