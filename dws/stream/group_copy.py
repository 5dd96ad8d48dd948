"""A store's copy in which every network is moved by its own random group element.

The networks compute the same functions as the original's (hidden neurons permuted, and rescaled
where the activation allows it), rows, splits and targets are the same, so a model that is
invariant to the group, with a normalization that commutes with it, reports the same metrics on
both (the pipeline-level invariance test, ``tests/test_normalize_orbit.py``). The copy's own
statistics are reduced from its moved networks as for any store; ``zoo eval`` normalizes with the
run's checkpoint, not with them.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dws.weightspace import random_group_element, random_neuron_scales
from zoo.store import WeightStore

from .mapped import write_mapped_store


def write_group_copy(store: WeightStore, out: str | Path, *, scale: str | None = None, seed: int = 0,
                     overwrite: bool = False) -> Path:
    """Write ``store``'s networks to ``out``, each permuted by a uniformly random hidden-neuron
    permutation and, with ``scale`` (``"sign"`` or ``"positive"``, :data:`dws.weightspace.ACTIVATION_SCALES`),
    rescaled by random neuron scales; one element per network, drawn from ``seed``."""
    generator = torch.Generator().manual_seed(seed)

    def move(ws):  # one element per network, drawn in store order
        ws = ws.permute(random_group_element(ws.widths, ws.batch_size, generator))
        if scale is not None:
            ws = ws.scale_neurons(random_neuron_scales(ws.widths, ws.batch_size, scale, generator))
        return ws

    manifest = store.manifest
    meta = {k: manifest[k] for k in ("kind", "description", "architecture", "targets", "generation", "source",
                                     "runs", "training") if k in manifest}
    meta["group_copy"] = {"derived_from": str(store.root), "seed": seed,
                          "group": "hidden-neuron permutations" + (f" and {scale} scales" if scale else "")}
    return write_mapped_store(store, out, move, metadata=meta, overwrite=overwrite)
