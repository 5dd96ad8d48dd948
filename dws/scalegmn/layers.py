"""One ScaleGMN message-passing layer on the dense per-layer graph (:mod:`dws.scalegmn.graph`).

Forward variant (``scalegmn``, the paper's Eq. 6-8): every neuron of layer ``l + 1`` receives from
every neuron ``j`` of layer ``l`` the message ``MSG(w_e(e_ij) * w_v(x_j))`` (an
:class:`~dws.scalegmn.equivariant.EquivariantMap`; the product scales like the receiver), summed,
then ``x_i <- UPD([x_i, m_i])``. Bidirectional variant (``scalegmn-b``): neurons of layer ``l`` also
receive from layer ``l + 1`` along the backward edges (own message function), and
``x_i <- UPD([x_i, m_i^fw, m_i^bw])``. Edges are updated by :class:`~dws.scalegmn.equivariant.EdgeUpdate`
from the layer's input nodes; under sign symmetry the backward edges keep their initial features
(as in the reference code), under positive scaling they get their own update. Over initial edges
``e_ij = w_ij v`` (:class:`~dws.scalegmn.linear.ScaledEdges`) the message's linear maps run per sender
and are scaled by ``w_ij`` after, ``w_e(w_ij v) * w_v(x_j) = w_ij (w_e(v) * w_v(x_j))``: the same
function without the per-edge products before its first nonlinearity (``w_e``, the message's ``W``
and its gate's first map; the forward edges in the first layer, the backward edges in every layer
under sign symmetry).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from dws.scalegmn.equivariant import EdgeUpdate, EquivariantMap
from dws.scalegmn.linear import Linear, ScaledEdges

Tensor = torch.Tensor


def is_hidden(layer: int, nodes: list) -> bool:
    return 0 < layer < len(nodes) - 1


class Read(NamedTuple):
    """Which of a layer's outputs a later layer or the readout reads: node layers, forward edges (layer
    pairs) and backward edges. A layer computes only these (the others come back as None): the readout
    sees the input and output neurons only, so the last layers' work on hidden neurons and edges that
    nothing reads any more (most of the last layer's messages) is skipped, with the same result."""

    nodes: frozenset[int]
    edges: frozenset[int]
    backward: frozenset[int]


class Messages(nn.Module):
    """One direction's summed messages: ``m_i = sum_j MSG(w_e(e_ij) * w_v(x_j), extra_j)``, ``extra_j``
    the sender's positional embedding (bidirectional variant, as the reference code indexes it)."""

    def __init__(self, d: int, symmetry: str, hidden: int, with_extra: bool):
        super().__init__()
        self.node_linear = Linear(d, d, bias=False)
        self.edge_linear = Linear(d, d, bias=False)
        self.message = EquivariantMap(d, d, symmetry, hidden, d_extra=d if with_extra else 0)
        self.with_extra = with_extra

    def forward(self, nodes: list[Tensor], edges: list[Tensor], embeddings: list[Tensor], backward: bool,
                receivers=None) -> list[Tensor | None]:
        """Per node layer its summed messages (zeros where no edge arrives); only for ``receivers`` (all when
        None), None for the others."""
        received = [torch.zeros_like(x) if receivers is None or l in receivers else None for l, x in enumerate(nodes)]
        for l, e in enumerate(edges):  # e: [B, n_{l+1}, n_l, d]
            receiver = l if backward else l + 1
            if received[receiver] is None:
                continue
            if backward:  # senders: layer l + 1 (rows), receivers: layer l (columns)
                sent, extra, axis = self.node_linear(nodes[l + 1])[:, :, None], embeddings[l + 1][:, None], 1
            else:
                sent, extra, axis = self.node_linear(nodes[l])[:, None], embeddings[l], 2
            x = (e.per_vector(lambda v: self.edge_linear(v) * sent) if isinstance(e, ScaledEdges)  # noqa: B023
                 else self.edge_linear(e) * sent)  # w_e(w_ij v) * w_v(x_j) = w_ij (w_e(v) * w_v(x_j)): per sender
            m = self.message(x, extra if self.with_extra else None, is_hidden(receiver, nodes))
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

    def reads(self, wanted: Read, last: int) -> Read:
        """What this layer reads of its inputs to compute ``wanted`` (node layers ``0..last``)."""
        forward_in = {l - 1 for l in wanted.nodes if l > 0}  # node l hears layer l - 1 over edges[l - 1]
        backward_in = ({l for l in wanted.nodes if l < last}  # node l hears layer l + 1 over backward[l]
                       if self.backward_messages is not None else set())
        updated_edges = set(wanted.edges if self.edge_update is not None else ()) | \
            set(wanted.backward if self.backward_edge_update is not None else ())  # edge p reads nodes p, p + 1
        nodes = (set(wanted.nodes) | forward_in | {l + 1 for l in backward_in}
                 | {q for p in updated_edges for q in (p, p + 1)})
        return Read(frozenset(nodes), frozenset(forward_in | set(wanted.edges)),
                    frozenset(backward_in | set(wanted.backward)))

    def forward(self, nodes: list[Tensor], edges: list[Tensor], backward_edges: list[Tensor] | None,
                embeddings: list[Tensor], wanted: Read | None = None):
        """``wanted``: compute only these outputs (:class:`Read`; all when None)."""
        def keep(kind: str, l: int) -> bool:
            return wanted is None or l in getattr(wanted, kind)

        receivers = None if wanted is None else wanted.nodes
        inputs = [nodes, self.forward_messages(nodes, edges, embeddings, backward=False, receivers=receivers)]
        if self.backward_messages is not None:
            inputs.append(self.backward_messages(nodes, backward_edges, embeddings, backward=True, receivers=receivers))
        new_nodes = [self.update(torch.cat(parts, dim=-1), embeddings[l] if self.extras_in_updates else None,
                                 is_hidden(l, nodes)) if keep("nodes", l) else None
                     for l, parts in enumerate(zip(*inputs))]
        if self.edge_update is not None:  # from the layer's input nodes: source x_j [B, 1, n_l, d], target x_i [B, n_{l+1}, 1, d]
            edges = [self.edge_update(e, nodes[l][:, None], nodes[l + 1][:, :, None]) if keep("edges", l) else None
                     for l, e in enumerate(edges)]
        if self.backward_edge_update is not None:
            backward_edges = [self.backward_edge_update(e, nodes[l + 1][:, :, None], nodes[l][:, None])
                              if keep("backward", l) else None for l, e in enumerate(backward_edges)]
        return new_nodes, edges, backward_edges
