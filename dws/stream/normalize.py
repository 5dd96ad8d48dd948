"""Per-entry normalization with a store's statistics, and its inverse.

The statistics are ``(mean, std)`` per parameter entry over the train split
(``WeightStore.stats()``); a batch is normalized as ``(value - mean) / std``. The inverse is needed
wherever a model's output is itself a network that must be evaluated with raw weights. Statistics
pooled over a model's symmetry (:mod:`dws.stream.orbit`, ``zoo train --normalize orbit``) are applied
the same way, through :meth:`Normalizer.from_stats`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dws.weightspace import WeightSpace
from zoo.store import WeightStore
from zoo.store.format import layers_from_arrays


@dataclass(frozen=True)
class Normalizer:
    """``mean`` and ``std`` as weight spaces of batch size 1 (they broadcast over a batch)."""

    mean: WeightSpace
    std: WeightSpace

    @classmethod
    def from_stats(cls, stats: dict) -> "Normalizer":
        """From ``{name: (mean, std)}`` per parameter array (``WeightStore.stats()`` or a checkpoint's)."""
        weights, biases = layers_from_arrays(stats)

        def part(k: int) -> WeightSpace:
            def get(pair):
                return torch.as_tensor(pair[k], dtype=torch.float32).unsqueeze(0)

            return WeightSpace(tuple(map(get, weights)), tuple(map(get, biases)))

        return cls(part(0), part(1))

    @classmethod
    def from_store(cls, store: WeightStore) -> "Normalizer":
        return cls.from_stats(store.stats())

    def _check(self, ws: WeightSpace) -> None:
        if ws.widths != self.mean.widths:
            raise ValueError(f"networks of widths {ws.widths} cannot use statistics for widths {self.mean.widths}")

    def _apply(self, ws: WeightSpace, fn) -> WeightSpace:
        self._check(ws)

        def stat(t, like):  # a trailing channel dimension shares the entry's statistics
            t = t.to(device=like.device, dtype=like.dtype)
            return t.unsqueeze(-1) if like.dim() == t.dim() + 1 else t

        return WeightSpace(
            tuple(fn(w, stat(m, w), stat(s, w)) for w, m, s in zip(ws.weights, self.mean.weights, self.std.weights)),
            tuple(fn(b, stat(m, b), stat(s, b)) for b, m, s in zip(ws.biases, self.mean.biases, self.std.biases)),
        )

    def normalize(self, ws: WeightSpace, *, in_place: bool = False) -> WeightSpace:
        """``(ws - mean) / std``. ``in_place`` overwrites ``ws``'s tensors instead of allocating new
        ones: for batches the caller owns (a shuffle window or an in-memory split of a classifier
        zoo is gigabytes, and a copy would double it); the values are the same bit for bit."""
        if in_place:
            return self._apply(ws, lambda x, mean, std: x.sub_(mean).div_(std))
        # in place on the fresh difference: one temporary the size of the batch, not two
        return self._apply(ws, lambda x, mean, std: (x - mean).div_(std))

    def denormalize(self, ws: WeightSpace) -> WeightSpace:
        """Back to raw weights (e.g. a predicted network, before evaluating it)."""
        return self._apply(ws, lambda x, mean, std: (x * std).add_(mean))


def denormalize(ws: WeightSpace, store: WeightStore | Normalizer) -> WeightSpace:
    """Raw weights from weights normalized with ``store``'s statistics."""
    normalizer = store if isinstance(store, Normalizer) else Normalizer.from_store(store)
    return normalizer.denormalize(ws)
