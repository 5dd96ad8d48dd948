"""``ScaleGMNInvariant``: graph init, ScaleGMN layers, and the reference code's ``last_layer`` readout.

The two variants are the reference code's MNIST-INR configurations (``configs/mnist_cls``):

* ``forward`` (``scalegmn``): forward messages only, a bias-free linear skip connection around
  every layer, edge positional embeddings, no embeddings inside messages or updates; readout: an
  MLP of the output neurons' features.
* ``bidirectional`` (``scalegmn-b``): forward and backward messages, no skip connections, no edge
  embeddings, the sender's embedding in every message and the node's in every update; readout: the
  output and the input neurons' features, each flattened and mapped to ``d`` by a linear map, then
  an MLP of both.

Input and output neurons are not scaled (nor permuted), so a readout of their features alone is
invariant to every hidden permutation and scaling.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from dws.scalegmn.graph import GraphInit
from dws.scalegmn.layers import Read, ScaleGMNLayer
from dws.scalegmn.linear import Linear
from dws.scalegmn.mlp import MLP
from dws.scalegmn.symmetry import SYMMETRIES
from dws.weightspace import WeightSpace

VARIANTS = {
    "forward": dict(bidirectional=False, skip=True, edge_embedding=True, extras=False),
    "bidirectional": dict(bidirectional=True, skip=False, edge_embedding=False, extras=True),
}
# the paper's MNIST INR classifier (both variants): d_hid 128, 4 layers, MLPs of one hidden layer of 128
PAPER_HIDDEN, PAPER_LAYERS = 128, 4


class ScaleGMNInvariant(nn.Module):
    """Weight space -> ``R^out_features``, invariant to hidden-neuron permutations and to ``symmetry``
    (``"sign"``: sign flips, ``"scale"``: positive scalings) of hidden neurons.

    Args:
        widths: ``(d_0, ..., d_L)`` of the input MLPs (``L >= 2``).
        variant: ``"forward"`` or ``"bidirectional"`` (:data:`VARIANTS`).
        hidden: ``d``, the channels of every node and edge feature and the MLPs' hidden width.
        dropout: on the node features after every layer (the paper: 0.2).
    """

    def __init__(self, widths: Sequence[int], out_features: int, symmetry: str, variant: str = "forward",
                 hidden: int = PAPER_HIDDEN, num_layers: int = PAPER_LAYERS, dropout: float = 0.0, in_channels: int = 1):
        super().__init__()
        if symmetry not in SYMMETRIES:
            raise ValueError(f"symmetry must be one of {', '.join(SYMMETRIES)}, got {symmetry!r}")
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
        self.widths, self.symmetry, self.variant = tuple(int(w) for w in widths), symmetry, variant
        if len(self.widths) < 3:
            raise ValueError(f"ScaleGMN needs networks with a hidden layer, got widths {self.widths}")
        config, d = VARIANTS[variant], hidden
        self.bidirectional = config["bidirectional"]
        self.init = GraphInit(self.widths, d, symmetry, in_channels, self.bidirectional, config["edge_embedding"])
        self.layers = nn.ModuleList(
            ScaleGMNLayer(d, symmetry, d, self.bidirectional, update_edges=i < num_layers - 1,
                          extras_in_messages=config["extras"], extras_in_updates=config["extras"])
            for i in range(num_layers))
        self.skips = nn.ModuleList(Linear(d, d, bias=False) for _ in range(num_layers)) if config["skip"] else None
        self.dropout = nn.Dropout(dropout)
        n_in, n_out = self.widths[0], self.widths[-1]
        if self.bidirectional:
            self.project_inputs, self.project_outputs = nn.Linear(n_in * d, d), nn.Linear(n_out * d, d)
            self.readout = MLP(2 * d, d, out_features)
        else:
            self.readout = MLP(n_out * d, d, out_features)

    def reads(self) -> list[Read]:
        """Per layer, the outputs that a later layer or the readout reads (the input and output neurons at
        the end); each layer computes only those."""
        last = len(self.widths) - 1
        wanted = Read(frozenset({0, last} if self.bidirectional else {last}), frozenset(), frozenset())
        plan = []
        for layer in reversed(self.layers):
            plan.append(wanted)
            wanted = layer.reads(wanted, last)
        return plan[::-1]

    def forward(self, ws: WeightSpace) -> torch.Tensor:
        if tuple(ws.widths) != self.widths:
            raise ValueError(f"this ScaleGMN was built for widths {self.widths}, got networks of widths {ws.widths}")
        nodes, edges, backward = self.init(ws)
        embeddings = self.init.node_embedding.vectors()
        for i, (layer, wanted) in enumerate(zip(self.layers, self.reads())):
            updated, edges, backward = layer(nodes, edges, backward, embeddings, wanted)
            if self.skips is not None:
                updated = [None if u is None else self.skips[i](x) + u for x, u in zip(nodes, updated)]
            nodes = [None if x is None else self.dropout(x) for x in updated]
        outputs = nodes[-1].flatten(1)
        if not self.bidirectional:
            return self.readout(outputs)
        both = torch.cat([self.project_outputs(outputs), self.project_inputs(nodes[0].flatten(1))], dim=-1)
        return self.readout(both)
