"""Normalization statistics that commute with a model's symmetry group (``zoo train --normalize orbit``).

Per-entry statistics (``WeightStore.stats()``, ``--normalize entry``) give two entries that a group
element exchanges different means and stds, so ``normalize(g v) != g normalize(v)`` and an exactly
invariant model becomes approximately invariant once normalization is in front of it. Orbit
statistics are the per-entry statistics of the train split symmetrized over the group: each entry
gets the moments of all entries of its orbit. ``(v - mu) / sigma`` commutes with the group exactly
when:

* **hidden-neuron permutations** (every model that claims a symmetry): ``mu`` and ``sigma`` are
  constant along the permuted axes: the rows of every weight but the last, the columns of every
  weight but the first, the biases of hidden layers. The first layer's input columns and the last
  layer's output rows and bias are not permuted and keep their own statistics. Pooling is exact from
  per-entry moments over the same networks: ``mu = mean(means)``,
  ``sigma^2 = mean(std^2 + (means - mu)^2)`` (``= mean(std^2 + mean^2) - mu^2``).
* **sign flips** (sine, tanh): ``v -> -v`` on every flipped entry, and ``(-v - mu) / sigma`` equals
  ``-(v - mu) / sigma`` only for ``mu = 0``: no centering on any weight, nor on hidden biases (the
  last bias is never flipped and stays centered). The symmetrized distribution has mean 0 and
  variance ``E[v^2]``: ``sigma`` is the pooled root mean square ``sqrt(mean(std^2 + mean^2))``.
* **positive scaling** (ReLU): ``v -> c v`` with ``c = s_out / s_in`` any positive number; for all
  ``c`` that needs ``mu = 0`` on the same entries, while *any* fixed positive ``sigma`` per entry
  commutes (the division is elementwise: a per-array scalar, per-row or per-column divisor all do),
  so the permutations alone decide ``sigma``'s sharing. The group is not compact and has no orbit
  average; the same pooled root mean square as for signs is used. What would not commute: any
  centering of a rescaled entry, and divisors computed from each network's own weights.

``scale`` therefore only decides the centering, and the same statistics serve sign flips and
positive scales (and a zoo mixing activations).
"""

from __future__ import annotations

import numpy as np

from zoo.store.format import arrays_from_layers, layers_from_arrays
from zoo.store.stats import STD_FLOOR


def orbit_statistics(stats: dict, *, scale: bool = False) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{name: (mean, std)}`` pooled over hidden-neuron permutations; ``scale``: also commuting with
    the activation's neuron scaling (sign flips or positive scales), i.e. uncentered where it acts."""
    weights, biases = layers_from_arrays(stats)
    last = len(weights) - 1

    def pooled(pair, axes: tuple[int, ...], scaled: bool):
        means, stds = (np.asarray(x, dtype=np.float64) for x in pair)
        mean = np.zeros(()) if scaled else means.mean(axes, keepdims=True)
        # the law of total variance over the orbit's entries (about 0 when uncentered): the within-entry
        # variance plus the spread of the entries' means, without cancellation
        std = np.sqrt((stds**2 + (means - mean) ** 2).mean(axes, keepdims=True))
        shape = np.shape(pair[0])
        return (np.broadcast_to(mean, shape).astype(np.float32),
                np.maximum(np.broadcast_to(std, shape), STD_FLOOR).astype(np.float32))

    # rows (axis 0) are hidden neurons in every layer but the last; columns (axis 1) in every layer but the first
    weight_stats = [pooled(w, tuple(a for a, hidden in ((0, m < last), (1, m > 0)) if hidden), scale and last > 0)
                    for m, w in enumerate(weights)]
    bias_stats = [pooled(b, (0,) if m < last else (), scale and m < last) for m, b in enumerate(biases)]
    return arrays_from_layers(weight_stats, bias_stats)


def normalization_statistics(stats: dict, mode: str, claim: str | None) -> dict:
    """The statistics a run normalizes with: ``entry``: ``stats`` as stored; ``orbit``: pooled over the
    symmetry the model claims (``dws.tasks.options.CLAIMED_SYMMETRY``: ``permutation`` or
    ``permutation+scale``)."""
    if mode == "entry":
        return stats
    if mode != "orbit":
        raise ValueError(f"normalization must be entry or orbit, got {mode!r}")
    if claim not in ("permutation", "permutation+scale"):
        raise ValueError(f"orbit normalization pools over a claimed symmetry; got {claim!r}")
    return orbit_statistics(stats, scale=claim == "permutation+scale")
