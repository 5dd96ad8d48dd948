"""Equivariant layers and models over weight spaces (one idea per module; see ``docs/dws.md``).

These are the plain modules: the paper's math, computed the straightforward way. The accelerator
(:mod:`dws.nn.fast`, ``accelerate(model)``) swaps fused forms of them into a model; nothing here
imports it.
"""

from dws.nn.invariant import DWSInvariantLayer
from dws.nn.layer import DWSLayer
from dws.nn.models import DWSNetEquivariant, DWSNetInvariant, dwsnet_mnist_inr_config
from dws.nn.pointwise import WSBatchNorm, WSDropout, WSReLU
from dws.nn.reduction import FreeAxisLinear

__all__ = [
    "DWSLayer",
    "DWSInvariantLayer",
    "DWSNetInvariant",
    "DWSNetEquivariant",
    "dwsnet_mnist_inr_config",
    "WSBatchNorm",
    "WSDropout",
    "WSReLU",
    "FreeAxisLinear",
]
