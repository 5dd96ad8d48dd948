"""Models by name for ``zoo train``: DWSNet and the baselines, sized to the same capacity.

The paper sizes every baseline to the DWSNet's parameter count; ``build_model`` does the same
(the DWSNet is built first, then each baseline is sized to its count).
"""

from __future__ import annotations

from typing import Sequence

from torch import nn

from dws.baselines import BASELINES, build_baseline, count_params
from dws.nn import DWSNetInvariant
from dws.nn.fast import accelerate

MODELS = ("dwsnet", *BASELINES)


def dwsnet_kwargs(hidden_channels: int, num_layers: int, dropout: float = 0.0, bn: bool = True,
                  blocks: str = "all", pool: str = "max") -> dict:
    return dict(hidden_channels=hidden_channels, num_layers=num_layers, dropout=dropout, bn=bn,
                blocks=blocks, pool=pool)


def build_model(name: str, widths: Sequence[int], out_features: int, *, hidden_channels: int = 48,
                num_layers: int = 4, dropout: float = 0.0, bn: bool = True, blocks: str = "all",
                pool: str = "max", params_rtol: float = 0.15) -> tuple[nn.Module, dict]:
    """The model and a description (name, parameter count, DWSNet count it was sized to)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    dws = DWSNetInvariant(widths, out_features, **dwsnet_kwargs(hidden_channels, num_layers, dropout, bn, blocks, pool))
    target = count_params(dws)
    if name == "dwsnet":
        return accelerate(dws), {"model": name, "params": target}  # fused kernels: same function, faster
    model = build_baseline(name, widths, out_features, target_params=target, params_rtol=params_rtol,
                           dropout=dropout)
    return model, {"model": name, "params": count_params(model), "sized_to": target}
