"""PNA's neighbourhood aggregation (Corso et al., NeurIPS 2020) over dense message tensors.

Messages into ``n`` nodes arrive as ``[B, n, k, C]`` (``k`` neighbours each, the same for every node
of a layer of a neural graph), or as blocks ``[B, n, k_i, C]`` (one per direction) that are aggregated
as if concatenated along ``k``. Four aggregators (mean, min, max, std) are concatenated and then
multiplied by each degree scaler ``S(d, alpha) = (log(d + 1) / delta) ** alpha``, with ``delta`` the
mean of ``log(d + 1)`` over the graph's nodes: identity (``alpha = 0``), amplification (``1``),
attenuation (``-1``). Std is PyTorch Geometric's ``sqrt(max(E[x^2] - E[x]^2, 1e-5))``; a node
without neighbours aggregates to zeros and counts as degree 1 in its scalers (also PyG's).
"""

from __future__ import annotations

import functools
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


def aggregation_dtype(blocks: Sequence[Tensor]) -> torch.dtype:
    """The dtype messages are aggregated in: the widest of the blocks', float32 at least."""
    return functools.reduce(torch.promote_types, (b.dtype for b in blocks), torch.float32)


class NeighbourMoments(torch.autograd.Function):
    """Blocks ``[B, n, k_i, C]`` of one layer's messages -> the mean, the mean square, the min and the max
    over all ``k = sum(k_i)`` neighbours, in float32 or wider (bfloat16's min and max over this axis run
    ~20x slower on CPUs: docs/dws.md, "Speed under bf16").

    The blocks are copied once into one wide tensor (what concatenating and then widening did in two
    passes). The moments' gradients are autograd's; an extremum's goes to the neighbour
    ``torch.min``/``torch.max`` return (the first of tied ones), as torch-scatter's ``scatter_min``/``max``,
    which PyG's PNA uses on a GPU, route it (``amin``'s even split of a tie is PyG's CPU path). So the
    backward is one ``addcmul`` for both moments and one scatter of ``B * n * C`` values per extremum, where
    the even split needed a full-size mask, its count and a masked add per extremum (~15% of a bf16 step)."""

    @staticmethod
    def forward(ctx, *blocks: Tensor):
        dtype = aggregation_dtype(blocks)
        if len(blocks) == 1 and blocks[0].dtype == dtype:
            x = blocks[0]
        else:
            B, n, _, C = blocks[0].shape
            x = blocks[0].new_empty(B, n, sum(b.shape[2] for b in blocks), C, dtype=dtype)
            start = 0
            for b in blocks:  # one widening copy per block, into its slice
                x[:, :, start:start + b.shape[2]] = b
                start += b.shape[2]
        k = x.shape[2]
        low, low_at = x.min(dim=2)
        high, high_at = x.max(dim=2)
        ctx.save_for_backward(x, low_at, high_at)
        ctx.blocks = [(b.shape[2], b.dtype) for b in blocks]
        return x.sum(dim=2) / k, (x * x).sum(dim=2) / k, low, high

    @staticmethod
    def backward(ctx, g_mean: Tensor, g_square: Tensor, g_low: Tensor, g_high: Tensor):
        x, low_at, high_at = ctx.saved_tensors
        k = x.shape[2]
        grad = torch.addcmul((g_mean / k)[:, :, None], x, (g_square * (2 / k))[:, :, None])
        grad.scatter_add_(2, low_at[:, :, None], g_low[:, :, None])
        grad.scatter_add_(2, high_at[:, :, None], g_high[:, :, None])
        grads, start = [], 0
        for size, dtype in ctx.blocks:
            grads.append(grad[:, :, start:start + size].to(dtype))
            start += size
        return tuple(grads)


def aggregate(messages: Tensor | Sequence[Tensor], delta: float,
              scalers: Sequence[str] = ("identity", "amplification")) -> Tensor:
    """``[B, n, k, C]`` messages, or blocks ``[B, n, k_i, C]`` of them (as if concatenated along ``k``)
    -> ``[B, n, len(AGGREGATORS) * len(scalers) * C]``, in float32 or wider (bfloat16 messages under
    autocast are aggregated in float32; float32 and float64 stay as they are)."""
    given = [messages] if isinstance(messages, Tensor) else list(messages)
    if not given:
        raise ValueError("aggregate needs at least one block of messages (an empty one for a node without neighbours)")
    blocks = [b for b in given if b.shape[2]]
    k = sum(b.shape[2] for b in blocks)
    if k == 0:  # no neighbours: zeros, in the dtype the messages would have been aggregated in
        B, n, _, C = given[0].shape
        return given[0].new_zeros(B, n, len(AGGREGATORS) * len(scalers) * C, dtype=aggregation_dtype(given))
    mean, mean_square, low, high = NeighbourMoments.apply(*blocks)
    var = mean_square - mean * mean  # E[x^2] - E[x]^2 as PyG; 2.5x faster than var_mean over this axis here
    stats = torch.cat([mean, low, high, var.clamp(min=1e-5).sqrt()], dim=-1)
    amplification = math.log(k + 1) / delta
    return torch.cat([stats * amplification ** SCALERS[s] for s in scalers], dim=-1)
