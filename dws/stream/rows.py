"""Which networks of a store are learned from: those that trained normally.

A classifier zoo marks a network whose training loss turned non-finite with a ``status`` other
than ``ok`` (``diverged``) and stores no ``test_accuracy`` for it (docs/classifiers.md). Such a
network is no sample of the zoo's distribution (its parameters stopped where the loss blew up),
so loaders leave it out of training and evaluation alike; :func:`excluded` says how many were
left out and why, for the run's log. Stores without a ``status`` column (INR zoos) use every
network.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from zoo.store import StoreError, WeightStore

STATUS, OK = "status", "ok"
VIEW = "view"  # which of an item's independently initialized networks a row is (``zoo generate --views``)


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
