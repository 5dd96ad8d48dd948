"""The invariant head: pool every tensor over its hidden-neuron axes, then an MLP.

:class:`HNPPool` averages each tensor over the axes the group permutes and keeps the axes of the
fixed input and output neurons (the reference code's ``HNPPool``, which its INR classifiers use for
NP and HNP models alike): ``W_1`` keeps its ``d_0`` columns, ``W_L`` and ``b_L`` their ``d_L`` rows,
every other tensor becomes one value per channel. The result is invariant to hidden-neuron
permutations, and not to input or output ones. :class:`MLPHead` is the code's ``MlpHead``: three
linear layers with ReLU (and dropout) between them.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from dws.weightspace import WeightSpace


def pooled_size(widths: Sequence[int], channels: int) -> int:
    """Features :class:`HNPPool` returns for networks of ``widths``."""
    L = len(widths) - 1
    return channels * (widths[0] + widths[-1] + (L - 2) + (L - 1) + widths[-1])


class HNPPool(nn.Module):
    """``WeightSpace`` with ``C`` channels -> ``[B, pooled_size(widths, C)]`` (needs ``L >= 2``)."""

    def forward(self, ws: WeightSpace) -> torch.Tensor:
        ws = ws.with_channels()
        L = ws.num_layers
        if L < 2:
            raise ValueError("HNPPool needs networks with a hidden layer")
        parts = [ws.weights[0].mean(dim=1).flatten(1)]  # per input neuron
        parts += [w.mean(dim=(1, 2)) for w in ws.weights[1:-1]]
        parts.append(ws.weights[-1].mean(dim=2).flatten(1))  # per output neuron
        parts += [b.mean(dim=1) for b in ws.biases[:-1]]
        parts.append(ws.biases[-1].flatten(1))  # per output neuron
        return torch.cat(parts, dim=-1)


class MLPHead(nn.Sequential):
    """``in_features -> hidden -> hidden -> out_features`` with ReLU and dropout between."""

    def __init__(self, in_features: int, hidden: int, out_features: int, dropout: float = 0.0):
        layers: list[nn.Module] = [nn.Linear(in_features, hidden)]
        for last in (False, True):
            layers.append(nn.ReLU())
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            layers.append(nn.Linear(hidden, out_features if last else hidden))
        super().__init__(*layers)
