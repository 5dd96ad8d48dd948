"""Channel dropout of a weight space (the reference code's ``ChannelDropout``, ``feature_dropout``:
0.1 in its MNIST INR classifiers), after every NF layer's ReLU.

Elementwise dropout on weight features would give every entry of a matrix its own mask. Here, as in
the code, a weight tensor's mask is drawn once per network and channel and shared by all its entries
(``nn.Dropout2d`` on ``[B, C, d_l, d_{l-1}]``): whole channels of a matrix are dropped. That mask
does not depend on the neurons at all, so for any one draw dropping then permuting equals permuting
then dropping. Biases, as in the code, get elementwise dropout (``nn.Dropout``): independent masks per
entry, so the layer is equivariant in distribution there.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from dws.weightspace import WeightSpace


class ChannelDropout(nn.Module):
    """Weights: one Bernoulli mask per (network, channel, tensor); biases: per entry. Identity in eval mode."""

    def __init__(self, p: float):
        super().__init__()
        if not 0 <= p < 1:
            raise ValueError(f"channel dropout must be in [0, 1), got {p}")
        self.p = float(p)

    def forward(self, ws: WeightSpace) -> WeightSpace:
        ws = ws.with_channels()
        # dropout2d zeroes whole channels of [B, C, H, W]; the weights are channels last
        weights = tuple(F.dropout2d(w.movedim(-1, 1), self.p, self.training).movedim(1, -1) for w in ws.weights)
        biases = tuple(F.dropout(b, self.p, self.training) for b in ws.biases)
        return WeightSpace(weights, biases)

    def extra_repr(self) -> str:
        return f"p={self.p}"
