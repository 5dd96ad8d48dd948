"""The neural graph of a batch of same-architecture MLPs, held as dense per-layer tensors.

Neurons are nodes, biases their features, weights the features of the edges between consecutive
layers (Kofinas et al., ICLR 2024, Sec. 3). All networks of a batch share one layered graph, so
instead of an edge list each layer pair is one dense tensor in the weight's own layout:

* ``nodes[l]``: ``[B, d_l, C]``, the neurons of layer ``l = 0..L``;
* ``forward[l]``: ``[B, d_{l+1}, d_l, E]``, the edge from neuron ``i`` of layer ``l`` to neuron ``o``
  of layer ``l+1`` at ``[o, i]`` (where ``W_{l+1}[o, i]`` is);
* ``backward[l]``: the same shape, the reverse edge (``o`` -> ``i``) at ``[o, i]``: messages also
  flow from a layer to the one before it, each direction with its own edge state (the reference
  code's ``rev_edge_features=True``); ``None`` for a forward-only graph.

A hidden-neuron permutation permutes the rows of a layer's tensors and the matching axes of the
edge tensors, so every per-node and per-edge map commutes with it. The linear maps of per-edge
features are :class:`dws.ops.linear.Linear` (a 1x1 convolution on CPUs, ~1.5x ``F.linear`` there);
those of per-node features stay ``nn.Linear`` (docs/dws.md, "ng-gnn and ng-transformer").
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from dws.ops.linear import linear

Tensor = torch.Tensor


@dataclass(frozen=True)
class LayeredGraph:
    """Node states per layer and edge states per layer pair (see the module docstring)."""

    nodes: tuple[Tensor, ...]
    forward: tuple[Tensor, ...]
    backward: tuple[Tensor, ...] | None = None

    @property
    def widths(self) -> tuple[int, ...]:
        return tuple(x.shape[1] for x in self.nodes)

    def with_nodes(self, nodes) -> "LayeredGraph":
        return replace(self, nodes=tuple(nodes))

    def with_edges(self, forward, backward) -> "LayeredGraph":
        return replace(self, forward=tuple(forward), backward=None if backward is None else tuple(backward))


def endpoint_sum(source: nn.Module, target: nn.Module, lower: Tensor, upper: Tensor, reverse: bool,
                 biases: bool = True) -> Tensor:
    """``source(x_s) + target(x_t)`` for every edge between ``lower`` (``[B, d_l, C]``) and ``upper``
    (``[B, d_{l+1}, C]``), in the edge layout ``[B, d_{l+1}, d_l, E]``; forward edges go from
    ``lower`` to ``upper``, ``reverse`` ones from ``upper`` to ``lower``. ``biases=False``: the two
    maps' weights only (:func:`edge_sum` adds their biases elsewhere)."""
    s_node, t_node = (upper, lower) if reverse else (lower, upper)
    if biases:
        s, t = source(s_node), target(t_node)
    else:
        s, t = nn.functional.linear(s_node, source.weight), nn.functional.linear(t_node, target.weight)
    return (s[:, :, None] + t[:, None]) if reverse else (s[:, None] + t[:, :, None])


def edge_sum(edge: nn.Linear, source: nn.Linear, target: nn.Linear, edges: Tensor, lower: Tensor, upper: Tensor,
             reverse: bool) -> Tensor:
    """``edge(e) + source(x_s) + target(x_t)`` for every edge (the edge updates of both neural graphs), the
    three biases added once, as the edge map's.

    Same sum, same parameters; but with a bias each, the gradient of the edge map's bias and that of an
    endpoint map's (where the other layer has one neuron, an INR's output) are one and the same reduction,
    and torch 2.13's inductor writes that reduction into two outputs under one C++ name in bfloat16
    (``conflicting declaration 'auto at_BFloat16_tmp_acc0_vec'``): ``--compile --precision bf16`` failed
    to build for ``ng-gnn`` and ``ng-transformer`` (session 32, docs/dws.md)."""
    bias = edge.bias + source.bias + target.bias
    return linear(edges, edge.weight, bias) + endpoint_sum(source, target, lower, upper, reverse, biases=False)
