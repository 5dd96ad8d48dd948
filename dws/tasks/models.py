"""Models by name for ``zoo train``: DWSNet, the baselines, the NFNs (``nfn-np``, ``nfn-hnp``,
:mod:`dws.nfn`) and the neural graphs (``ng-gnn``, ``ng-transformer``, :mod:`dws.ng`), sized to the
same capacity, and the optional hooks through which a model asks for its inputs to be transformed.

The paper sizes every baseline to the DWSNet's parameter count; ``build_model`` does the same
(the DWSNet is built first, then each baseline is sized to its count). With ``equivariant=True``
(``--task adapt``) the model maps networks to networks: an equivariant DWSNet (``num_layers``
hidden DWS layers and an output layer, initialized with mu = 1e-3) or a baseline in its
weight-space mode, inside a :class:`~dws.tasks.adaptation.ResidualAdapter` (``v -> v - dv``).

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

import math
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn

from dws.baselines import build_baseline, count_params
from dws.baselines.sizing import size_to_params
from dws.nfn import NFNInvariant
from dws.nfn.encoding import NFN_REFERENCE_SCALE
from dws.nfn.models import paper_ratios
from dws.ng import PAPER_NG_WIDTH, NGGNN, NGTransformer, gnn_ratios, transformer_ratios
from dws.nn import DWSNetEquivariant, DWSNetInvariant
from dws.nn.fast import accelerate
from dws.nn.reduction import InputReduced, reduced_widths
from dws.scalegmn import PAPER_HIDDEN, ScaleGMNInvariant, symmetry_of
from dws.weightspace import WeightSpace
from zoo.store import WeightStore

from .adaptation import OUTPUT_INIT_SCALE, ResidualAdapter, small_output
from .options import ADAPT_MODELS, MODEL_DEFAULTS, MODELS, NFN_MODELS, NG_MODELS, SCALEGMN_MODELS, model_version


MAX_PARAMS = 200_000_000  # ~0.8 GB of float32 parameters, ~3 GB with gradients and AdamW's moments


def dwsnet_kwargs(hidden_channels: int, num_layers: int, dropout: float = 0.0, bn: bool = True,
                  blocks: str = "all", pool: str = "max", input_reduction: int | None = None) -> dict:
    return dict(hidden_channels=hidden_channels, num_layers=num_layers, dropout=dropout, bn=bn,
                blocks=blocks, pool=pool, input_reduction=input_reduction)


def paper_width(paper: int, hidden_channels: int, multiple_of: int = 1) -> int:
    """A model whose paper fixes its size: the paper's width at the DWSNet's default channels, in
    proportion to ``--hidden-channels`` otherwise (issue 32: sizes are matched only where no paper fixes one)."""
    width = round(paper * hidden_channels / MODEL_DEFAULTS["hidden_channels"] / multiple_of) * multiple_of
    return max(multiple_of, width)


def weight_spread(stats: dict) -> float:
    """The weights' typical std: the root mean square of the per-entry stds of ``{name: (mean, std)}``
    (``WeightStore.stats()``, the train split's) over every parameter; what standardizing divides a
    typical weight by (0.030 on the ci MNIST INR store)."""
    stds = [torch.as_tensor(std, dtype=torch.float64).flatten() for _, std in stats.values()]
    return math.sqrt(torch.cat(stds).square().mean().item())


def nfn_fourier_scale(weight_std: float | None) -> float:
    """The NFNs' Fourier scale on their inputs. The reference code's (``S``, :data:`NFN_REFERENCE_SCALE`)
    acts on raw SIREN weights ``w``; on ``x = (w - m) / s``, ``sin(2 pi S s b x)`` is ``sin(2 pi S b (w - m))``,
    so the loader's typical divisor ``weight_std`` multiplies it (docs/dws.md, NFN "Inputs"). None: the
    inputs are raw weights, the reference's scale as is."""
    if weight_std is None:
        return NFN_REFERENCE_SCALE
    if not (math.isfinite(weight_std) and weight_std > 0):
        raise ValueError(f"weight_std must be a positive number (the weights' typical std), got {weight_std!r}")
    return NFN_REFERENCE_SCALE * weight_std


# Earlier model versions (dws.tasks.options.MODEL_VERSIONS) that today's code still builds exactly: the
# constructor arguments that differ, so that ``zoo eval`` of an old run reproduces what it recorded.
EARLIER_VERSIONS = {("ng-gnn", 1): {"norm": "node"}}


def rebuilds_exactly(name: str, version: int) -> bool:
    """Whether :func:`build_model` builds ``version`` of ``name`` (a run's recorded one) as it was."""
    return version == model_version(name) or (name, version) in EARLIER_VERSIONS


def build_model(name: str, widths: Sequence[int], out_features: int, *, hidden_channels: int = 48,
                num_layers: int = 4, dropout: float = 0.0, bn: bool = True, blocks: str = "all",
                pool: str = "max", input_reduction: int | None = None, equivariant: bool = False,
                target_scale: Sequence[Sequence[float]] | None = None, params_rtol: float = 0.15,
                backend: str = "auto", activation: str | None = None,
                weight_std: float | None = None, version: int | None = None) -> tuple[nn.Module, dict]:
    """The model and a description (name, parameter count, DWSNet count it was sized to); the DWSNet
    runs on ``backend`` (:func:`dws.nn.fast.accelerate`: same function, different speed).

    ``input_reduction`` is the DWSNet's ``d_0'`` (its first layer's inputs mapped by ``LIN(d_0, d_0')``);
    a baseline is sized to that DWSNet, as to its channels and layers; the NFNs, the neural graphs and
    ScaleGMN see the networks through the same map, bias-free (:class:`~dws.nn.reduction.InputReduced`),
    the MLP baselines take the networks as they are. ``equivariant``: a model whose
    output is a residual weight space (``--task adapt``). ``target_scale`` (``[means, stds]``, one per
    output): the model's outputs are read as standardized targets (:class:`TargetScale`). ``activation``:
    the networks' (the store manifest's), which ScaleGMN's symmetry follows; the other models ignore it.
    ``weight_std``: the typical std the loader divided the weights by (:func:`weight_spread`; None: raw
    weights), which the NFNs' Fourier scale follows (:func:`nfn_fourier_scale`); the other models ignore it
    (the neural graphs' reference scales already act on standardized weights). ``version``: the model
    version to build (a run's recorded one), where :data:`EARLIER_VERSIONS` still has it; else today's.
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    if equivariant and name not in ADAPT_MODELS:
        raise ValueError(f"{name} outputs a vector, not a weight space; choose from {', '.join(ADAPT_MODELS)}")
    kwargs = dwsnet_kwargs(hidden_channels, num_layers, dropout, bn, blocks, pool, input_reduction)

    def dwsnet() -> nn.Module:
        if equivariant:
            return small_output(DWSNetEquivariant(widths, **{**kwargs, "num_layers": num_layers + 1},
                                                  output_init_scale=OUTPUT_INIT_SCALE))
        return DWSNetInvariant(widths, out_features, **kwargs)

    with torch.device("meta"):  # counted without memory: a model too large to build is refused, not built
        target = count_params(dwsnet())
    if target > MAX_PARAMS:
        hint = (f"; pass --input-reduction N to map the networks' {widths[0]} inputs to N first (the paper: 16)"
                if input_reduction is None and widths[0] > 64 else "")
        raise ValueError(f"the DWSNet for networks of widths {tuple(widths)} with {hidden_channels} channels would "
                         f"have {target:,} parameters (more than {MAX_PARAMS:,}){hint}")
    # the newer models take --input-reduction as the DWSNet does (d_0 -> d_0' first), from outside: InputReduced
    inner = reduced_widths(widths, input_reduction)

    def reduced(model: nn.Module) -> nn.Module:
        return model if input_reduction is None else InputReduced(widths, input_reduction, model)

    if name == "dwsnet":
        model, desc = accelerate(dwsnet(), backend), {"model": name, "params": target}
    elif name in NFN_MODELS:  # the reference classifier's proportions, its channels sized to the DWSNet
        mode, fourier_scale = name.removeprefix("nfn-"), nfn_fourier_scale(weight_std)
        try:
            model, params = size_to_params(
                lambda channels: reduced(NFNInvariant(inner, out_features, mode=mode, dropout=dropout,
                                                      fourier_scale=fourier_scale, **paper_ratios(channels))),
                target, width_arg="channels", hi=1024, rtol=params_rtol)
        except ValueError as err:  # HNP's first layer grows with d_0^2: wide inputs rule out a DWSNet's size
            raise ValueError(f"--model {name} cannot be sized to the DWSNet's {target:,} parameters for "
                             f"{'-'.join(map(str, widths))} networks: {err}") from err
        desc = {"model": name, "params": params, "sized_to": target, "fourier_scale": fourier_scale}
    elif name in NG_MODELS:  # the reference INR classifiers' width 32 at the DWSNet's default channels, in proportion
        width = paper_width(PAPER_NG_WIDTH, hidden_channels, multiple_of=2)
        ratios = gnn_ratios if name == "ng-gnn" else transformer_ratios
        model = reduced((NGGNN if name == "ng-gnn" else NGTransformer)(
            inner, out_features, dropout=dropout, **ratios(width), **EARLIER_VERSIONS.get((name, version), {})))
        desc = {"model": name, "params": count_params(model), "dwsnet_params": target, "width": width}
    elif name in SCALEGMN_MODELS:  # the paper's d = 128 at the DWSNet's default channels, in proportion otherwise
        width = paper_width(PAPER_HIDDEN, hidden_channels)
        scalegmn = ScaleGMNInvariant(inner, out_features, symmetry_of(activation), dropout=dropout, hidden=width,
                                     variant="bidirectional" if name == "scalegmn-b" else "forward")
        model = reduced(scalegmn)
        desc = {"model": name, "params": count_params(model), "dwsnet_params": target, "width": width,
                "symmetry": scalegmn.symmetry}
    else:
        model = build_baseline(name, widths, None if equivariant else out_features, target_params=target,
                               params_rtol=params_rtol, dropout=dropout,
                               **({"equivariant": True} if equivariant else {}))
        if equivariant:
            model = small_output(model)
        desc = {"model": name, "params": count_params(model), "sized_to": target}
    if equivariant:
        return ResidualAdapter(model, widths), desc
    return (model if target_scale is None else TargetScale(model, *target_scale)), desc


class TargetScale(nn.Module):
    """A regression model whose outputs are standardized targets: ``mean + std * inner(x)``.

    ``mean`` and ``std`` are the train split's, per target (buffers, saved with the model), so every
    model starts predicting on the target's own scale whatever its range: a classifier's test
    accuracy (mean 0.82, std 0.14 on the ci zoo) would otherwise start ~1 away from every target,
    and a DWSNet's first epochs go to learning the offset (docs/train.md, "Generalization
    prediction"). Both model hooks pass through to ``inner``'s.
    """

    def __init__(self, inner: nn.Module, mean: Sequence[float], std: Sequence[float]):
        super().__init__()
        self.inner = inner
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32))

    def forward(self, ws: WeightSpace) -> torch.Tensor:
        return self.mean + self.std * self.inner(ws)

    def prepare_store(self, store: WeightStore, folder, log=print) -> WeightStore:
        return training_store(self.inner, store, folder, log)

    def input_transform(self):
        return evaluation_transform(self.inner)


def training_store(model: nn.Module, store: WeightStore, folder: Path, log=print) -> WeightStore:
    """The store ``model`` trains on: its ``prepare_store``'s, or ``store`` itself."""
    hook = getattr(model, "prepare_store", None)
    return store if hook is None else hook(store, Path(folder), log)


def evaluation_transform(model: nn.Module) -> Callable[[WeightSpace], WeightSpace] | None:
    """What to apply to a store's raw networks before ``model`` sees them (None: nothing)."""
    hook = getattr(model, "input_transform", None)
    return None if hook is None else hook()
