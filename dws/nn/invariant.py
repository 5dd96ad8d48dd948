"""The most general linear invariant map on a weight space (Prop. B.2 with the orbit table).

Pooling every tensor over all its set indices leaves exactly one value per orbit (per channel):
``W_1`` keeps its ``d_0`` columns, ``W_M`` and ``b_M`` their ``d_M`` rows, every other tensor a
single value. A linear map on the concatenation of those values is the invariant layer.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from dws.nn.init import scaled_xavier_normal_
from dws.nn.pooling import PooledInputs, check_pool
from dws.nn.structure import make_slots
from dws.nn.validate import prepare_input
from dws.weightspace import WeightSpace


def num_orbits(widths: Sequence[int]) -> int:
    """Number of orbits of the group on the weight-space indices (one invariant per orbit)."""
    return sum(s.free_size for s in make_slots(widths))


class DWSInvariantLayer(nn.Module):
    """``G``-invariant affine map from a weight space with ``in_channels`` to ``R^{out_features}``."""

    def __init__(
        self, widths: Sequence[int], in_channels: int, out_features: int, pool: str = "max",
        bias: bool = True, init_scale: float = 1.0,
    ):
        super().__init__()
        self.widths = tuple(int(d) for d in widths)
        self.in_channels = int(in_channels)
        self.pool = check_pool(pool)
        self.slots = make_slots(self.widths)
        self.linear = nn.Linear(num_orbits(self.widths) * self.in_channels, out_features, bias=bias)
        scaled_xavier_normal_(self.linear.weight, self.linear.in_features, out_features, init_scale)
        if bias:
            nn.init.zeros_(self.linear.bias)

    def forward(self, ws: WeightSpace) -> torch.Tensor:
        ws = prepare_input(ws, self.widths, self.in_channels, type(self).__name__)
        pooled = self.pooled_inputs(dict(zip(self.slots, ws.weights + ws.biases)))
        return self.linear(torch.cat([pooled.features(s, ()) for s in self.slots], dim=-1))

    def pooled_inputs(self, tensors: dict) -> PooledInputs:
        """How the input's tensors are pooled (:mod:`dws.nn.fast` swaps in faster pooling nodes)."""
        return PooledInputs(tensors, self.pool)
