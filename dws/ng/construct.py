"""A batch of weight spaces -> its neural graph with learned input features.

As in the reference code's ``GraphConstructor`` (``sin_emb=True``, ``use_pos_embed=True``): every
weight and bias value is lifted by random Fourier features and a linear map, input neurons (which
have no bias) get the features of a zero bias, and the positional features of
:class:`~dws.ng.positions.NeuronPositions` are added to the nodes. The reverse edges get their own
linear map of the same Fourier features (the code encodes ``[w, 0, w]`` forward and ``[0, w, w]``
backward with one Gaussian map, which also tells the directions apart); the code's two consecutive
linear maps per input (``proj_weight``, ``proj_edge_in``) are one here (the same function class).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from dws.nfn.encoding import FourierFeatures
from dws.ng.graph import LayeredGraph
from dws.ng.positions import NeuronPositions
from dws.ops.linear import Linear, linear
from dws.weightspace import WeightSpace


class GraphConstructor(nn.Module):
    """``WeightSpace`` -> :class:`LayeredGraph` with ``node_channels`` / ``edge_channels`` features."""

    def __init__(self, widths: Sequence[int], node_channels: int, edge_channels: int, fourier_features: int = 128,
                 fourier_scale: float = 3.0, bidirectional: bool = True, in_channels: int = 1):
        super().__init__()
        self.widths, self.bidirectional = tuple(int(d) for d in widths), bool(bidirectional)
        self.weight_features = FourierFeatures(in_channels, fourier_features, fourier_scale)
        self.bias_features = FourierFeatures(in_channels, fourier_features, fourier_scale)
        lifted = 2 * fourier_features
        self.forward_edge = Linear(lifted, edge_channels)
        self.backward_edge = Linear(lifted, edge_channels) if bidirectional else None
        self.node = nn.Linear(lifted, node_channels)
        self.positions = NeuronPositions(self.widths, node_channels)

    def forward(self, ws: WeightSpace) -> LayeredGraph:
        ws = ws.with_channels()
        if ws.widths != self.widths:
            raise ValueError(f"this model was built for networks of widths {self.widths}, got {ws.widths}")
        w0 = ws.weights[0]
        no_bias = w0.new_zeros(w0.shape[0], w0.shape[2], w0.shape[3])  # input neurons: a zero bias
        nodes = [self.node(self.bias_features.encode(b)) + p
                 for b, p in zip((no_bias, *ws.biases), self.positions())]
        lifted = [self.weight_features.encode(w) for w in ws.weights]
        if not self.bidirectional:
            return LayeredGraph(tuple(nodes), tuple(self.forward_edge(f) for f in lifted))
        # both directions' maps as one product: the [B, d_{l+1}, d_l, 2 * fourier_features] lift is read once
        both = (torch.cat([self.forward_edge.weight, self.backward_edge.weight]),
                torch.cat([self.forward_edge.bias, self.backward_edge.bias]))
        forward, backward = zip(*(linear(f, *both).chunk(2, dim=-1) for f in lifted))
        return LayeredGraph(tuple(nodes), forward, backward)

    def zero_weight_edge(self, like: torch.Tensor) -> torch.Tensor:
        """``[E]``: the forward edge feature of a zero weight (what the reference code's dense graph holds
        between neurons that no weight connects)."""
        zero = like.new_zeros(1, self.weight_features.in_channels)
        return self.forward_edge(self.weight_features.encode(zero))[0]
