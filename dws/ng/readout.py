"""The invariant readout: the output neurons' features, concatenated, then an MLP.

The reference code's INR classifiers pool with ``pooling_method="cat"``, ``pooling_layer_idx="last"``:
the ``d_L`` output neurons are never permuted, so concatenating their final features (in their
order) is invariant to hidden-neuron permutations while keeping which output is which.
"""

from __future__ import annotations

import torch
from torch import nn


class OutputNeuronHead(nn.Module):
    """``[B, d_L, C]`` -> ``[B, out_features]``: flatten, then Linear(-ReLU-Linear)^``depth``."""

    def __init__(self, outputs: int, channels: int, hidden: int, out_features: int, depth: int = 2):
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(outputs * channels, hidden)]
        for _ in range(depth - 2):
            layers += [nn.ReLU(), nn.Linear(hidden, hidden)]
        layers += [nn.ReLU(), nn.Linear(hidden, out_features)]
        self.mlp = nn.Sequential(*layers)

    def forward(self, output_nodes: torch.Tensor) -> torch.Tensor:
        return self.mlp(output_nodes.flatten(1))
