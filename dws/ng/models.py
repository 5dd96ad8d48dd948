"""The invariant neural-graph models: ``ng-gnn`` (:class:`NGGNN`) and ``ng-transformer`` (:class:`NGTransformer`).

Both are graph construction (:mod:`dws.ng.construct`) -> backbone -> the output neurons' features
(:mod:`dws.ng.readout`) -> MLP. The reference code's INR-classification configs
(``experiments/inr_classification/configs/model/{pna,rtransformer}.yaml``) fix their proportions:
PNA ``d_hid=32``, 4 layers, 128 Fourier frequencies (scale 3), head ``32 -> 32``; RT ``d_edge=32``,
``d_node=64``, attention/node-MLP/head width 128, edge-MLP width 64, 8 heads, 4 layers, 128 Fourier
frequencies (scale 1). :func:`gnn_ratios` and :func:`transformer_ratios` scale those to one width ``c``,
which ``dws.tasks.models`` sets to the reference's 32 at the DWSNet's default channels (docs/dws.md).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from dws.ng.construct import GraphConstructor
from dws.ng.pna import PNABackbone
from dws.ng.readout import OutputNeuronHead
from dws.ng.relational import RTLayer
from dws.weightspace import WeightSpace


PAPER_NG_WIDTH = 32  # both reference INR classifiers' c: PNA's d_hid, RT's d_edge


def gnn_ratios(channels: int) -> dict:
    """The reference PNA's proportions at ``channels`` (32 there): ``4 * channels`` Fourier frequencies."""
    return dict(channels=channels, fourier_features=4 * channels)


def transformer_ratios(edge_channels: int) -> dict:
    """The reference RT's proportions at ``edge_channels`` (32 there; even, so that 8 heads divide ``4c``)."""
    c = edge_channels
    return dict(edge_channels=c, node_channels=2 * c, attention_hidden=4 * c, node_hidden=4 * c,
                edge_hidden=2 * c, head_hidden=4 * c, fourier_features=4 * c)


def check_widths(widths: Sequence[int]) -> tuple[int, ...]:
    widths = tuple(int(d) for d in widths)
    if len(widths) < 2 or min(widths) < 1:
        raise ValueError(f"neural graphs need networks of at least one layer with positive widths, got {widths}")
    return widths


class NGGNN(nn.Module):
    """Weight space -> ``R^out_features`` by PNA message passing on the neural graph (``ng-gnn``)."""

    def __init__(self, widths: Sequence[int], out_features: int, channels: int = 32, num_layers: int = 4,
                 fourier_features: int = 128, fourier_scale: float = 3.0, dropout: float = 0.0,
                 bidirectional: bool = True, in_channels: int = 1, norm: str = "graph"):
        super().__init__()
        self.widths = check_widths(widths)
        self.construct = GraphConstructor(self.widths, channels, channels, fourier_features, fourier_scale,
                                          bidirectional, in_channels)
        self.backbone = PNABackbone(self.widths, channels, num_layers, dropout, bidirectional, norm=norm)
        self.head = OutputNeuronHead(self.widths[-1], channels, channels, out_features, depth=3)

    def forward(self, ws: WeightSpace) -> torch.Tensor:
        return self.head(self.backbone(self.construct(ws)).nodes[-1])


class NGTransformer(nn.Module):
    """Weight space -> ``R^out_features`` by the relational transformer on the neural graph (``ng-transformer``)."""

    def __init__(self, widths: Sequence[int], out_features: int, edge_channels: int = 32, node_channels: int = 64,
                 attention_hidden: int = 128, node_hidden: int = 128, edge_hidden: int = 64, head_hidden: int = 128,
                 heads: int = 8, num_layers: int = 4, fourier_features: int = 128, fourier_scale: float = 1.0,
                 dropout: float = 0.0, in_channels: int = 1):
        super().__init__()
        self.widths = check_widths(widths)
        self.construct = GraphConstructor(self.widths, node_channels, edge_channels, fourier_features, fourier_scale,
                                          bidirectional=True, in_channels=in_channels)
        self.layers = nn.ModuleList(
            RTLayer(node_channels, edge_channels, attention_hidden, node_hidden, edge_hidden, heads, dropout,
                    update_edges=i < num_layers - 1) for i in range(num_layers))
        self.head = OutputNeuronHead(self.widths[-1], node_channels, head_hidden, out_features, depth=2)

    def forward(self, ws: WeightSpace) -> torch.Tensor:
        graph = self.construct(ws)
        no_edge = self.construct.zero_weight_edge(graph.nodes[0])
        for layer in self.layers:
            graph = layer(graph, no_edge)
        return self.head(graph.nodes[-1])
