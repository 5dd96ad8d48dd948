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
    """``BatchNormReLU.apply(y, gamma, beta, eps)`` -> ``(relu(batch_norm(y)), mean, biased var)``;
    the statistics are outputs without gradient (for the running statistics)."""

    @staticmethod
    def forward(ctx, y: Tensor, gamma: Tensor, beta: Tensor, eps: float):
        z, mean, var, invstd = native.bn_relu(y, gamma.detach(), beta.detach(), eps)
        ctx.save_for_backward(y, gamma, beta, mean, invstd)
        ctx.mark_non_differentiable(mean, var)
        return z, mean, var

    @staticmethod
    def backward(ctx, grad_z: Tensor, _grad_mean, _grad_var):
        y, gamma, beta, mean, invstd = ctx.saved_tensors
        grad_y, grad_gamma, grad_beta = native.bn_relu_backward(y, grad_z, gamma.detach(), beta.detach(), mean, invstd)
        return grad_y, grad_gamma, grad_beta, None


def native_applies(bn: nn.BatchNorm1d, flat: Tensor) -> bool:
    """Whether :func:`bn_relu_train` can replace ``relu(bn(flat))``: training mode with batch
    statistics, affine, at least two rows, and what the native kernels take."""
    return (
        bn.training and bn.affine and flat.shape[0] >= 2 and flat.dim() == 2
        and native.usable(flat, bn.weight, bn.bias, channels=(flat.shape[1],))
    )


def bn_relu_train(bn: nn.BatchNorm1d, flat: Tensor) -> Tensor:
    """``relu(bn(flat))`` for ``bn`` in training mode, updating its running statistics as
    ``nn.BatchNorm1d.forward`` does (momentum, or a cumulative average when it is None)."""
    z, mean, var = BatchNormReLU.apply(flat, bn.weight, bn.bias, bn.eps)
    if bn.track_running_stats and bn.running_mean is not None:
        with torch.no_grad():
            factor = 0.0 if bn.momentum is None else bn.momentum
            if bn.num_batches_tracked is not None:
                bn.num_batches_tracked.add_(1)
                if bn.momentum is None:
                    factor = 1.0 / float(bn.num_batches_tracked)
            n = flat.shape[0]
            bn.running_mean.mul_(1 - factor).add_(mean, alpha=factor)
            bn.running_var.mul_(1 - factor).add_(var, alpha=factor * n / (n - 1))
    return z
