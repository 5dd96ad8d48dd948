"""What every baseline shares: the base class, the Linear/BN/ReLU stack and the neuron-row view.

All baselines follow the DWSNet model interface: built from the input networks' ``widths``
``(d_0, ..., d_M)`` and ``out_features``; ``forward(ws) -> [B, out_features]``;
``prepare(train_ws)`` for data-dependent setup (a no-op here, so a trainer can call it for every
model).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from dws.weightspace import WeightSpace

Tensor = torch.Tensor


def check_widths(widths: Sequence[int]) -> tuple[int, ...]:
    """``widths`` as a tuple of positive ints, with a clear error for anything else."""
    widths = tuple(widths)
    if len(widths) < 2 or not all(isinstance(d, int) and d > 0 for d in widths):
        raise ValueError(
            f"widths must be (d_0, ..., d_M) with M >= 1 positive ints, got {widths!r}"
        )
    return widths


def num_weights(widths: Sequence[int]) -> int:
    """Size of the flattened weight space (all weights and biases)."""
    return sum(a * b + b for a, b in zip(widths[:-1], widths[1:]))


def mlp_stack(
    in_features: int, hidden: Sequence[int], out_features: int | None, dropout: float = 0.0
) -> nn.Sequential:
    """``[Linear -> BatchNorm -> ReLU -> Dropout] * len(hidden)``, then a Linear head if asked.

    The paper trains every method with ReLU and BatchNorm; all baselines build their dense parts
    here so that they differ only in how they read the weights.
    """
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(in_features, h), nn.BatchNorm1d(h), nn.ReLU()]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        in_features = h
    if out_features is not None:
        layers.append(nn.Linear(in_features, out_features))
    return nn.Sequential(*layers)


def neuron_rows(ws: WeightSpace) -> list[Tensor]:
    """Per layer ``m``, ``[B, d_{m+1}, d_m + 1]``: each neuron's incoming weights and its bias.

    The token/point unit of the set and sequence baselines (INR2Vec, Transformer).
    """
    return [torch.cat([w, b.unsqueeze(-1)], dim=-1) for w, b in zip(ws.weights, ws.biases)]


class Baseline(nn.Module):
    """Base class: stores and checks the architecture; ``prepare`` does nothing by default."""

    def __init__(self, widths: Sequence[int], out_features: int):
        super().__init__()
        self.widths = check_widths(widths)
        if not isinstance(out_features, int) or out_features < 1:
            raise ValueError(f"out_features must be a positive int, got {out_features!r}")
        self.out_features = out_features

    @classmethod
    def width_multiple(cls, **kw) -> int:
        """For sizing: ``hidden`` must be a multiple of this given the other constructor args."""
        return 1

    def prepare(self, train_ws: WeightSpace) -> None:
        """Data-dependent setup before training; nothing to do for most baselines."""

    def plain(self, ws: WeightSpace) -> WeightSpace:
        """``ws`` without a trailing channel dim, after checking it matches ``self.widths``."""
        if ws.widths != self.widths:
            raise ValueError(
                f"{type(self).__name__} was built for widths {self.widths}, got {ws.widths}"
            )
        if ws.has_channels:
            channels = ws.weights[0].shape[-1]
            if channels != 1:
                raise ValueError(
                    f"{type(self).__name__} takes one channel, got {channels} channels"
                )
            ws = ws.map(lambda t: t.squeeze(-1))
        return ws
