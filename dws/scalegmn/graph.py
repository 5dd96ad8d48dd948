"""A batch of MLPs as graphs: one node per neuron, one edge per weight, kept dense layer by layer.

``nodes[l]`` is ``[B, n_l, d]`` (layer ``l = 0..L``) and ``edges[l]`` is ``[B, n_{l+1}, n_l, d]`` (the
weight matrix ``W_{l+1}``, rows: the receiving neurons), the layout of :mod:`dws.weightspace`. A node's
initial feature is its bias, an input neuron's is 1 (it has none); an edge's is its weight; both
are projected to ``d`` channels by linear maps without bias, which keeps every scaling. A weight of
one channel times the projection's vector (and its embedding) stays in that form,
:class:`~dws.scalegmn.linear.ScaledEdges`, so that the layers map the vector, not every edge.

Positional embeddings (the reference code's node and edge types): every input and output neuron
has its own learned vector, all neurons of one hidden layer share one (so that hidden permutations
remain a symmetry). Input and output features *add* theirs (they do not scale); hidden features are
*multiplied* by theirs elementwise, which keeps ``x -> q x``. Edge embeddings (the forward variant)
multiply: one per input neuron on ``W_1``'s columns, one per hidden layer pair, one per output
neuron on ``W_L``'s rows.
"""

from __future__ import annotations

import torch
from torch import nn

from dws.scalegmn.linear import ScaledEdges
from dws.weightspace import WeightSpace

Tensor = torch.Tensor


class NodeEmbedding(nn.Module):
    """The learned positional vector of every neuron: ``vectors()[l]`` is ``[n_l, d]`` or ``[1, d]``."""

    def __init__(self, widths, d: int):
        super().__init__()
        self.inputs = nn.Parameter(torch.randn(widths[0], d))
        self.hidden = nn.Parameter(torch.randn(len(widths) - 2, d))
        self.outputs = nn.Parameter(torch.randn(widths[-1], d))

    def vectors(self) -> list[Tensor]:
        return [self.inputs, *self.hidden[:, None], self.outputs]

    def forward(self, nodes: list[Tensor]) -> list[Tensor]:
        vectors, last = self.vectors(), len(nodes) - 1
        return [x + p if l in (0, last) else x * p for l, (x, p) in enumerate(zip(nodes, vectors))]


class EdgeEmbedding(nn.Module):
    """Multiplies every edge feature by its type's learned vector (see the module docstring)."""

    def __init__(self, widths, d: int):
        super().__init__()
        self.inputs = nn.Parameter(torch.randn(widths[0], d))
        self.hidden = nn.Parameter(torch.randn(max(len(widths) - 3, 0), d))
        self.outputs = nn.Parameter(torch.randn(widths[-1], 1, d))

    def forward(self, edges: list[Tensor | ScaledEdges]) -> list[Tensor | ScaledEdges]:
        vectors = [self.inputs, *self.hidden][: len(edges) - 1] + [self.outputs]
        return [e.per_vector(p.mul) if isinstance(e, ScaledEdges) else e * p for e, p in zip(edges, vectors)]


def neuron_values(ws: WeightSpace) -> list[Tensor]:
    """``[B, n_l, C]`` per layer: ones for the input neurons, then the biases."""
    ws = ws.with_channels()
    b0 = ws.biases[0]
    ones = b0.new_ones(b0.shape[0], ws.widths[0], b0.shape[-1])
    return [ones, *ws.biases]


def initial_edges(projection: nn.Linear, w: Tensor) -> Tensor | ScaledEdges:
    """``projection(w)``: for one channel, ``w_ij`` times the projection's vector, kept apart
    (:class:`~dws.scalegmn.linear.ScaledEdges`: the layers map the vector, not every edge)."""
    return ScaledEdges(w, projection.weight[:, 0]) if w.shape[-1] == 1 else projection(w)


def reciprocal(w: Tensor, floor: float = 1e-6) -> Tensor:
    """``1 / w``, its magnitude capped at ``1 / floor`` (finite for zero weights; exact above ``floor``)."""
    return torch.where(w < 0, -1.0, 1.0).to(w.dtype) / w.abs().clamp_min(floor)


class GraphInit(nn.Module):
    """Weight space -> (nodes, edges, backward edges or None) with ``d`` channels, embeddings applied.

    Backward edges (the bidirectional variant) carry a weight seen from its output neuron: the weight
    itself under sign symmetry (``q^-1 = q``), its reciprocal under positive scaling, so that a
    backward message ``x_i * (1 / w_ij)`` scales like the receiving neuron ``j`` (the paper's
    ScaleGMN-B; the reference data code's ``bw_edge_attr``)."""

    def __init__(self, widths, d: int, symmetry: str, in_channels: int = 1, bidirectional: bool = False,
                 edge_embedding: bool = False):
        super().__init__()
        self.symmetry = symmetry
        self.node_proj = nn.Linear(in_channels, d, bias=False)
        self.edge_proj = nn.Linear(in_channels, d, bias=False)
        self.backward_proj = nn.Linear(in_channels, d, bias=False) if bidirectional else None
        self.node_embedding = NodeEmbedding(widths, d)
        self.edge_embedding = EdgeEmbedding(widths, d) if edge_embedding else None

    def forward(self, ws: WeightSpace) -> tuple[list[Tensor], list[Tensor | ScaledEdges],
                                                list[Tensor | ScaledEdges] | None]:
        ws = ws.with_channels()
        nodes = self.node_embedding([self.node_proj(v) for v in neuron_values(ws)])
        edges = [initial_edges(self.edge_proj, w) for w in ws.weights]
        if self.edge_embedding is not None:
            edges = self.edge_embedding(edges)
        backward = None
        if self.backward_proj is not None:
            seen_back = (lambda w: w) if self.symmetry == "sign" else reciprocal  # noqa: E731
            backward = [initial_edges(self.backward_proj, seen_back(w)) for w in ws.weights]
        return nodes, edges, backward
