"""Per-entry normalization statistics over the train split, reduced from per-chunk moments.

Each chunk contributes ``(count, mean, M2)`` for its train rows; chunks are combined with Chan et
al.'s parallel update, which stays accurate where a naive sum of squares would cancel.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zarr

from .format import STATS_GROUP

STD_FLOOR = 1e-8  # entries that never vary are divided by 1 instead of ~0


@dataclass
class Moments:
    count: int
    mean: dict[str, np.ndarray]
    m2: dict[str, np.ndarray]

    @classmethod
    def of(cls, arrays: dict[str, np.ndarray]) -> "Moments":
        arrays = {k: np.asarray(v, dtype=np.float64) for k, v in arrays.items()}
        count = next(iter(arrays.values())).shape[0]
        if count == 0:
            return cls(0, {k: np.zeros(v.shape[1:]) for k, v in arrays.items()},
                       {k: np.zeros(v.shape[1:]) for k, v in arrays.items()})
        mean = {k: v.mean(0) for k, v in arrays.items()}
        m2 = {k: ((v - mean[k]) ** 2).sum(0) for k, v in arrays.items()}
        return cls(count, mean, m2)

    def combine(self, other: "Moments") -> "Moments":
        n = self.count + other.count
        if n == 0:
            return self
        mean, m2 = {}, {}
        for k in self.mean:
            delta = other.mean[k] - self.mean[k]
            mean[k] = self.mean[k] + delta * (other.count / n)
            m2[k] = self.m2[k] + other.m2[k] + delta**2 * (self.count * other.count / n)
        return Moments(n, mean, m2)

    def std(self) -> dict[str, np.ndarray]:
        if self.count == 0:
            raise ValueError("no train networks: normalization statistics are undefined")
        return {k: np.sqrt(v / self.count) for k, v in self.m2.items()}


def write_stats(root: str | Path, moments: Moments) -> dict:
    """Store ``<name>_mean`` and ``<name>_std`` arrays; returns the manifest entry describing them."""
    group = zarr.open_group(str(root), mode="r+").require_group(STATS_GROUP)
    std = moments.std()
    for name, mean in moments.mean.items():
        group.create_array(f"{name}_mean", data=mean.astype(np.float32), overwrite=True)
        group.create_array(f"{name}_std", data=np.maximum(std[name], STD_FLOOR).astype(np.float32),
                           overwrite=True)
    return {
        "split": "train",
        "count": moments.count,
        "group": STATS_GROUP,
        "arrays": "<param>_mean, <param>_std (population std, floored at %g)" % STD_FLOOR,
        "apply": "(value - mean) / std, per entry",
    }
