"""The reference code's MLP (``mlp_args``: one hidden layer, LayerNorm, SiLU), with an optional
second input that is concatenated to the first: its first linear map is split into one per input,
``A [x, y] = A_x x + A_y y``, so that a per-node ``y`` (a positional embedding, a neighbour's
features) is mapped once per node and broadcast, never copied to every edge."""

from __future__ import annotations

import torch
from torch import nn

from dws.scalegmn.linear import Linear

Tensor = torch.Tensor


class MLP(nn.Module):
    """``Linear -> LayerNorm -> SiLU -> Linear`` of ``[x, extra]`` (``d_in + d_extra -> hidden -> d_out``)."""

    def __init__(self, d_in: int, hidden: int, d_out: int, d_extra: int = 0):
        super().__init__()
        self.first = Linear(d_in, hidden)
        self.first_extra = Linear(d_extra, hidden, bias=False) if d_extra else None
        self.norm, self.last = nn.LayerNorm(hidden), Linear(hidden, d_out)

    def forward(self, x: Tensor, extra: Tensor | None = None, invariant: nn.Module | None = None) -> Tensor:
        """``invariant``: the MLP of ``[invariant(x), extra]``, its map and ``first`` applied as one where
        both end and start linearly (``invariant.then``)."""
        h = self.first(x) if invariant is None else invariant.then(self.first, x)
        if self.first_extra is not None:
            h = h + self.first_extra(extra)  # broadcasts: the extra input's axes may be of size 1
        return self.last(nn.functional.silu(self.norm(h)))
