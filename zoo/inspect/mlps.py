"""``zoo info`` / ``zoo show`` for zoos of imported MLPs (``zoo import state-dicts``, architecture family
``mlp``; a classifier zoo imported from its Parquet export): no fit or training record to summarize, so
their targets (the numeric columns an import found: a lab's accuracies, epochs, ...) are summarized instead."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..options import plural
from ..store import WeightStore
from ..store.format import FAMILY_MLPS
from ..store.manifest import imported_from
from .format import disk_line, head_lines, percentiles, widths_text


def is_mlp_store(store: WeightStore) -> bool:
    return store.manifest.get("architecture", {}).get("family") == FAMILY_MLPS


def summary(store: WeightStore) -> str:
    m = store.manifest
    arch = m["architecture"]
    imported = imported_from(m)
    origin = (f"imported from the {imported['layout']} layout at {imported['path']}" if imported
              else str(m.get("source", {}).get("kind", "not recorded")))
    lines = [
        *head_lines(store),
        f"source     {origin}",
        f"arch       {widths_text(arch)}  MLP, activation {arch.get('activation')}",
        f"networks   {m['num_networks']} in {plural(m['num_chunks'], 'chunk')} of {m['chunk_size']}",
        "splits     " + ", ".join(f"{s} {v['count']}" for s, v in m["splits"].items()),
    ]
    table = store.networks
    numeric = [name for name in (m.get("targets") or table.column_names) if name in table.column_names
               and name not in ("index", "split") and (pa.types.is_integer(table.schema.field(name).type)
                                                       or pa.types.is_floating(table.schema.field(name).type))]
    for name in numeric:  # the targets a model can learn (the import's numeric columns)
        values = table.column(name).to_numpy(zero_copy_only=False).astype(np.float64)
        lines.append(f"{name:<10} " + percentiles(values[~np.isnan(values)], 4))
    lines.append(disk_line(store))
    return "\n".join(lines)


def refuse_show(store: WeightStore) -> None:
    """``zoo show`` draws what a zoo's networks compute (INRs' images, classifiers' accuracies); a plain MLP
    zoo records neither its data nor its task."""
    family = store.manifest.get("architecture", {}).get("family")
    raise ValueError(f"{store.root} is a zoo of imported MLPs (family {family!r}): zoo show draws INR zoos' images "
                     f"and generated classifier zoos' accuracies, and this one records neither its data nor its "
                     f"training (`zoo info` summarizes its columns)")
