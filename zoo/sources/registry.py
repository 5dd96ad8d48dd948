"""Data sources by name: ``get_source("mnist", root)`` and friends."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from . import cifar10, mnist
from .base import Source
from .errors import DataError
from .offline import DigitsSource, MnistOfflineSource, MnistOfflineXLSource
from .sines import SINE_REGRESSION, SINE_SSL, SineSource

DATA_ROOT_ENV = "ZOO_DATA_ROOT"


def _needs_root(root: str | Path | None, name: str) -> Path:
    if root is None and not os.environ.get(DATA_ROOT_ENV):
        raise DataError(f"source {name!r} reads files: pass root=<folder with the data> or set ${DATA_ROOT_ENV}.")
    return Path(root if root is not None else os.environ[DATA_ROOT_ENV])


def _idx(dataset: mnist.IdxDataset) -> Callable[..., Source]:
    def make(root, download, **options):
        root = _needs_root(root, dataset.name)
        if download:
            mnist.download(root, dataset)
        return mnist.IdxSource(root, dataset, **options)
    return make


def _cifar10(root, download, **options):
    root = _needs_root(root, "cifar10")
    if download:
        cifar10.download(root)
    return cifar10.Cifar10Source(root, **options)


def _mnist_offline(root, download, **options):
    return MnistOfflineSource(test_root=root, **options)  # nothing to download: the files ship locally


def _mnist_offline_xl(root, download, **options):
    return MnistOfflineXLSource(test_root=root, **options)


def _builtin(make: Callable[..., Source]) -> Callable[..., Source]:
    """Sources that read no files of their own (generated, or shipped with a package)."""
    def build(root, download, **options):
        if root is not None:
            raise ValueError(f"this source reads no data folder; got root={str(root)!r}")
        return make(**options)
    return build


SOURCES: dict[str, Callable[..., Source]] = {
    "mnist": _idx(mnist.MNIST),
    "fashion-mnist": _idx(mnist.FASHION_MNIST),
    "cifar10": _cifar10,
    "mnist-offline": _mnist_offline,
    "mnist-offline-xl": _mnist_offline_xl,
    "digits": _builtin(DigitsSource),
    "sine-regression": _builtin(lambda **o: SineSource(SINE_REGRESSION, **o)),
    "sine-ssl": _builtin(lambda **o: SineSource(SINE_SSL, **o)),
}


def get_source(name: str, root: str | Path | None = None, download: bool = False, **options) -> Source:
    """The source called ``name``; ``options`` go to its constructor (``verify``, ``holdout``, ``seed``, ``sizes``).

    ``root`` is the data folder (for ``mnist-offline``: the folder of the real test files).
    ``download=True`` fetches missing files first, for the sources that have files to fetch.
    """
    if name not in SOURCES:
        raise KeyError(f"unknown data source {name!r}; known: {', '.join(SOURCES)}")
    return SOURCES[name](root, download, **options)
