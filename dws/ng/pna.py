"""``ng-gnn``'s backbone: PNA message passing on the neural graph, with edge updates.

One :class:`PNAConv` is the reference code's ``PNAConv`` with ``modulate_edges=True``, one tower,
one pre- and one post-layer: the message from node ``j`` to node ``i`` over edge ``e_ij`` is
``scale(e_ij) * pre([x_i, x_j]) + shift(e_ij)`` (``scale, shift`` one linear map of the edge), the
node's messages (one block per direction) are aggregated by :func:`~dws.ng.aggregation.aggregate`, and
``x_i' = lin(post([x_i, aggregate]))``. Between layers (the code's ``BasicGNN``): layer norm, SiLU,
dropout, then every edge is updated by :class:`EdgeMLP`, ``lin1(SiLU(lin_e(e) + lin_s(x_source) +
lin_t(x_target)))`` (no edge update after the last layer: ``final_edge_update=False``).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from dws.ng.aggregation import AGGREGATORS, aggregate, mean_log_degree
from dws.ng.graph import LayeredGraph, edge_sum, endpoint_sum
from dws.ops.linear import Linear

Tensor = torch.Tensor


def in_degrees(widths: Sequence[int], bidirectional: bool) -> list[int]:
    """Each layer's in-degree: its previous layer's width, plus its next layer's when messages flow back."""
    last = len(widths) - 1
    return [(widths[l - 1] if l > 0 else 0) + (widths[l + 1] if bidirectional and l < last else 0)
            for l in range(len(widths))]


class PNAConv(nn.Module):
    """One PNA layer on a :class:`LayeredGraph` (node features ``channels`` -> ``channels``)."""

    def __init__(self, channels: int, edge_channels: int, delta: float,
                 scalers: Sequence[str] = ("identity", "amplification")):
        super().__init__()
        self.delta, self.scalers = float(delta), tuple(scalers)
        self.edge_encoder = Linear(edge_channels, 2 * channels)  # scale and shift of each message
        self.pre_target = nn.Linear(channels, channels)  # pre([x_i, x_j]) = pre_target(x_i) + pre_source(x_j)
        self.pre_source = nn.Linear(channels, channels, bias=False)
        self.post = nn.Linear((1 + len(AGGREGATORS) * len(self.scalers)) * channels, channels)
        self.lin = nn.Linear(channels, channels)

    def messages(self, lower: Tensor, upper: Tensor, edges: Tensor, reverse: bool) -> Tensor:
        """``[B, d_{l+1}, d_l, C]``: the messages along one direction of a layer pair."""
        scale, shift = self.edge_encoder(edges).chunk(2, dim=-1)
        return torch.addcmul(shift, scale, endpoint_sum(self.pre_source, self.pre_target, lower, upper, reverse))

    def forward(self, graph: LayeredGraph) -> list[Tensor]:
        x, L = graph.nodes, len(graph.nodes) - 1
        incoming: list[list[Tensor]] = [[] for _ in x]  # per layer: [B, d_l, k, C] blocks of messages
        for l in range(L):
            incoming[l + 1].append(self.messages(x[l], x[l + 1], graph.forward[l], reverse=False))
            if graph.backward is not None:
                incoming[l].append(self.messages(x[l], x[l + 1], graph.backward[l], reverse=True).transpose(1, 2))
        out = []
        for x_l, blocks in zip(x, incoming):  # a layer's blocks are aggregated as one, without concatenating them
            blocks = blocks or [x_l.new_zeros(*x_l.shape[:2], 0, x_l.shape[-1])]
            out.append(self.lin(self.post(torch.cat([x_l, aggregate(blocks, self.delta, self.scalers)], dim=-1))))
        return out


class EdgeMLP(nn.Module):
    """``e' = lin1(act(lin_e(e) + lin_s(x_source) + lin_t(x_target)))`` for the edges of both directions."""

    def __init__(self, node_channels: int, edge_channels: int):
        super().__init__()
        self.lin_e = Linear(edge_channels, edge_channels)
        self.lin_s = nn.Linear(node_channels, edge_channels)
        self.lin_t = nn.Linear(node_channels, edge_channels)
        self.lin1 = Linear(edge_channels, edge_channels)
        self.act = nn.SiLU()

    def update(self, edges: Tensor, lower: Tensor, upper: Tensor, reverse: bool) -> Tensor:
        return self.lin1(self.act(edge_sum(self.lin_e, self.lin_s, self.lin_t, edges, lower, upper, reverse)))

    def forward(self, graph: LayeredGraph) -> LayeredGraph:
        x = graph.nodes
        forward = [self.update(e, x[l], x[l + 1], False) for l, e in enumerate(graph.forward)]
        backward = None if graph.backward is None else [
            self.update(e, x[l], x[l + 1], True) for l, e in enumerate(graph.backward)]
        return graph.with_edges(forward, backward)


class GraphLayerNorm(nn.Module):
    """Layer norm over all nodes and channels of each network (PyG's ``LayerNorm``, ``mode="graph"``,
    one graph per network), then a per-channel affine map. Unlike a per-node ``LayerNorm`` it keeps
    how the nodes of a network differ in mean and scale; it is invariant to permuting its nodes."""

    def __init__(self, channels: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, nodes: Sequence[Tensor]) -> list[Tensor]:
        x = torch.cat(list(nodes), dim=1)  # [B, N, C]: every neuron of each network
        var, mean = torch.var_mean(x.float(), dim=(1, 2), unbiased=False, keepdim=True)
        scale = torch.rsqrt(var + self.eps)
        # in float32 (the node states are small beside the edges'), back in each input's dtype (bf16 stays bf16)
        return [torch.addcmul(self.bias, (n - mean) * scale, self.weight).to(n.dtype) for n in nodes]


class NodeLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` of each node's channels (``ng-gnn`` version 1)."""

    def forward(self, nodes: Sequence[Tensor]) -> list[Tensor]:
        return [super(NodeLayerNorm, self).forward(x) for x in nodes]


PNA_NORMS = {"graph": GraphLayerNorm, "node": NodeLayerNorm}


class PNABackbone(nn.Module):
    """``num_layers`` :class:`PNAConv` layers; layer norm, SiLU, dropout and an edge update between them."""

    def __init__(self, widths: Sequence[int], channels: int, num_layers: int = 4, dropout: float = 0.0,
                 bidirectional: bool = True, scalers: Sequence[str] = ("identity", "amplification"),
                 norm: str = "graph"):
        super().__init__()
        if norm not in PNA_NORMS:
            raise ValueError(f"ng-gnn norm must be one of {sorted(PNA_NORMS)}, got {norm!r}")
        degrees = in_degrees(widths, bidirectional)
        delta = mean_log_degree(degrees, widths)
        self.convs = nn.ModuleList(PNAConv(channels, channels, delta, scalers) for _ in range(num_layers))
        self.norms = nn.ModuleList(PNA_NORMS[norm](channels) for _ in range(num_layers - 1))
        self.edge_updates = nn.ModuleList(EdgeMLP(channels, channels) for _ in range(num_layers - 1))
        self.act, self.dropout = nn.SiLU(), nn.Dropout(dropout)

    def forward(self, graph: LayeredGraph) -> LayeredGraph:
        for i, conv in enumerate(self.convs):
            nodes = conv(graph)
            if i == len(self.convs) - 1:
                return graph.with_nodes(nodes)
            nodes = [self.dropout(self.act(x)) for x in self.norms[i](nodes)]
            graph = self.edge_updates[i](graph.with_nodes(nodes))
        return graph
