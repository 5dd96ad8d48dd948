"""The fitting step through the native kernels (:mod:`zoo.fit.native`): one C call per step.

Same contract and the same math as :func:`zoo.fit.siren.mse_and_grads`. The C code handles one
network after the other, so a network's result does not depend on which others share its group.
"""

from __future__ import annotations

import ctypes

import torch

from . import native
from .siren import Grid2D, SirenSpec, point_count

Tensor = torch.Tensor


def native_step_supported(spec: SirenSpec, coords, device) -> bool:
    """Whether the native step can fit ``spec`` on ``coords`` here: a CPU with the kernels built,
    hidden widths that are multiples of 4, and a point count that is a multiple of 8."""
    if torch.device(device).type != "cpu" or not native.available():
        return False
    points = point_count(coords)
    grid_ok = not isinstance(coords, Grid2D) or spec.widths[0] == 2
    return grid_ok and points % 8 == 0 and all(d % 4 == 0 for d in spec.widths[1:-1]) and spec.num_layers <= 64


def _pointers(tensors) -> ctypes.Array:
    return (ctypes.c_void_p * len(tensors))(*(t.data_ptr() for t in tensors))


class NativeSirenStep:
    """Callable ``(spec, weights, biases, coords, targets) -> (mse, grad_w, grad_b)`` for float32
    CPU tensors; ``coords`` must be the one given at construction. Gradients are views of buffers
    reused by the next call."""

    def __init__(self, spec: SirenSpec, coords, max_networks: int):
        self.lib = native.library()
        if self.lib is None:
            raise RuntimeError("the native fitting kernels are not available here")
        self.spec, self.coords, self.capacity = spec, coords, max_networks
        self._widths = (ctypes.c_int * len(spec.widths))(*spec.widths)
        if isinstance(coords, Grid2D):
            self._ys, self._xs = coords.ys.float().contiguous(), coords.xs.float().contiguous()
            height, width = self._ys.numel(), self._xs.numel()
            grid_axes, coords_t = (self._ys.data_ptr(), self._xs.data_ptr()), None
        else:
            self._coords_t = coords.float().T.contiguous()  # [d_0, P]
            height = width = 0
            grid_axes, coords_t = (None, None), self._coords_t.data_ptr()
        points = point_count(coords)
        self._shape = native.SirenShape(spec.num_layers, self._widths, points, height, width, *grid_axes, coords_t,
                                        spec.w0_first, spec.w0_hidden, spec.output_offset)
        self._scratch = torch.empty(self.lib.zoo_siren_scratch_floats(ctypes.byref(self._shape)))
        pairs = list(zip(spec.widths[:-1], spec.widths[1:]))
        self._grad_w = [torch.empty(max_networks, d_out, d_in) for d_in, d_out in pairs]
        self._grad_b = [torch.empty(max_networks, d_out) for _, d_out in pairs]
        self._mse = torch.empty(max_networks)

    def __call__(self, spec: SirenSpec, weights, biases, coords, targets: Tensor):
        if coords is not self.coords or spec != self.spec:
            raise ValueError("NativeSirenStep was built for other coordinates or another architecture")
        K = weights[0].shape[0]
        if K > self.capacity:
            raise ValueError(f"{K} networks but room for {self.capacity}")
        if any(t.dtype != torch.float32 or t.device.type != "cpu" for t in [*weights, *biases, targets]):
            raise ValueError("the native step takes float32 CPU tensors")
        weights = [w.contiguous() for w in weights]
        biases = [b.contiguous() for b in biases]
        targets = targets.contiguous()
        grad_w, grad_b, mse = [g[:K] for g in self._grad_w], [g[:K] for g in self._grad_b], self._mse[:K]
        status = self.lib.zoo_siren_step(
            ctypes.byref(self._shape), K, _pointers(weights), _pointers(biases), targets.data_ptr(),
            mse.data_ptr(), _pointers(grad_w), _pointers(grad_b), self._scratch.data_ptr(),
        )
        if status != 0:
            raise ValueError(f"the native step does not support {spec.widths} on these coordinates")
        return mse, grad_w, grad_b
