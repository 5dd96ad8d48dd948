"""Per-entry normalization statistics over the train split, reduced from per-chunk moments.

Each chunk contributes ``(count, mean, M2)`` for its train rows; chunks are combined with Chan et
al.'s parallel update, which stays accurate where a naive sum of squares would cancel, and always
in chunk order: float addition is not associative, so a reduction in the order chunks happen to
finish gave two identical runs statistics that differed in the last bits. A chunk's moments are
computed from its float32 values as stored, by the task that made it or from the store, with the
same result either way, so a resumed store's statistics equal an uninterrupted one's bit for bit.

Networks whose row says they did not train normally (``status`` other than ``ok``: a classifier
whose loss turned non-finite) are left out: their parameters may be huge and would swamp the
normalization of every other network (unless no train network at all trained normally).

A chunk's moments are computed a block of entries at a time (:func:`_entry_moments`), in threads
where the caller has cores to spare: the same float64 sums in the same order as over the whole
chunk, bit for bit, without a float64 copy of the chunk and its temporaries (a 482 MB classifier
chunk: 0.49 s -> 0.10 s on one core of the development machine).
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from functools import reduce

import numpy as np
import pyarrow as pa
import zarr

from .format import STATS_GROUP, array_codecs, arrays_path
from .location import zarr_location
from .writer import arrays_root, record_metadata

STD_FLOOR = 1e-8  # entries that never vary are divided by 1 instead of ~0
#: entries whose moments are computed at a time: a block of a chunk's networks in float64 stays in
#: cache (894 networks x 256 entries: 1.8 MB)
BLOCK_ENTRIES = 256


@dataclass
class Moments:
    count: int
    mean: dict[str, np.ndarray]
    m2: dict[str, np.ndarray]

    @classmethod
    def of(cls, arrays: dict[str, np.ndarray], rows: np.ndarray | None = None, threads: int = 1) -> "Moments":
        """The moments of ``arrays`` (``[networks, ...]`` each) over their networks, or over those at
        positions ``rows``; ``threads``: blocks of entries computed at once."""
        count = len(rows) if rows is not None else len(next(iter(arrays.values())))
        if count == 0:
            return cls(0, {k: np.zeros(v.shape[1:]) for k, v in arrays.items()},
                       {k: np.zeros(v.shape[1:]) for k, v in arrays.items()})
        with ThreadPoolExecutor(threads) if threads > 1 else nullcontext() as pool:
            each = map if pool is None else pool.map
            both = {k: _entry_moments(np.asarray(v), rows, each) for k, v in arrays.items()}
        return cls(count, {k: mean for k, (mean, _) in both.items()}, {k: m2 for k, (_, m2) in both.items()})

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


def _mean_and_m2(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per entry over axis 0, in float64: the mean and the sum of squared deviations from it (M2)."""
    values = np.asarray(values, dtype=np.float64)
    mean = values.mean(0)
    return mean, ((values - mean) ** 2).sum(0)


def _entry_moments(values: np.ndarray, rows: np.ndarray | None, each=map) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_mean_and_m2` of ``values[rows]``, :data:`BLOCK_ENTRIES` entries at a time (``each``: ``map``,
    or a thread pool's).

    Bit for bit the whole array's: numpy reduces axis 0 of an array whose other axes hold two or
    more entries row after row for each entry (pairwise summation is only for the contiguous axis,
    which a single-entry array's axis 0 becomes), so an entry's sums do not depend on its
    neighbours. Blocks therefore hold two or more entries, and arrays of a few blocks go whole."""
    if math.prod(values.shape[1:]) <= 2 * BLOCK_ENTRIES:
        return _mean_and_m2(values if rows is None else values[rows])
    flat = values.reshape(len(values), -1)
    starts = list(range(0, flat.shape[1], BLOCK_ENTRIES))
    if flat.shape[1] - starts[-1] < 2:  # a last block of one entry joins the one before
        starts.pop()
    bounds = list(zip(starts, starts[1:] + [flat.shape[1]]))
    mean, m2 = np.empty(flat.shape[1]), np.empty(flat.shape[1])

    def block(bound: tuple[int, int]) -> None:
        lo, hi = bound
        mean[lo:hi], m2[lo:hi] = _mean_and_m2(flat[:, lo:hi] if rows is None else flat[rows, lo:hi])

    for _ in each(block, bounds):
        pass
    return mean.reshape(values.shape[1:]), m2.reshape(values.shape[1:])


def empty_moments(parameters: dict) -> Moments:
    """No networks yet, for parameters ``{name: per-network shape}``."""
    return Moments.of({name: np.zeros((0, *shape)) for name, shape in parameters.items()})


@dataclass
class TrainMoments:
    """One chunk's share of the statistics: the moments of its train networks that trained
    normally, and of all its train networks (for a store where none trained normally)."""

    normal: Moments
    all: Moments


def row_status(rows: pa.Table, start: int, stop: int) -> np.ndarray | None:
    """``status`` of networks ``start..stop-1`` from their rows (``None``: the table has no status)."""
    if "status" not in rows.column_names:
        return None
    status = np.full(stop - start, None, dtype=object)
    status[rows.column("index").to_numpy() - start] = rows.column("status").to_pylist()
    return status


def chunk_train_moments(values: dict[str, np.ndarray], start: int, train_stop: int,
                        status: np.ndarray | None, threads: int = 1) -> TrainMoments:
    """The moments of a chunk's train networks (indices below ``train_stop``) from its float32
    ``values`` (``[n, ...]`` for networks ``start..``); ``status`` as :func:`row_status` gives it;
    ``threads``: see :meth:`Moments.of`."""
    n = max(0, min(len(next(iter(values.values()))), train_stop - start))
    train = {name: np.ascontiguousarray(v[:n], dtype=np.float32) for name, v in values.items()}
    every = Moments.of(train, threads=threads)
    if status is None or (status[:n] == "ok").all():
        return TrainMoments(every, every)
    keep = np.flatnonzero(status[:n] == "ok")
    return TrainMoments(Moments.of(train, rows=keep, threads=threads), every)


def reduce_moments(parts: list[TrainMoments]) -> tuple[Moments, bool]:
    """The chunks' moments combined in the order given (chunk order); ``True`` when no network
    trained normally and the statistics fall back on all of them."""
    normal = reduce(Moments.combine, [p.normal for p in parts])
    if normal.count:
        return normal, False
    return reduce(Moments.combine, [p.all for p in parts]), True


def write_stats(root, moments: Moments, manifest: dict) -> dict:
    """Store ``<name>_mean`` and ``<name>_std`` arrays and record their metadata's checksums in
    ``manifest``; returns the manifest entry describing them."""
    group = zarr.open_group(zarr_location(arrays_root(root, manifest)), mode="r+", zarr_format=3,
                            use_consolidated=False).require_group(STATS_GROUP)
    std = moments.std()
    nodes = {STATS_GROUP: group}
    for name, mean in moments.mean.items():
        for stat, values in (("mean", mean), ("std", np.maximum(std[name], STD_FLOOR))):
            nodes[f"{STATS_GROUP}/{name}_{stat}"] = group.create_array(
                f"{name}_{stat}", data=values.astype(np.float32), overwrite=True, **array_codecs(manifest))
    record_metadata(manifest, nodes)
    return {
        "split": "train",
        "count": moments.count,
        "group": "/".join(p for p in (arrays_path(manifest), STATS_GROUP) if p),
        "arrays": "<param>_mean, <param>_std (population std, floored at %g)" % STD_FLOOR,
        "apply": "(value - mean) / std, per entry",
    }
