"""One ScaleGMN message-passing layer on the dense per-layer graph (:mod:`dws.scalegmn.graph`).

Forward variant (``scalegmn``, the paper's Eq. 6-8): every neuron of layer ``l + 1`` receives from
every neuron ``j`` of layer ``l`` the message ``MSG(w_e(e_ij) * w_v(x_j))`` (an
:class:`~dws.scalegmn.equivariant.EquivariantMap`; the product scales like the receiver), summed,
then ``x_i <- UPD([x_i, m_i])``. Bidirectional variant (``scalegmn-b``): neurons of layer ``l`` also
receive from layer ``l + 1`` along the backward edges (own message function), and
``x_i <- UPD([x_i, m_i^fw, m_i^bw])``. Edges are updated by :class:`~dws.scalegmn.equivariant.EdgeUpdate`
from the layer's input nodes; under sign symmetry the backward edges keep their initial features
(as in the reference code), under positive scaling they get their own update.
"""

from __future__ import annotations

import torch
from torch import nn

from dws.scalegmn.equivariant import EdgeUpdate, EquivariantMap

Tensor = torch.Tensor


def is_hidden(layer: int, nodes: list[Tensor]) -> bool:
    return 0 < layer < len(nodes) - 1


class Messages(nn.Module):
    """One direction's summed messages: ``m_i = sum_j MSG(w_e(e_ij) * w_v(x_j), extra_j)``, ``extra_j``
    the sender's positional embedding (bidirectional variant, as the reference code indexes it)."""

    def __init__(self, d: int, symmetry: str, hidden: int, with_extra: bool):
        super().__init__()
        self.node_linear = nn.Linear(d, d, bias=False)
        self.edge_linear = nn.Linear(d, d, bias=False)
        self.message = EquivariantMap(d, d, symmetry, hidden, d_extra=d if with_extra else 0)
        self.with_extra = with_extra

    def forward(self, nodes: list[Tensor], edges: list[Tensor], embeddings: list[Tensor], backward: bool) -> list[Tensor]:
        received = [torch.zeros_like(x) for x in nodes]
        for l, e in enumerate(edges):  # e: [B, n_{l+1}, n_l, d]
            if backward:  # senders: layer l + 1 (rows), receivers: layer l (columns)
                sent, extra, receiver, axis = self.node_linear(nodes[l + 1])[:, :, None], embeddings[l + 1][:, None], l, 1
            else:
                sent, extra, receiver, axis = self.node_linear(nodes[l])[:, None], embeddings[l], l + 1, 2
            m = self.message(self.edge_linear(e) * sent, extra if self.with_extra else None, is_hidden(receiver, nodes))
            received[receiver] = m.sum(axis)
        return received


class ScaleGMNLayer(nn.Module):
    """Nodes, edges, backward edges (or None) -> the same, updated (see the module docstring)."""

    def __init__(self, d: int, symmetry: str, hidden: int, bidirectional: bool = False, update_edges: bool = True,
                 extras_in_messages: bool = False, extras_in_updates: bool = False):
        super().__init__()
        self.forward_messages = Messages(d, symmetry, hidden, extras_in_messages)
        self.backward_messages = Messages(d, symmetry, hidden, extras_in_messages) if bidirectional else None
        self.update = EquivariantMap((3 if bidirectional else 2) * d, d, symmetry, hidden,
                                     d_extra=d if extras_in_updates else 0)
        self.extras_in_updates = extras_in_updates
        self.edge_update = EdgeUpdate(d, d, d, symmetry, hidden) if update_edges else None
        self.backward_edge_update = (EdgeUpdate(d, d, d, symmetry, hidden)
                                     if update_edges and bidirectional and symmetry == "scale" else None)

    def forward(self, nodes: list[Tensor], edges: list[Tensor], backward_edges: list[Tensor] | None,
                embeddings: list[Tensor]):
        inputs = [nodes, self.forward_messages(nodes, edges, embeddings, backward=False)]
        if self.backward_messages is not None:
            inputs.append(self.backward_messages(nodes, backward_edges, embeddings, backward=True))
        new_nodes = [self.update(torch.cat(parts, dim=-1), embeddings[l] if self.extras_in_updates else None,
                                 is_hidden(l, nodes))
                     for l, parts in enumerate(zip(*inputs))]
        if self.edge_update is not None:  # from the layer's input nodes: source x_j [B, 1, n_l, d], target x_i [B, n_{l+1}, 1, d]
            edges = [self.edge_update(e, nodes[l][:, None], nodes[l + 1][:, :, None]) for l, e in enumerate(edges)]
        if self.backward_edge_update is not None:
            backward_edges = [self.backward_edge_update(e, nodes[l + 1][:, :, None], nodes[l][:, None])
                              for l, e in enumerate(backward_edges)]
        return new_nodes, edges, backward_edges
