"""Models by name for ``zoo train``: DWSNet and the baselines, sized to the same capacity, and the
optional hooks through which a model asks for its inputs to be transformed.

The paper sizes every baseline to the DWSNet's parameter count; ``build_model`` does the same
(the DWSNet is built first, then each baseline is sized to its count).

A model may define two methods (both or neither); task code calls them through
:func:`training_store` and :func:`evaluation_transform` and never asks which model it has:

* ``prepare_store(store, folder, log) -> WeightStore``: called on every model built for a run,
  before it trains; returns the store it trains on. The first call may derive that store into the
  run directory ``folder``, later calls (other seeds, data-parallel workers, a rerun) reuse it.
  ``mlp-align`` aligns every network once to its MergeMany reference here.
* ``input_transform() -> Callable[[WeightSpace], WeightSpace]``: for evaluating a trained model on
  another store, the function that does to its raw networks what ``prepare_store`` did to the
  training store's (applied before normalization); from then on the model's forward expects that.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn

from dws.baselines import BASELINES, build_baseline, count_params
from dws.nn import DWSNetInvariant
from dws.weightspace import WeightSpace
from zoo.store import WeightStore


MAX_PARAMS = 200_000_000  # ~0.8 GB of float32 parameters, ~3 GB with gradients and AdamW's moments


def dwsnet_kwargs(hidden_channels: int, num_layers: int, dropout: float = 0.0, bn: bool = True,
                  blocks: str = "all", pool: str = "max", input_reduction: int | None = None) -> dict:
    return dict(hidden_channels=hidden_channels, num_layers=num_layers, dropout=dropout, bn=bn,
                blocks=blocks, pool=pool, input_reduction=input_reduction)


def build_model(name: str, widths: Sequence[int], out_features: int, *, hidden_channels: int = 48,
                num_layers: int = 4, dropout: float = 0.0, bn: bool = True, blocks: str = "all",
                pool: str = "max", input_reduction: int | None = None,
                params_rtol: float = 0.15) -> tuple[nn.Module, dict]:
    """The model and a description (name, parameter count, DWSNet count it was sized to).

    ``input_reduction`` is the DWSNet's ``d_0'`` (its first layer's inputs mapped by ``LIN(d_0, d_0')``);
    a baseline is sized to that DWSNet, as to its channels and layers.
    """
    if name != "dwsnet" and name not in BASELINES:
        raise ValueError(f"unknown model {name!r}; choose from dwsnet, {', '.join(BASELINES)}")
    kwargs = dwsnet_kwargs(hidden_channels, num_layers, dropout, bn, blocks, pool, input_reduction)
    with torch.device("meta"):  # counted without memory: a model too large to build is refused, not built
        target = count_params(DWSNetInvariant(widths, out_features, **kwargs))
    if target > MAX_PARAMS:
        hint = (f"; pass --input-reduction N to map the networks' {widths[0]} inputs to N first (the paper: 16)"
                if input_reduction is None and widths[0] > 64 else "")
        raise ValueError(f"the DWSNet for networks of widths {tuple(widths)} with {hidden_channels} channels would "
                         f"have {target:,} parameters (more than {MAX_PARAMS:,}){hint}")
    if name == "dwsnet":
        return DWSNetInvariant(widths, out_features, **kwargs), {"model": name, "params": target}
    model = build_baseline(name, widths, out_features, target_params=target, params_rtol=params_rtol,
                           dropout=dropout)
    return model, {"model": name, "params": count_params(model), "sized_to": target}


def training_store(model: nn.Module, store: WeightStore, folder: Path, log=print) -> WeightStore:
    """The store ``model`` trains on: its ``prepare_store``'s, or ``store`` itself."""
    hook = getattr(model, "prepare_store", None)
    return store if hook is None else hook(store, Path(folder), log)


def evaluation_transform(model: nn.Module) -> Callable[[WeightSpace], WeightSpace] | None:
    """What to apply to a store's raw networks before ``model`` sees them (None: nothing)."""
    hook = getattr(model, "input_transform", None)
    return None if hook is None else hook()
