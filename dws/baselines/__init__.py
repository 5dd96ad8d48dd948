"""The five baselines of the DWSNets paper, and the weight-statistics regressor of Unterthiner et al.
(2020): models on weight spaces that ignore or work around the neuron-permutation symmetry. All
share the DWSNet model interface (see :mod:`.common`)."""

from __future__ import annotations

from typing import Sequence

from dws.baselines.align import AlignedMLP, align, merge_many, weight_matching
from dws.baselines.augment import PermAugMLP, random_permute
from dws.baselines.common import Baseline, mlp_stack, neuron_rows, num_weights
from dws.baselines.inr2vec import INR2Vec
from dws.baselines.mlp import MLPBaseline
from dws.baselines.sizing import count_params, size_to_params
from dws.baselines.stats import WeightStatistics, weight_statistics
from dws.baselines.transformer import WeightTransformer

BASELINES: dict[str, type[Baseline]] = {
    "mlp": MLPBaseline,
    "mlp-perm": PermAugMLP,
    "mlp-align": AlignedMLP,
    "inr2vec": INR2Vec,
    "transformer": WeightTransformer,
    "stats": WeightStatistics,
}


def build_baseline(
    name: str,
    widths: Sequence[int],
    out_features: int | None,
    target_params: int | None = None,
    params_rtol: float | None = 0.1,
    **kw,
) -> Baseline:
    """Baseline ``name`` for input networks of ``widths``; with ``target_params``, its ``hidden``
    width is chosen to match that many parameters (raising if it cannot within ``params_rtol``).
    Remaining keyword arguments go to the constructor."""
    if name not in BASELINES:
        raise ValueError(f"unknown baseline {name!r}; choose from {sorted(BASELINES)}")
    cls = BASELINES[name]
    if target_params is None:
        return cls(widths, out_features, **kw)
    if "hidden" in kw:
        raise ValueError("give either hidden or target_params, not both")
    model, _ = size_to_params(
        lambda hidden: cls(widths, out_features, hidden=hidden, **kw),
        target_params,
        multiple_of=cls.width_multiple(**kw),
        rtol=params_rtol,
    )
    return model


__all__ = [
    "BASELINES",
    "AlignedMLP",
    "Baseline",
    "INR2Vec",
    "MLPBaseline",
    "PermAugMLP",
    "WeightStatistics",
    "WeightTransformer",
    "align",
    "build_baseline",
    "count_params",
    "merge_many",
    "mlp_stack",
    "neuron_rows",
    "num_weights",
    "random_permute",
    "size_to_params",
    "weight_matching",
    "weight_statistics",
]
