"""PNA's neighbourhood aggregation (Corso et al., NeurIPS 2020) over dense message tensors.

Messages into ``n`` nodes arrive as ``[B, n, k, C]`` (``k`` neighbours each, the same for every node
of a layer of a neural graph). Four aggregators (mean, min, max, std) are concatenated and then
multiplied by each degree scaler ``S(d, alpha) = (log(d + 1) / delta) ** alpha``, with ``delta`` the
mean of ``log(d + 1)`` over the graph's nodes: identity (``alpha = 0``), amplification (``1``),
attenuation (``-1``). Std is PyTorch Geometric's ``sqrt(max(E[x^2] - E[x]^2, 1e-5))``; a node
without neighbours aggregates to zeros and counts as degree 1 in its scalers (also PyG's).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

Tensor = torch.Tensor

AGGREGATORS = ("mean", "min", "max", "std")
SCALERS = {"identity": 0.0, "amplification": 1.0, "attenuation": -1.0}


def mean_log_degree(degrees: Sequence[int], counts: Sequence[int]) -> float:
    """PNA's ``delta``: the mean of ``log(d + 1)`` over nodes (``counts[i]`` nodes of degree ``degrees[i]``)."""
    total = sum(counts)
    return sum(c * math.log(d + 1) for d, c in zip(degrees, counts)) / total


class NeighbourMoments(torch.autograd.Function):
    """``[B, n, k, C]`` -> the mean, the mean square, the min and the max over the ``k`` neighbours.

    The same values and gradients as ``mean``, ``(x * x).mean``, ``amin`` and ``amax`` (a tie's gradient
    split evenly, as ``amin``'s), with a backward of one pass for both moments and one masked add per
    extremum: autograd's four backwards (an expanded copy each, the square's two products, the
    extrema's bool masks multiplied in as floats) made the aggregation 1.5x slower here."""

    @staticmethod
    def forward(ctx, x: Tensor):
        k = x.shape[2]
        low, high = x.amin(dim=2), x.amax(dim=2)
        ctx.save_for_backward(x, low, high)
        return x.sum(dim=2) / k, (x * x).sum(dim=2) / k, low, high

    @staticmethod
    def backward(ctx, g_mean: Tensor, g_square: Tensor, g_low: Tensor, g_high: Tensor):
        x, low, high = ctx.saved_tensors
        k = x.shape[2]
        grad = torch.addcmul((g_mean / k)[:, :, None], x, (g_square * (2 / k))[:, :, None])
        for extremum, g in ((low, g_low), (high, g_high)):
            hit = (x == extremum[:, :, None]).to(x.dtype)
            grad.addcmul_(hit, (g / hit.sum(dim=2))[:, :, None])
        return grad


def aggregate(messages: Tensor, delta: float, scalers: Sequence[str] = ("identity", "amplification")) -> Tensor:
    """``[B, n, k, C]`` -> ``[B, n, len(AGGREGATORS) * len(scalers) * C]``."""
    B, n, k, C = messages.shape
    if k == 0:
        return messages.new_zeros(B, n, len(AGGREGATORS) * len(scalers) * C)
    # bfloat16 messages (autocast) are aggregated in float32: bfloat16's min and max over this axis, and the
    # backward's tie masks, run ~20x slower on CPUs (docs/dws.md, "Speed under bf16"); float32/64 stay as they are
    wide = messages.to(torch.promote_types(messages.dtype, torch.float32))
    mean, mean_square, low, high = NeighbourMoments.apply(wide)
    var = mean_square - mean * mean  # E[x^2] - E[x]^2 as PyG; 2.5x faster than var_mean over this axis here
    stats = torch.cat([mean, low, high, var.clamp(min=1e-5).sqrt()], dim=-1)
    amplification = math.log(k + 1) / delta
    return torch.cat([stats * amplification ** SCALERS[s] for s in scalers], dim=-1)
