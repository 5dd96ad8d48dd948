"""The accelerator of the DWS modules: the same functions as :mod:`dws.nn` with fewer memory passes.

``accelerate(model, backend="auto")`` swaps fused forms in for the plain modules of a model, in
place (same parameters and state dict); ``restore(model)`` undoes it; ``suspended(model)`` runs the
plain modules inside a ``with`` block. Nothing here is imported by :mod:`dws.nn`, and the native
kernels are built and loaded only by :func:`accelerate`. See ``docs/dws.md``, "Accelerator".

Rooms: :mod:`~dws.nn.fast.apply` (what gets swapped), :mod:`~dws.nn.fast.layer`,
:mod:`~dws.nn.fast.invariant`, :mod:`~dws.nn.fast.batchnorm`, :mod:`~dws.nn.fast.stack` (the
fused forms); :mod:`~dws.nn.fast.pools`, :mod:`~dws.nn.fast.identity`, :mod:`~dws.nn.fast.matmul`,
:mod:`~dws.nn.fast.bn_relu` (their autograd nodes), :mod:`~dws.nn.fast.pending` (a layer output
with its broadcast terms not yet added), :mod:`~dws.nn.fast.guard` (when a module may be fused),
:mod:`~dws.nn.fast.native`, :mod:`~dws.nn.fast.native_pools` and ``kernels.c`` (the C kernels).
"""

from dws.nn.fast.apply import BACKENDS, accelerate, describe, restore, suspended

__all__ = ["BACKENDS", "accelerate", "describe", "restore", "suspended"]
