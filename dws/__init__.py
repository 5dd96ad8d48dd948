"""Deep Weight-Space networks (DWSNets): equivariant layers over MLP weight spaces.

See ``docs/dws.md`` for the layer's construction and the benchmark. The names below are loaded
on first use, so that importing a torch-free module of the package (``dws.tasks.options``, which
the ``zoo`` command reads at start-up) does not import PyTorch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "DWSLayer": "dws.nn",
    "DWSInvariantLayer": "dws.nn",
    "DWSNetInvariant": "dws.nn",
    "DWSNetEquivariant": "dws.nn",
    "dwsnet_mnist_inr_config": "dws.nn",
    "WeightSpace": "dws.weightspace",
    "random_group_element": "dws.weightspace",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dws' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted([*globals(), *_EXPORTS])
