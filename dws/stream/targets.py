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


def read_targets(store: WeightStore, names: Sequence[str], start: int, stop: int,
                 keep: np.ndarray | None = None) -> torch.Tensor:
    """Targets of networks ``start..stop-1`` (with ``keep``, a ``[stop - start]`` bool mask: of those it marks).

    One integer column -> int64 ``[n]`` (class labels); one float column -> float32 ``[n]``;
    several columns -> float32 ``[n, k]``. Missing values (null, NaN, label -1) of the networks
    read are refused here, where the message can say which column, which networks and which
    targets the store does have, rather than as a NaN loss later.
    """
    table = store.networks
    numeric = [f.name for f in table.schema if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)]
    columns = []
    for name in names:
        if name not in numeric:
            raise ValueError(f"unknown target {name!r}; numeric columns of {store.root}/networks.parquet: {numeric} "
                             f"{_what_it_has(store, numeric)}")
        values = _values(table.column(name).slice(start, stop - start))
        missing = np.flatnonzero(_missing(name, values) & (True if keep is None else keep))
        if missing.size:
            if not (~_missing(name, _values(table.column(name)))).any():
                raise ValueError(f"target {name!r} is missing for every network of {store.root} "
                                 f"{_what_it_has(store, numeric)}")
            how = "label -1: no class" if name == "label" else "null or NaN"
            examples = ", ".join(str(start + i) for i in missing[:5]) + (", ..." if missing.size > 5 else "")
            raise ValueError(f"target {name!r} is missing ({how}) for {missing.size} of networks {start}..{stop - 1} "
                             f"of {store.root}: {examples} {_what_it_has(store, numeric)}")
        columns.append(values if keep is None else values[keep])
    if len(columns) == 1 and columns[0].dtype.kind in "iu":
        return torch.from_numpy(columns[0].astype(np.int64))
    stacked = np.stack(columns, axis=1).astype(np.float32)
    return torch.from_numpy(stacked[:, 0] if len(columns) == 1 else stacked)


def _values(column: pa.ChunkedArray) -> np.ndarray:
    """A numeric column as numpy, nulls as NaN (floats)."""
    return column.to_numpy(zero_copy_only=False) if column.null_count == 0 else \
        column.cast(pa.float64()).fill_null(np.nan).to_numpy()


def _missing(name: str, values: np.ndarray) -> np.ndarray:
    return np.isnan(values) if values.dtype.kind == "f" else (values < 0 if name == "label" else
                                                                 np.zeros(len(values), bool))


def _what_it_has(store: WeightStore, numeric: list[str]) -> str:
    """``(this store's targets: [...]; columns with a value for every network: [...])``."""
    table = store.networks
    complete = [n for n in numeric if n != "index" and not _missing(n, _values(table.column(n))).any()]
    return (f"(this store's targets: {store.manifest.get('targets')}; columns with a value for every network: "
            f"{complete})")
