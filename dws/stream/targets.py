"""Per-network targets, chosen by column name from ``networks.parquet``."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa
import torch

from zoo.store import StoreError, WeightStore


def target_names(store: WeightStore, target: str | Sequence[str] | None) -> list[str]:
    """``"amplitude,frequency"`` or ``["amplitude", "frequency"]``; None means the store's own targets."""
    if target is None:
        names = list(store.manifest.get("targets") or [])
        if not names:
            raise StoreError(f"{store.root}: the manifest lists no targets; pass target= a column name")
        return names
    names = [n.strip() for n in target.split(",")] if isinstance(target, str) else list(target)
    if not names or not all(names):
        raise ValueError(f"target {target!r} names no column")
    return names


def read_targets(store: WeightStore, names: Sequence[str], start: int, stop: int) -> torch.Tensor:
    """Targets of networks ``start..stop-1``.

    One integer column -> int64 ``[n]`` (class labels); one float column -> float32 ``[n]``;
    several columns -> float32 ``[n, k]``. Missing values (null, NaN, label -1) are refused here,
    where the message can say which column and split, rather than as a NaN loss later.
    """
    table = store.networks
    numeric = [f.name for f in table.schema if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)]
    columns = []
    for name in names:
        if name not in numeric:
            raise ValueError(
                f"unknown target {name!r}; numeric columns of {store.root}/networks.parquet: {numeric} "
                f"(this store's targets: {store.manifest.get('targets')})"
            )
        column = table.column(name).slice(start, stop - start)
        values = column.to_numpy(zero_copy_only=False) if column.null_count == 0 else None
        if values is None or (values.dtype.kind == "f" and np.isnan(values).any()):
            raise ValueError(
                f"target {name!r} is missing for some of networks {start}..{stop - 1} of {store.root} "
                f"(this store's targets: {store.manifest.get('targets')})"
            )
        if name == "label" and (values < 0).any():
            raise ValueError(f"{store.root}: some of networks {start}..{stop - 1} have no class (label -1)")
        columns.append(values)
    if len(columns) == 1 and columns[0].dtype.kind in "iu":
        return torch.from_numpy(columns[0].astype(np.int64))
    stacked = np.stack(columns, axis=1).astype(np.float32)
    return torch.from_numpy(stacked[:, 0] if len(columns) == 1 else stacked)
