"""Baseline (iv): the INR2Vec encoder architecture (Luigi et al. 2023), without its pre-training.

INR2Vec reads the weights as a set of rows: one shared MLP (their 1x1 convolutions with BN and
ReLU) maps every row, max pooling merges them, a head maps the pooled vector to the output.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from dws.baselines.common import Baseline, mlp_stack, neuron_rows
from dws.weightspace import WeightSpace

Tensor = torch.Tensor


class INR2Vec(Baseline):
    """Shared row encoder (``n_layers`` Linear/BN/ReLU blocks of width ``hidden``), max pooling over
    all rows, Linear head.

    Rows: INR2Vec stacks rows of one common hidden width; our input networks may have any widths,
    so a row is one neuron's ``[incoming weights | bias]`` (length ``d_m + 1``), zero-padded to
    ``max_m d_m + 1`` and followed by a one-hot id of its layer so that rows of different layers
    stay distinguishable.

    Invariance: the output is invariant to any reordering of the rows (the layer tag travels with
    the row). It is *not* invariant to the weight-space symmetry: permuting hidden neurons of layer
    ``m`` also reorders the entries inside every row of layer ``m + 1``.
    """

    def __init__(
        self,
        widths: Sequence[int],
        out_features: int,
        hidden: int = 256,
        n_layers: int = 4,
        dropout: float = 0.0,
    ):
        super().__init__(widths, out_features)
        self.row_length = max(self.widths[:-1]) + 1
        in_features = self.row_length + len(self.widths) - 1
        self.encoder = mlp_stack(in_features, [hidden] * n_layers, None, dropout)
        self.head = mlp_stack(hidden, [], out_features)

    def rows(self, ws: WeightSpace) -> Tensor:
        """``[B, sum_m d_{m+1}, row_length + M]``: padded, layer-tagged neuron rows."""
        num_layers = ws.num_layers
        parts = []
        for m, r in enumerate(neuron_rows(ws)):
            tag = F.one_hot(torch.tensor(m), num_layers).to(r)
            parts.append(
                torch.cat(
                    [
                        F.pad(r, (0, self.row_length - r.shape[-1])),
                        tag.expand(*r.shape[:2], num_layers),
                    ],
                    dim=-1,
                )
            )
        return torch.cat(parts, dim=1)

    def forward(self, ws: WeightSpace) -> Tensor:
        x = self.rows(self.plain(ws))
        b, n, f = x.shape
        h = self.encoder(x.reshape(b * n, f)).reshape(b, n, -1)
        return self.head(h.max(dim=1).values)
