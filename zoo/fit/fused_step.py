"""The CPU fitting step where the native one (:mod:`zoo.fit.native_step`) cannot run: batched MKL
matmuls + fused numba elementwise kernels + reused buffers.

Same contract and same math as :func:`zoo.fit.siren.mse_and_grads` (per-network MSE and the
gradients of their sum), arranged for a CPU:

* every sine layer's ``sin`` and ``cos`` come from one fused pass (:mod:`zoo.fit.kernels`), the
  first layer on a grid from its row and column sines, and its gradient from the same small
  tables, so the first layer's cosines are never materialized;
* all activations, cosines and gradients live in buffers allocated once per fit and reused every
  step (``out=`` everywhere). Fresh multi-megabyte tensors each step cost more than the arithmetic
  on this kind of machine: the allocator returns them to the OS and every page faults back in.

Gradients are returned as views of those buffers: they are valid until the next call.
"""

from __future__ import annotations

import numpy as np
import torch

from . import kernels
from .siren import Grid2D, SirenSpec, point_count

Tensor = torch.Tensor


def fused_step_supported(device) -> bool:
    return kernels.available() and torch.device(device).type == "cpu"


class FusedSirenStep:
    """Callable ``(spec, weights, biases, coords, targets) -> (mse, grad_w, grad_b)`` for float32
    CPU tensors; ``coords`` must be the one given at construction."""

    def __init__(self, coords, max_networks: int):
        self.coords = coords
        self.grid = isinstance(coords, Grid2D)
        if self.grid:
            self.ys = coords.ys.contiguous().numpy()
            self.xs = coords.xs.contiguous().numpy()
        else:
            self.coords_t = coords.T.contiguous()  # [d_0, P]
        self.points = point_count(coords)
        self.capacity = max_networks
        self._buffers: dict[str, Tensor] = {}

    def _buf(self, name: str, K: int, *shape: int) -> Tensor:
        buf = self._buffers.get(name)
        if buf is None:
            buf = self._buffers[name] = torch.empty(self.capacity, *shape)
        return buf[:K]

    def __call__(self, spec: SirenSpec, weights, biases, coords, targets: Tensor):
        if coords is not self.coords:
            raise ValueError("FusedSirenStep was built for other coordinates")
        K, P, L = weights[0].shape[0], self.points, spec.num_layers
        widths, w0 = spec.widths, [np.float32(w) if w is not None else None for w in spec.w0()]
        weights = [w.contiguous() for w in weights]
        biases = [b.contiguous() for b in biases]

        # ---- forward: acts[m] is the input of layer m + 1 (sine outputs), coss[m] its cosine
        acts, coss = [], []
        h = self._buf("h0", K, widths[1], P)
        if self.grid:
            H, W = len(self.ys), len(self.xs)
            tables = (self._buf("sin_row", K, widths[1], H), self._buf("cos_row", K, widths[1], H),
                      self._buf("sin_col", K, widths[1], W), self._buf("cos_col", K, widths[1], W))
            kernels.grid_sine_layer(weights[0].numpy(), biases[0].numpy(), w0[0], self.ys, self.xs, h.numpy(),
                                    *(t.numpy() for t in tables))
            coss.append(None)
        else:
            torch.bmm(weights[0], self.coords_t.expand(K, -1, -1), out=h)
            c = self._buf("cos0", K, widths[1], P)
            kernels.sine_activation_(h.numpy(), biases[0].numpy(), w0[0], c.numpy())
            coss.append(c)
        acts.append(h)
        for m in range(1, L - 1):
            h = torch.bmm(weights[m], acts[-1], out=self._buf(f"h{m}", K, widths[m + 1], P))
            c = self._buf(f"cos{m}", K, widths[m + 1], P)
            kernels.sine_activation_(h.numpy(), biases[m].numpy(), w0[m], c.numpy())
            acts.append(h)
            coss.append(c)
        err = torch.baddbmm(biases[-1].unsqueeze(2), weights[-1], acts[-1], out=self._buf("y", K, widths[-1], P))
        if spec.output_offset:
            err.add_(spec.output_offset)
        err.sub_(targets.transpose(1, 2))
        mse = err.square().mean(dim=(1, 2))
        g = err.mul_(2.0 / (P * widths[-1]))  # d(sum_k mse_k)/dy

        # ---- backward: g is dLoss/d(pre-activation) of layer m, without layer m's w0 factor
        grad_w, grad_b = [None] * L, [None] * L
        for m in range(L - 1, 0, -1):
            scale = 1.0 if w0[m] is None else float(w0[m])
            grad_w[m] = torch.bmm(g, acts[m - 1].transpose(1, 2), out=self._buf(f"gw{m}", K, *weights[m].shape[1:]))
            grad_b[m] = torch.sum(g, dim=2, out=self._buf(f"gb{m}", K, widths[m + 1]))
            if scale != 1.0:
                grad_w[m].mul_(scale)
                grad_b[m].mul_(scale)
            w_t = weights[m].transpose(1, 2) * scale  # [K, d_m, d_{m+1}]
            cos = coss[m - 1]  # None for the first layer on a grid (its kernel applies it)
            if cos is not None and g.shape[1] == 1:  # one output channel: a fused rank-one update
                kernels.backprop_rank_one_(cos.numpy(), w_t[:, :, 0].contiguous().numpy(), g[:, 0].numpy())
                g = cos  # (the cosine is not needed any more)
                continue
            gh = self._buf(f"gh{m - 1}", K, widths[m], P)  # dLoss/d(activation of layer m - 1)
            if g.shape[1] == 1:
                torch.mul(w_t, g, out=gh)
            else:
                torch.bmm(w_t, g, out=gh)
            g = gh if cos is None else gh.mul_(cos)
        gw0, gb0 = self._buf("gw0", K, widths[1], widths[0]), self._buf("gb0", K, widths[1])
        if self.grid:
            kernels.grid_sine_layer_grads(g.numpy(), w0[0], self.ys, self.xs, *(t.numpy() for t in tables),
                                          gw0.numpy(), gb0.numpy())
        else:
            torch.bmm(g, self.coords_t.T.expand(K, -1, -1), out=gw0).mul_(float(w0[0]))
            torch.sum(g, dim=2, out=gb0).mul_(float(w0[0]))
        grad_w[0], grad_b[0] = gw0, gb0
        return mse, grad_w, grad_b
