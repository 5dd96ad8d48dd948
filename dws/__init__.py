"""Deep Weight-Space networks (DWSNets): equivariant layers over MLP weight spaces.

See ``docs/dws.md`` for the layer's construction and the benchmark.
"""

from dws.nn import (
    DWSInvariantLayer,
    DWSLayer,
    DWSNetEquivariant,
    DWSNetInvariant,
    dwsnet_mnist_inr_config,
)
from dws.weightspace import WeightSpace, random_group_element

__all__ = ["DWSLayer", "DWSInvariantLayer", "DWSNetInvariant", "DWSNetEquivariant",
           "dwsnet_mnist_inr_config", "WeightSpace", "random_group_element"]
