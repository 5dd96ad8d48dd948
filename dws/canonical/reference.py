"""``align``: every network moved by weight matching to one reference network, as ``mlp-align`` does.

The reference is MergeMany's (Ainsworth et al.) on a subsample of the usable train networks, drawn
and built exactly as ``zoo train --model mlp-align`` builds it (:class:`dws.baselines.align.AlignedMLP`,
reused here, not copied): with the same seed, a store derived with ``align`` holds the networks that
``mlp-align`` trains on. Weight matching only permutes hidden neurons, so every function is kept.
"""

from __future__ import annotations

from typing import Callable

import torch

from dws.baselines.align import AlignedMLP
from dws.stream.batch import weightspace_from_arrays
from dws.weightspace import WeightSpace
from zoo.store import WeightStore


def reference_alignment(store: WeightStore, seed: int = 0,
                        before: Callable[[WeightSpace], WeightSpace] = lambda ws: ws,
                        ) -> tuple[Callable[[WeightSpace], WeightSpace], dict]:
    """``(align, record)``: the function aligning networks of ``store`` (after ``before``, the transforms
    applied ahead of it) to the reference built from its train split, and what the manifest records
    of it (settings and the reference itself, flattened as :meth:`WeightSpace.flatten` orders it)."""
    aligner = AlignedMLP(store.widths, 1, n_layers=0, seed=seed)  # the head is never used: n_layers=0 keeps it tiny
    generator = torch.Generator().manual_seed(seed)
    picked = aligner.reference_networks(store, generator)  # mlp-align's own draw, reused
    aligner.prepare(before(weightspace_from_arrays(store.read_rows(picked))), generator=generator)
    record = {"seed": seed, **aligner.merge_kw, "reference_networks": len(picked),
              "reference": aligner.reference[0].tolist()}
    return aligner.align, record
