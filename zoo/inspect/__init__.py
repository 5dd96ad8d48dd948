"""Human-facing views of a store: the ``zoo info`` summary and the ``zoo show`` picture, by zoo family
(INR zoos in :mod:`zoo.inspect.inrs`, classifier zoos in :mod:`zoo.inspect.classifiers`)."""

from __future__ import annotations

from pathlib import Path

from ..store import WeightStore
from . import classifiers, inrs
from .inrs import coordinates, decode, spec_of  # noqa: F401  (INR helpers used by tests and pipelines)


def summary(store: WeightStore) -> str:
    return (classifiers if classifiers.is_classifier_store(store) else inrs).summary(store)


def show(store: WeightStore, out: Path, count: int = 8, data_root: str | None = None) -> Path:
    if classifiers.is_classifier_store(store):
        return classifiers.show(store, out, count)
    return inrs.show(store, out, count, data_root)
