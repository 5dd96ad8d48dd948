"""Learned positional features of the neurons that an MLP's symmetry does not move.

Input and output neurons keep their place under every symmetry of an MLP, so each gets an
embedding of its own; all neurons of one hidden layer share one (the reference code's
``pos_embed_layout = [1] * d_0 + d_1..d_{L-1} + [1] * d_L``, i.e. one per hidden *layer*). The graph
stays equivariant to hidden-neuron permutations, and input or output neurons become tellable
apart (without them a message-passing network is also equivariant to permutations of those).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn


class NeuronPositions(nn.Module):
    """``[d_0 + (L - 1) + d_L, C]`` embeddings -> one ``[d_l, C]`` table per layer."""

    def __init__(self, widths: Sequence[int], channels: int):
        super().__init__()
        self.widths = tuple(int(d) for d in widths)
        count = self.widths[0] + (len(self.widths) - 2) + self.widths[-1]
        self.embedding = nn.Parameter(torch.randn(count, channels))  # the code's torch.randn init

    def forward(self) -> list[torch.Tensor]:
        d_0, d_L, hidden = self.widths[0], self.widths[-1], self.widths[1:-1]
        inputs, shared, outputs = self.embedding.split([d_0, len(hidden), d_L])
        middle = [shared[k].expand(d, -1) for k, d in enumerate(hidden)]
        return [inputs, *middle, outputs]
