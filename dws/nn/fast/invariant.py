"""The invariant layer on the accelerator's max-pool nodes (the same function as the plain one)."""

from __future__ import annotations

from dws.nn.fast.guard import autocasting
from dws.nn.fast.pools import FastPooledInputs
from dws.nn.invariant import DWSInvariantLayer


class FusedInvariantLayer(DWSInvariantLayer):
    """A :class:`~dws.nn.invariant.DWSInvariantLayer` accelerated in place by
    :func:`dws.nn.fast.accelerate`: its max pools are :class:`~dws.nn.fast.pools.MaxOverDims` nodes
    (a hidden weight's row pool in C where the kernels apply); ``use_native`` is set there."""

    use_native: bool

    def pooled_inputs(self, tensors: dict):
        if autocasting(next(iter(tensors.values()))):
            return super().pooled_inputs(tensors)
        return FastPooledInputs(tensors, self.pool, self.use_native)
