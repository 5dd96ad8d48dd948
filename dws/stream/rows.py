"""Which networks of a store are learned from: those that trained normally, of the views asked
for, and at most ``limit`` of them spread over the split.

A classifier zoo marks a network whose training loss turned non-finite with a ``status`` other
than ``ok`` (``diverged``) and stores no ``test_accuracy`` for it (docs/classifiers.md). Such a
network is no sample of the zoo's distribution (its parameters stopped where the loss blew up),
so loaders leave it out of training and evaluation alike; :func:`excluded` says how many were
left out and why, for the run's log. Stores without a ``status`` column (INR zoos) use every
network.

A limit (``zoo train --train-limit N``, training-set-size sweeps) keeps N networks spread over the
split (:func:`limit_mask`), not its first N: stores are laid out in source order, and some sources
are sorted (the MNIST INR zoo by label, so its first 1000 train networks are digits 0-2 only).
:func:`selected_mask` combines the three rules; the loader and ``zoo train``'s counts both use it.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa

from zoo.store import StoreError, WeightStore

STATUS, OK = "status", "ok"
VIEW = "view"  # which of an item's independently initialized networks a row is (``zoo generate --views``)
LABEL = "label"  # the class a limit stratifies by, where every candidate network has one
# the limited subset's permutation: one per store, split and candidates, whatever the training seed
LIMIT_SEED = 0
# what a limit selects, recorded with a run that has one: "spread" (since 2026-11-27; before, a limit
# kept the split's first N networks, and a run saved then lacks this record: dws.tasks.prepare)
LIMIT_SELECTION = "spread"


def usable_mask(store: WeightStore, start: int, stop: int) -> np.ndarray:
    """``[stop - start]`` bools: network ``start + i`` trained normally (status ``ok``, or no status column)."""
    table = store.networks
    if STATUS not in table.column_names:
        return np.ones(stop - start, dtype=bool)
    status = table.column(STATUS).slice(start, stop - start).to_pylist()
    return np.array([s == OK for s in status], dtype=bool)


def view_mask(store: WeightStore, start: int, stop: int, views: int) -> np.ndarray:
    """``[stop - start]`` bools: network ``start + i`` is one of its item's first ``views`` views.

    A store generated with ``--views K`` holds K independently initialized networks of every item
    (seeded by their own index), so its first ``views`` views are distributed as a store generated
    with ``--views views``: one store at the largest K serves every row of the multi-view table.
    """
    if views < 1:
        raise ValueError(f"views must be at least 1, got {views}")
    table = store.networks
    if VIEW not in table.column_names:
        raise StoreError(f"{store.root}: networks.parquet has no {VIEW!r} column, so its networks cannot be "
                         f"selected by view (a zoo generated with --views has one)")
    stored = int(store.manifest.get("generation", {}).get("views", 1))
    if views > stored:
        raise StoreError(f"{store.root} holds {stored} view(s) per item (zoo generate --views {stored}); "
                         f"{views} asked for: generate the zoo with --views {views} or more")
    return table.column(VIEW).slice(start, stop - start).to_numpy(zero_copy_only=False) < views


def spread_order(store: WeightStore, start: int, stop: int, candidates: np.ndarray) -> np.ndarray:
    """``candidates`` (positions in ``start..stop``) in the fixed order a limit takes them from the front.

    A seeded permutation (:data:`LIMIT_SEED`), so the first N of it are a random subset, the same for
    every training seed, and nested across N: a size sweep's larger sets add networks to the smaller
    ones. Where every candidate has a ``label`` (INR zoos of images) the order is stratified: a class
    of ``n_c`` of the ``n`` candidates takes its ``r``-th member (in a random order) at the key
    ``(r + u_c) / n_c`` (``u_c`` uniform, a random phase per class), and the order sorts the keys, so
    every prefix of N holds ``N n_c / n`` of the class, up to one. Why stratify: a small subset drawn
    plainly misses or halves classes by chance (20 networks of 10 balanced classes: some class
    missing in 78% of draws), which a size sweep would read as an effect of the size; stratified, only
    the networks within a class are left to chance. Without labels (regression and classifier zoos)
    the order is the plain permutation.
    """
    rng = np.random.default_rng(LIMIT_SEED)
    shuffled = candidates[rng.permutation(len(candidates))]
    labels = strata(store, start, stop, shuffled)
    if labels is None:
        return shuffled
    classes, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    by_class = np.argsort(inverse, kind="stable")  # each class's members in shuffled order, class after class
    rank = np.empty(len(labels), dtype=np.int64)  # r: each network's place among its class
    rank[by_class] = np.arange(len(labels)) - (np.cumsum(counts) - counts)[inverse[by_class]]
    phase = rng.random(len(classes))
    keys = (rank + phase[inverse]) / counts[inverse]
    return shuffled[np.argsort(keys, kind="stable")]


def strata(store: WeightStore, start: int, stop: int, candidates: np.ndarray) -> np.ndarray | None:
    """The labels of ``candidates`` (positions in ``start..stop``) that :func:`spread_order` stratifies
    by, or None where one has none (no integer ``label`` column, a null, or label -1: regression and
    classifier zoos)."""
    table = store.networks
    if LABEL not in table.column_names:
        return None
    column = table.column(LABEL).slice(start, stop - start)
    if column.null_count or not pa.types.is_integer(column.type):
        return None
    labels = column.to_numpy(zero_copy_only=False)[candidates]
    return None if (labels < 0).any() else labels


def limit_mask(store: WeightStore, start: int, stop: int, limit: int, keep: np.ndarray | None = None) -> np.ndarray:
    """``[stop - start]`` bools: the first ``limit`` networks of :func:`spread_order` among those ``keep``
    marks (None: every network of the range); all of them where there are no more than ``limit``."""
    if limit < 1:
        raise ValueError(f"limit must be positive, got {limit}")
    candidates = np.arange(stop - start) if keep is None else np.flatnonzero(keep)
    chosen = np.zeros(stop - start, dtype=bool)
    chosen[spread_order(store, start, stop, candidates)[:limit]] = True
    return chosen


def selected_mask(store: WeightStore, start: int, stop: int, *, only_ok: bool = True, views: int | None = None,
                  limit: int | None = None) -> np.ndarray | None:
    """``[stop - start]`` bools: the networks of ``start..stop-1`` a loader uses (None: every one):
    those that trained normally (``only_ok``, :func:`usable_mask`), of the first ``views`` views
    (:func:`view_mask`), and of those ``limit`` spread over the range (:func:`limit_mask`)."""
    keep = usable_mask(store, start, stop) if only_ok else None
    if views is not None:
        chosen = view_mask(store, start, stop, views)
        keep = chosen if keep is None else keep & chosen
    if limit is not None:
        keep = limit_mask(store, start, stop, limit, keep)
    return None if keep is None or keep.all() else keep


def excluded(store: WeightStore, start: int, stop: int) -> Counter:
    """``{status: count}`` of the networks ``start..stop-1`` that :func:`usable_mask` leaves out."""
    table = store.networks
    if STATUS not in table.column_names:
        return Counter()
    return Counter(str(s) for s in table.column(STATUS).slice(start, stop - start).to_pylist() if s != OK)


def describe_excluded(counts: Counter, total: int, where: str) -> str:
    """``"3 of 744 train networks left out (status: diverged 3)"``."""
    detail = ", ".join(f"{status} {n}" for status, n in sorted(counts.items()))
    return f"{sum(counts.values())} of {total} {where} networks left out (status: {detail})"
