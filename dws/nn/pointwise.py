"""Entry-wise and per-channel modules on weight spaces: ReLU, dropout, batch normalization.

They act the same way on every entry of a tensor (BN statistics pool over the batch and all
positions of one tensor), so they commute with the neuron permutations and keep equivariance.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from dws.weightspace import WeightSpace


class WSReLU(nn.Module):
    def forward(self, ws: WeightSpace) -> WeightSpace:
        return ws.map(torch.relu)


class WSDropout(nn.Module):
    """Element-wise dropout on every weight and bias entry (equivariant in distribution)."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.p = float(p)

    def forward(self, ws: WeightSpace) -> WeightSpace:
        if self.p == 0.0 or not self.training:
            return ws
        return ws.map(lambda t: nn.functional.dropout(t, self.p, training=True))


class WSBatchNorm(nn.Module):
    """One ``BatchNorm1d`` over the channels of each weight and each bias tensor.

    Each tensor gets its own statistics because weights of different layers live on different
    scales; within a tensor all positions share them, which is what keeps the map equivariant.
    With ``relu=True`` a ReLU follows, fused with the normalization in training mode.
    """

    def __init__(self, num_layers: int, channels: int, relu: bool = False, **bn_kwargs):
        super().__init__()
        self.relu = relu
        self.weight_norms = nn.ModuleList(nn.BatchNorm1d(channels, **bn_kwargs) for _ in range(num_layers))
        self.bias_norms = nn.ModuleList(nn.BatchNorm1d(channels, **bn_kwargs) for _ in range(num_layers))

    def forward(self, ws: WeightSpace) -> WeightSpace:
        if not ws.has_channels or ws.num_layers != len(self.weight_norms):
            raise ValueError(
                f"WSBatchNorm expects a weight space with channels and {len(self.weight_norms)} layers"
            )
        return WeightSpace(
            tuple(self._norm(bn, w) for bn, w in zip(self.weight_norms, ws.weights)),
            tuple(self._norm(bn, b) for bn, b in zip(self.bias_norms, ws.biases)),
        )

    def _norm(self, bn: nn.BatchNorm1d, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        if bn.training and self.relu:
            out = batch_norm_relu_train(flat, bn)
        else:
            out = bn(flat)
            out = torch.relu(out) if self.relu else out
        return out.reshape(x.shape)


def batch_norm_relu_train(x: torch.Tensor, bn: nn.BatchNorm1d) -> torch.Tensor:
    """Training-mode ``relu(bn(x))`` for ``x`` [N, C], updating ``bn``'s running statistics."""
    n = x.shape[0]
    with torch.no_grad():
        mean = _channel_sum(x) / n
        sq = torch.mul(x, x)  # its buffer is reused for the output (fresh large buffers cost page faults)
        var = _channel_sum(sq) / n - mean * mean
        var.clamp_(min=0)
        if bn.track_running_stats and bn.running_mean is not None:
            bn.num_batches_tracked += 1
            m = bn.momentum if bn.momentum is not None else 1.0 / float(bn.num_batches_tracked)
            bn.running_mean.lerp_(mean, m)
            bn.running_var.lerp_(var * n / max(n - 1, 1), m)
    return _BatchNormReLU.apply(x, mean, torch.rsqrt(var + bn.eps), bn.weight, bn.bias, [sq])


class _BatchNormReLU(torch.autograd.Function):
    """``relu(gamma * (x - mean) * invstd + beta)`` with batch statistics, backward by hand.

    Autograd through the statistics (or PyTorch's channels-last ``batch_norm`` backward) makes
    several more passes over the large hidden-weight tensors; the closed form needs two
    reductions and two fused multiply-adds.
    """

    @staticmethod
    def forward(ctx, x, mean, invstd, gamma, beta, buffer=()):
        # ``buffer``: optionally a list holding a scratch [N, C] tensor to write the output into
        # (a list, so autograd does not see it as an input)
        scale = gamma * invstd
        y = _channel_addcmul(beta - mean * scale, x, scale, out=buffer[0] if buffer else None).relu_()
        ctx.save_for_backward(x, y, mean, invstd, gamma)
        return y

    @staticmethod
    def backward(ctx, grad):
        x, y, mean, invstd, gamma = ctx.saved_tensors
        n = x.shape[0]
        g = torch.ops.aten.threshold_backward(grad.contiguous(), y, 0.0)
        sum_g = _channel_sum(g)
        gx = torch.mul(g, x)
        sum_g_xhat = invstd * (_channel_sum(gx) - mean * sum_g)
        scale = gamma * invstd
        # dx = scale * (g - sum_g / n - xhat * sum_g_xhat / n), xhat = (x - mean) * invstd
        a = -scale * invstd * sum_g_xhat / n
        b = -scale * sum_g / n - a * mean
        dx = _channel_addcmul(b, x, a, out=gx)  # two large buffers in all (fresh ones cost page faults)
        k = _rows_per_view(x)
        dx.view(-1, k * x.shape[1]).addcmul_(g.view(-1, k * x.shape[1]), scale.repeat(k))
        return dx, None, None, sum_g_xhat, sum_g, None


def _rows_per_view(x: torch.Tensor) -> int:
    """How many [C] rows to fold into one view row: per-channel broadcasts over a short inner
    axis (C = 48) run far slower than over a long one, so ops see ``[N / k, k * C]`` instead."""
    return math.gcd(x.shape[0], 64)


def _channel_addcmul(shift, x, scale, out=None):
    """``shift + x * scale`` for ``x`` [N, C], ``scale`` [C] and ``shift`` [C] or [N, C] (written
    into ``out`` [N, C] if given)."""
    k = _rows_per_view(x)
    wide = x.reshape(-1, k * x.shape[1])
    shift = shift.repeat(k) if shift.dim() == 1 else shift.reshape(wide.shape)
    if out is None:
        return torch.addcmul(shift, wide, scale.repeat(k)).view(x.shape)
    return torch.addcmul(shift, wide, scale.repeat(k), out=out.view(wide.shape)).view(x.shape)


def _channel_sum(x):
    """``x.sum(0)`` for ``x`` [N, C], over the wide view."""
    k = _rows_per_view(x)
    return x.reshape(-1, k * x.shape[1]).sum(0).view(k, -1).sum(0)


def activation_block(num_layers: int, channels: int, bn: bool, dropout: float) -> list[nn.Module]:
    """The modules that follow a hidden DWS layer: BN+ReLU (fused) or ReLU, then dropout."""
    mods: list[nn.Module] = [WSBatchNorm(num_layers, channels, relu=True) if bn else WSReLU()]
    if dropout > 0:
        mods.append(WSDropout(dropout))
    return mods
