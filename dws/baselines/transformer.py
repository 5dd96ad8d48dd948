"""Baseline (v): the weight Transformer of Schürholt et al. (2021).

Every neuron becomes a token (its incoming weights and bias); attention runs between all rows of
all weight matrices and a pooled token gives the global representation of the input network.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from dws.baselines.common import Baseline, mlp_stack, neuron_rows
from dws.weightspace import WeightSpace

Tensor = torch.Tensor


class WeightTransformer(Baseline):
    """Per-layer Linear token embedding (rows of layer ``m`` have length ``d_m + 1``), learned
    position embeddings, ``n_layers`` TransformerEncoder layers of width ``hidden`` (``num_heads``
    heads, feed-forward ``ff_mult * hidden``), CLS or mean pooling, then a Linear/BN/ReLU + Linear
    head.

    With ``positional=True`` (the original) the model sees token order, so no permutation
    invariance. With ``positional=False`` it is invariant to reordering the rows inside a layer (not
    to the weight-space symmetry, which also reorders the entries of the next layer's rows).
    """

    def __init__(
        self,
        widths: Sequence[int],
        out_features: int,
        hidden: int = 64,
        n_layers: int = 4,
        num_heads: int = 2,
        ff_mult: int = 2,
        dropout: float = 0.0,
        pooling: str = "cls",
        positional: bool = True,
    ):
        super().__init__(widths, out_features)
        if hidden % num_heads:
            raise ValueError(f"hidden={hidden} must be a multiple of num_heads={num_heads}")
        if pooling not in ("cls", "mean"):
            raise ValueError(f"pooling must be 'cls' or 'mean', got {pooling!r}")
        self.pooling = pooling
        self.embed = nn.ModuleList(nn.Linear(d + 1, hidden) for d in self.widths[:-1])
        num_tokens = sum(self.widths[1:])
        self.position = nn.Parameter(torch.randn(num_tokens, hidden) * 0.02) if positional else None
        self.cls = nn.Parameter(torch.randn(1, 1, hidden) * 0.02) if pooling == "cls" else None
        layer = nn.TransformerEncoderLayer(
            hidden, num_heads, ff_mult * hidden, dropout, activation="relu", batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.head = mlp_stack(hidden, [hidden], out_features)

    @classmethod
    def width_multiple(cls, num_heads: int = 2, **kw) -> int:
        """Sizing must keep ``hidden`` divisible by ``num_heads``."""
        return num_heads

    def forward(self, ws: WeightSpace) -> Tensor:
        rows = neuron_rows(self.plain(ws))
        tokens = torch.cat([emb(r) for emb, r in zip(self.embed, rows)], dim=1)
        if self.position is not None:
            tokens = tokens + self.position
        if self.cls is not None:
            tokens = torch.cat([self.cls.expand(tokens.shape[0], -1, -1), tokens], dim=1)
        h = self.encoder(tokens)
        pooled = h[:, 0] if self.cls is not None else h.mean(dim=1)
        return self.head(pooled)
