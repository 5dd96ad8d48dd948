"""Scale-equivariant maps: ``x -> W x * g(x)`` with ``g`` invariant to the neuron's scaling (the
paper's ScaleEq layer). When ``x -> q x``, ``W x -> q W x`` (linear, no bias) and ``g`` is unchanged.

:class:`EquivariantMap` is the message and update function of a node; its gate depends on whom the
features belong to. A hidden neuron's features scale, so its gate sees them through the invariant
map (:mod:`dws.scalegmn.symmetry`); an input or output neuron has no scaling, so its gate is a plain
MLP of the raw features (the reference code's ``equiv_on_hidden`` with two MLPs). :class:`EdgeUpdate`
updates an edge (weight) feature, which scales with the ratio of its two neurons' factors.
"""

from __future__ import annotations

import torch
from torch import nn

from dws.scalegmn.linear import Linear
from dws.scalegmn.mlp import MLP
from dws.scalegmn.symmetry import invariant_map

Tensor = torch.Tensor


class EquivariantMap(nn.Module):
    """``x -> W x * MLP([inv(x), extra])`` on hidden neurons, ``W x * MLP'([x, extra])`` on input and
    output neurons; ``extra`` (a positional embedding) is invariant."""

    def __init__(self, d_in: int, d_out: int, symmetry: str, hidden: int, d_extra: int = 0):
        super().__init__()
        self.linear = Linear(d_in, d_out, bias=False)
        self.invariant = invariant_map(symmetry, d_in)
        self.gate_hidden = MLP(d_in, hidden, d_out, d_extra)
        self.gate_io = MLP(d_in, hidden, d_out, d_extra)

    def forward(self, x: Tensor, extra: Tensor | None, hidden: bool) -> Tensor:
        gate = self.gate_hidden(x, extra, invariant=self.invariant) if hidden else self.gate_io(x, extra)
        return self.linear(x) * gate


class EdgeUpdate(nn.Module):
    """``e_ij -> W e_ij * MLP([inv(x_j), inv(x_i)])``: the edge from neuron ``j`` (layer ``l - 1``) to
    ``i`` (layer ``l``) keeps its factor ``q_i / q_j``; the gate sees both neurons only through the
    invariant map. ``x_source`` is ``[B, 1, n_{l-1}, d]``, ``x_target`` ``[B, n_l, 1, d]``."""

    def __init__(self, d_node: int, d_edge: int, d_out: int, symmetry: str, hidden: int):
        super().__init__()
        self.linear = Linear(d_edge, d_out, bias=False)
        self.invariant = invariant_map(symmetry, d_node)
        self.gate = MLP(d_node, hidden, d_out, d_extra=d_node)

    def forward(self, e: Tensor, x_source: Tensor, x_target: Tensor) -> Tensor:
        return self.linear(e) * self.gate(self.invariant(x_source), self.invariant(x_target))
