"""Entry-wise and per-channel modules on weight spaces: ReLU, dropout, batch normalization.

They act the same way on every entry of a tensor (BN statistics pool over the batch and all
positions of one tensor), so they commute with the neuron permutations and keep equivariance.
"""

from __future__ import annotations

import torch
from torch import nn

from dws.weightspace import WeightSpace

Tensor = torch.Tensor


class WSReLU(nn.Module):
    def forward(self, ws: WeightSpace) -> WeightSpace:
        return ws.map(torch.relu)


class WSDropout(nn.Module):
    """Element-wise dropout on every weight and bias entry (equivariant in distribution)."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.p = float(p)

    def forward(self, ws: WeightSpace) -> WeightSpace:
        if self.p == 0.0 or not self.training:
            return ws
        return ws.map(lambda t: nn.functional.dropout(t, self.p, training=True))


class WSBatchNorm(nn.Module):
    """One ``BatchNorm1d`` over the channels of each weight and each bias tensor.

    Each tensor gets its own statistics because weights of different layers live on different
    scales; within a tensor all positions share them, which is what keeps the map equivariant.
    With ``relu=True`` a ReLU follows (in place on batch norm's fresh output, whose backward needs
    only its input). :mod:`dws.nn.fast` has a native form of batch norm + ReLU.
    """

    def __init__(self, num_layers: int, channels: int, relu: bool = False, **bn_kwargs):
        super().__init__()
        self.relu = relu
        self.weight_norms = nn.ModuleList(nn.BatchNorm1d(channels, **bn_kwargs) for _ in range(num_layers))
        self.bias_norms = nn.ModuleList(nn.BatchNorm1d(channels, **bn_kwargs) for _ in range(num_layers))

    def forward(self, ws: WeightSpace) -> WeightSpace:
        self.check_input(ws.weights[0], len(ws.weights))
        return WeightSpace(
            tuple(self.normalize(bn, w) for bn, w in zip(self.weight_norms, ws.weights)),
            tuple(self.normalize(bn, b) for bn, b in zip(self.bias_norms, ws.biases)),
        )

    def check_input(self, first_weight: Tensor, num_layers: int) -> None:
        if first_weight.dim() != 4 or num_layers != len(self.weight_norms):
            raise ValueError(
                f"WSBatchNorm expects a weight space with channels and {len(self.weight_norms)} layers"
            )

    def normalize(self, bn: nn.BatchNorm1d, x: Tensor) -> Tensor:
        """``bn`` (then the ReLU) over the channels (last axis) of one tensor ``[B, ..., C]``."""
        flat = x.reshape(-1, x.shape[-1])
        if bn.training and flat.shape[0] == 1:  # one value per channel (b_M of a single network):
            out = flat * 0 + bn.bias  # centred it is 0, so BN gives beta; torch's BN would raise
        else:
            out = bn(flat)
        return (out.relu_() if self.relu else out).reshape(x.shape)


def activation_block(num_layers: int, channels: int, bn: bool, dropout: float) -> list[nn.Module]:
    """The modules that follow a hidden DWS layer: BN+ReLU (one module) or ReLU, then dropout."""
    mods: list[nn.Module] = [WSBatchNorm(num_layers, channels, relu=True) if bn else WSReLU()]
    if dropout > 0:
        mods.append(WSDropout(dropout))
    return mods
