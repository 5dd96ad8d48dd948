"""``zoo info`` / ``zoo show`` for zoos of plain MLPs (``zoo import state-dicts``, architecture family
``mlp``): neither INRs nor this project's classifier zoos, so there is no fit or training record to
summarize; their table's numeric columns (a lab's accuracies, epochs, ...) are summarized instead."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..options import plural
from ..store import WeightStore
from ..store.format import FAMILY_MLPS
from .format import percentiles


def is_mlp_store(store: WeightStore) -> bool:
    return store.manifest.get("architecture", {}).get("family") == FAMILY_MLPS


def summary(store: WeightStore) -> str:
    m = store.manifest
    arch = m["architecture"]
    imported = m.get("generation", {}).get("import")
    origin = (f"imported from the {imported['layout']} layout at {imported['path']}" if imported
              else str(m.get("source", {}).get("kind", "not recorded")))
    lines = [
        f"store      {store.root}  (format v{m['format_version']}, {m['status']})",
        f"kind       {m['kind']}: {m.get('description', '')}",
        f"source     {origin}",
        f"arch       {' -> '.join(map(str, arch['widths']))}  MLP, activation {arch.get('activation')}",
        f"networks   {m['num_networks']} in {plural(m['num_chunks'], 'chunk')} of {m['chunk_size']}",
        "splits     " + ", ".join(f"{s} {v['count']}" for s, v in m["splits"].items()),
    ]
    table = store.networks
    for name in table.column_names:
        kind = table.schema.field(name).type
        if name == "index" or not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
            continue
        values = table.column(name).to_numpy(zero_copy_only=False).astype(np.float64)
        values = values[~np.isnan(values)]
        lines.append(f"{name:<10} " + percentiles(values, 4))
    lines.append(f"disk       {store.size_on_disk() / 2**20:.1f} MiB")
    return "\n".join(lines)


def refuse_show(store: WeightStore) -> None:
    """``zoo show`` draws what a zoo's networks compute (INRs' images, classifiers' accuracies); a plain MLP
    zoo records neither its data nor its task."""
    raise ValueError(f"{store.root} is a zoo of imported MLPs (family {FAMILY_MLPS!r}): zoo show draws INR zoos' "
                     f"images and classifier zoos' accuracies, and this one records neither its data nor its task "
                     f"(`zoo info` summarizes its columns)")
