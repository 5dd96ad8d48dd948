"""What each run of a classifier zoo trains with: its seed, its classes and its hyperparameters.

Everything is drawn from the run's seed (``network_seed(seed, run)``) alone, so a run is the same
whichever runs share its batch, worker or chunk. Streams: the initialization uses
``torch.Generator().manual_seed(seed)``; ``numpy.random.default_rng([seed, s])`` gives the class
pair and the hyperparameters (s = 1, in that order), the data order (s = 2) and the dropout masks
(a ``torch.Generator`` seeded from s = 3).

Diversity (off by default, as in Model Zoos and the Small CNN Zoo): each run samples its learning
rate, initialization scale, weight decay, dropout, activation and fraction of the training data
from the ranges of :class:`Diversity`; without it every run uses the schedule's learning rate, the
default initialization, no weight decay, no dropout, ReLU and all the data.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from ..fit.siren import network_seed

HYPER_STREAM, DATA_STREAM, DROPOUT_STREAM = 1, 2, 3


@dataclass(frozen=True)
class Diversity:
    """Per-run sampling ranges: ``(low, high)``, log-uniform for rates, uniform otherwise."""

    lr: tuple[float, float] = (1e-4, 1e-2)  # log-uniform
    init_scale: tuple[float, float] = (0.5, 2.0)  # log-uniform, times nn.Linear's default range
    weight_decay: tuple[float, float] = (1e-6, 1e-2)  # log-uniform (Adam's L2 term)
    dropout: tuple[float, float] = (0.0, 0.5)  # uniform
    activations: tuple[str, ...] = ("relu", "tanh", "sigmoid", "gelu")  # uniform choice
    data_fraction: tuple[float, float] = (0.1, 1.0)  # uniform

    def to_manifest(self) -> dict:
        return {**{k: list(v) for k, v in asdict(self).items()},
                "sampling": "per run, from numpy.random.default_rng([seed, 1]) after the classes, in the order "
                            "lr, init_scale, weight_decay (log-uniform: exp(uniform(log low, log high))), dropout, "
                            "activation (integers(len)), data_fraction (uniform)"}


@dataclass(frozen=True)
class RunSettings:
    run: int  # the run's number in the full-size zoo (its trajectory_id)
    seed: int
    classes: tuple[int, ...]  # the classes it learns, in logit-selection order
    lr: float
    weight_decay: float = 0.0
    dropout: float = 0.0
    init_scale: float = 1.0
    activation: str = "relu"
    data_fraction: float = 1.0

    def columns(self) -> dict:
        """Its per-network table columns."""
        return {"seed": self.seed, "classes": list(self.classes), "lr": self.lr,
                "weight_decay": self.weight_decay, "dropout": self.dropout, "init_scale": self.init_scale,
                "activation": self.activation, "data_fraction": self.data_fraction}


def _log_uniform(rng: np.random.Generator, bounds) -> float:
    low, high = bounds
    return float(math.exp(rng.uniform(math.log(low), math.log(high))))


def draw_run(base_seed: int, run: int, num_classes: int, classes_per_run: int, lr: float,
             diversity: Diversity | None = None) -> RunSettings:
    """Run ``run``'s settings: ``classes_per_run`` distinct classes out of ``num_classes`` (all of
    them, in order, when equal), sorted, and its hyperparameters."""
    seed = network_seed(base_seed, run)
    rng = np.random.default_rng([seed, HYPER_STREAM])
    if classes_per_run >= num_classes:
        classes = tuple(range(num_classes))
    else:
        classes = tuple(int(c) for c in np.sort(rng.choice(num_classes, classes_per_run, replace=False)))
    if diversity is None:
        return RunSettings(run, seed, classes, lr)
    d = diversity
    return RunSettings(
        run, seed, classes,
        lr=_log_uniform(rng, d.lr),
        init_scale=_log_uniform(rng, d.init_scale),
        weight_decay=_log_uniform(rng, d.weight_decay),
        dropout=float(rng.uniform(*d.dropout)),
        activation=d.activations[int(rng.integers(len(d.activations)))],
        data_fraction=float(rng.uniform(*d.data_fraction)),
    )


def stream_seed(seed: int, stream: int) -> int:
    """A 63-bit seed for one of a run's random streams (e.g. its dropout masks)."""
    state = np.random.SeedSequence([seed, stream]).generate_state(2, dtype=np.uint64)
    return int(state[0] & np.uint64((1 << 63) - 1))
