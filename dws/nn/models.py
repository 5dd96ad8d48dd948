"""DWSNets: stacks of DWS layers with an invariant head or an equivariant (weight-space) output."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from dws.nn.invariant import DWSInvariantLayer
from dws.nn.layer import DWSLayer
from dws.nn.pointwise import activation_block
from dws.nn.reduction import FreeAxisLinear, Reduction, reduced_widths
from dws.weightspace import WeightSpace

def channel_list(hidden_channels: int | Sequence[int], num_layers: int) -> list[int]:
    """Per-layer output channels from an int (same for all) or a sequence of length ``num_layers``."""
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    if isinstance(hidden_channels, int):
        return [hidden_channels] * num_layers
    channels = [int(c) for c in hidden_channels]
    if len(channels) != num_layers:
        raise ValueError(f"hidden_channels has {len(channels)} entries, expected num_layers={num_layers}")
    return channels


def equivariant_stack(
    widths: Sequence[int], channels: Sequence[int], *, pool: str, blocks: str, bn: bool, dropout: float,
    activate_last: bool, last_init_scale: float = 1.0,
) -> nn.Sequential:
    """DWS layers ``channels[0] -> channels[1] -> ...``, each followed by [BN,] ReLU[, dropout]
    (the last one only if ``activate_last``), as a plain ``nn.Sequential``."""
    M = len(widths) - 1
    mods: list[nn.Module] = []
    n = len(channels) - 1
    for k in range(n):
        last = k == n - 1
        mods.append(
            DWSLayer(widths, channels[k], channels[k + 1], pool=pool, blocks=blocks,
                     init_scale=last_init_scale if last else 1.0)
        )
        if not last or activate_last:
            mods += activation_block(M, channels[k + 1], bn, dropout)
    return nn.Sequential(*mods)


def _reducer(widths: tuple[int, ...], target: tuple[int, ...]) -> nn.Module:
    return nn.Identity() if widths == target else FreeAxisLinear(widths, target)


class DWSNetInvariant(nn.Module):
    """Equivariant DWS layers, an invariant layer, and an MLP head: weight space -> ``R^out_features``.

    Args:
        widths: ``(d_0, ..., d_M)`` of the input MLPs.
        hidden_channels: channels of every DWS layer (int) or one per layer.
        num_layers: number of DWS layers (the paper uses 4).
        pool: POOL aggregation (``"max"`` in the paper).
        bn, dropout: per-tensor batch norm and dropout after each DWS layer.
        input_reduction: ``d_0'`` or ``(d_0', d_M')`` for the appendix's linear reduction.
        head_hidden: width of the invariant layer's output before the final linear map; None maps
            the invariant layer straight to ``out_features``.
        blocks: ``"all"`` or an ablation (``"B2B"``, ``"W2W"``, ``"W2W+B2B"``, ``"diagonal"``).
        in_channels: channels of the input weight space (1 for raw weights).
    """

    def __init__(
        self,
        widths: Sequence[int],
        out_features: int,
        hidden_channels: int | Sequence[int] = 48,
        num_layers: int = 4,
        pool: str = "max",
        bn: bool = True,
        dropout: float = 0.0,
        input_reduction: Reduction = None,
        head_hidden: int | None = 64,
        blocks: str = "all",
        in_channels: int = 1,
    ):
        super().__init__()
        self.widths = tuple(int(d) for d in widths)
        inner = reduced_widths(self.widths, input_reduction)
        channels = [in_channels] + channel_list(hidden_channels, num_layers)
        self.reduce = _reducer(self.widths, inner)
        self.encoder = equivariant_stack(
            inner, channels, pool=pool, blocks=blocks, bn=bn, dropout=dropout, activate_last=True
        )
        self.invariant = DWSInvariantLayer(inner, channels[-1], head_hidden or out_features, pool=pool)
        self.head = (
            nn.Sequential(nn.ReLU(), nn.Linear(head_hidden, out_features)) if head_hidden else nn.Identity()
        )

    def forward(self, ws: WeightSpace) -> torch.Tensor:
        return self.head(self.invariant(self.encoder(self.reduce(ws))))


class DWSNetEquivariant(nn.Module):
    """DWS layers from a weight space to a weight space of the same shapes (one channel out).

    ``num_layers`` counts all DWS layers, the last of which maps to one channel and is initialized
    with ``mu = output_init_scale`` (1e-3 in the paper when the output parameterizes a network), so
    a fresh model outputs almost zero. Input/output reduction (if any) is undone at the end.
    """

    def __init__(
        self,
        widths: Sequence[int],
        hidden_channels: int | Sequence[int] = 32,
        num_layers: int = 4,
        pool: str = "max",
        bn: bool = False,
        dropout: float = 0.0,
        input_reduction: Reduction = None,
        blocks: str = "all",
        in_channels: int = 1,
        output_init_scale: float = 1e-3,
    ):
        super().__init__()
        self.widths = tuple(int(d) for d in widths)
        inner = reduced_widths(self.widths, input_reduction)
        channels = [in_channels] + channel_list(hidden_channels, num_layers - 1) + [1] if num_layers > 1 else [in_channels, 1]
        self.reduce = _reducer(self.widths, inner)
        self.layers = equivariant_stack(
            inner, channels, pool=pool, blocks=blocks, bn=bn, dropout=dropout, activate_last=False,
            last_init_scale=output_init_scale,
        )
        self.expand = _reducer(inner, self.widths)

    def forward(self, ws: WeightSpace) -> WeightSpace:
        out = self.expand(self.layers(self.reduce(ws)))
        return out.map(lambda t: t.squeeze(-1))


def dwsnet_mnist_inr_config(num_classes: int = 10) -> dict:
    """Keyword arguments of :class:`DWSNetInvariant` for the paper's MNIST-INR classifier.

    Input INRs are ``2 -> 32 -> 32 -> 1``; 4 DWS layers with max pooling and BN, then the invariant
    layer. ``hidden_channels=48, head_hidden=64`` gives about 550K parameters, the paper's count.
    """
    return dict(
        widths=(2, 32, 32, 1), out_features=num_classes, hidden_channels=48, num_layers=4,
        pool="max", bn=True, dropout=0.0, head_hidden=64,
    )
