"""Sine-wave data sets ``a * sin(b * x)`` on a 2,000-point grid over [-pi, pi].

Item ``i`` draws its (a, b) from its own generator seeded by ``(seed, i)``, so item i is the
same whether 10 or 5,000 items are drawn, and splits are contiguous index ranges (train first,
then val, then test). Two zoos from the paper:

* ``sine-regression``: 1,000 items (800 / 100 / 100), b ~ U(0.5, 10), the regression target.
  The paper does not state the amplitude; we fix a = 1 (an amplitude range can be passed).
* ``sine-ssl``: 5,000 items (4,000 / 500 / 500), a, b ~ U(0, 10); both are stored.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np
import torch

from .base import SPLITS, Source, check_split
from .grids import SINE_POINTS, sine_grid, sine_grid_manifest, sine_targets


@dataclass(frozen=True)
class SineSpec:
    """How a sine zoo is sampled: ``a ~ U(amplitude)``, ``b ~ U(frequency)`` per item.

    A range with equal ends is a constant. ``sizes`` are the train, val and test counts.
    """

    name: str
    amplitude: tuple[float, float]
    frequency: tuple[float, float]
    sizes: tuple[int, int, int]
    seed: int = 0
    points: int = SINE_POINTS

    def sample(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """(a, b) float64 arrays for global item ``indices``; item i depends on (seed, i) only."""
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        u = np.array([np.random.default_rng([self.seed, int(i)]).random(2) for i in indices]).reshape(-1, 2)
        (a_lo, a_hi), (b_lo, b_hi) = self.amplitude, self.frequency
        return a_lo + (a_hi - a_lo) * u[:, 0], b_lo + (b_hi - b_lo) * u[:, 1]

    def split_range(self, split: str) -> range:
        """Global item indices of ``split``."""
        start = sum(self.sizes[: SPLITS.index(check_split(split))])
        return range(start, start + self.sizes[SPLITS.index(split)])

    def to_manifest(self) -> dict:
        return {**asdict(self), "sampling": "u = numpy.random.default_rng([seed, i]).random(2); "
                                            "a = a_lo + (a_hi - a_lo) * u[0]; b = b_lo + (b_hi - b_lo) * u[1]",
                "signal": "a * sin(b * x)"}


SINE_REGRESSION = SineSpec("sine-regression", amplitude=(1.0, 1.0), frequency=(0.5, 10.0), sizes=(800, 100, 100))
SINE_SSL = SineSpec("sine-ssl", amplitude=(0.0, 10.0), frequency=(0.0, 10.0), sizes=(4000, 500, 500))


@dataclass(frozen=True)
class SineSplit:
    """One split: ``amplitude`` a and ``frequency`` b float64 [N], ``item_ids`` int64 [N] (global)."""

    amplitude: np.ndarray
    frequency: np.ndarray
    item_ids: np.ndarray
    source: str
    split: str

    def __len__(self) -> int:
        return len(self.item_ids)

    def signals(self, grid: torch.Tensor | None = None) -> torch.Tensor:
        """[N, points, 1] float32 values of ``a * sin(b * x)`` on ``grid`` (default: the 2,000-point grid)."""
        return sine_targets(self.amplitude, self.frequency, grid)


class SineSource(Source):
    """A sine zoo; ``seed`` and ``sizes`` override the spec's (e.g. a small zoo for tests)."""

    def __init__(self, spec: SineSpec, seed: int | None = None, sizes: tuple[int, int, int] | None = None):
        self.spec = replace(spec, seed=spec.seed if seed is None else seed, sizes=tuple(sizes or spec.sizes))
        self.name = spec.name
        self._splits: dict[str, SineSplit] = {}

    def split(self, split: str) -> SineSplit:
        if split not in self._splits:
            span = self.spec.split_range(split)
            ids = np.arange(span.start, span.stop, dtype=np.int64)
            a, b = self.spec.sample(ids)
            self._splits[split] = SineSplit(a, b, ids, self.name, split)
        return self._splits[split]

    def coords(self) -> torch.Tensor:
        return sine_grid(self.spec.points)

    def targets(self, split: str) -> torch.Tensor:
        return self.split(split).signals(self.coords())

    def provenance(self) -> dict:
        return {"source": self.name, "kind": "signal", "spec": self.spec.to_manifest(),
                "split_rule": "contiguous global indices: train, then val, then test",
                "item_ids": "global item index i; (a, b) depend on (seed, i) only",
                "counts": dict(zip(SPLITS, self.spec.sizes)), "coordinates": sine_grid_manifest(self.spec.points)}
