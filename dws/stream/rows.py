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

from zoo.store import WeightStore

STATUS, OK = "status", "ok"


def usable_mask(store: WeightStore, start: int, stop: int) -> np.ndarray:
    """``[stop - start]`` bools: network ``start + i`` trained normally (status ``ok``, or no status column)."""
    table = store.networks
    if STATUS not in table.column_names:
        return np.ones(stop - start, dtype=bool)
    status = table.column(STATUS).slice(start, stop - start).to_pylist()
    return np.array([s == OK for s in status], dtype=bool)


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
