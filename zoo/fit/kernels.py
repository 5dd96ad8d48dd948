"""Fused CPU kernels for the elementwise part of a SIREN fitting step (numba).

A fitting step on a CPU spends as much time in sines, cosines and elementwise passes as in its
batched matmuls: PyTorch computes ``sin`` and ``cos`` of the same pre-activation in two passes
(~2.3 ns per element each here), and every elementwise op reads and writes a tensor of its own.
These kernels do each elementwise stage in one pass: one range reduction shared by the sine and
the cosine (a Cody-Waite reduction by pi/2 and Cephes' minimax polynomials, max error ~1e-7 for
the pre-activations a SIREN sees), the first layer's separable ``sin(a + b)`` expansion on a grid
written straight into the activation buffer, and the first layer's gradient reduced from the
separable cosines without materializing them. They are plain loops that LLVM vectorizes; the
matmuls stay with PyTorch (MKL). ``available()`` is False where numba is not installed; the
fitter then uses the PyTorch formulation (which is also what runs on a GPU).
"""

from __future__ import annotations

import numpy as np

try:  # optional: the GPU machine and minimal installs run the PyTorch formulation instead
    import numba
except ImportError:  # pragma: no cover - exercised only where numba is missing
    numba = None


def available() -> bool:
    return numba is not None


# Cody-Waite split of pi/2 (the leading parts have few bits, so q * part is exact in float32 for
# |q| < 2**12, i.e. |x| < ~6,000) and Cephes' single-precision minimax coefficients on [-pi/4, pi/4].
_TWO_OVER_PI = np.float32(0.6366197723675814)
_PIO2_A = np.float32(1.5703125)
_PIO2_B = np.float32(4.837512969970703125e-4)
_PIO2_C = np.float32(7.54978995489188216e-8)
_S1, _S2, _S3 = np.float32(-1.6666654611e-1), np.float32(8.3321608736e-3), np.float32(-1.9515295891e-4)
_C1, _C2, _C3 = np.float32(4.166664568298827e-2), np.float32(-1.388731625493765e-3), np.float32(2.443315711809948e-5)
_HALF, _ONE = np.float32(0.5), np.float32(1.0)

# Everything but reassociation: reassociating would undo the Cody-Waite reduction's exactness.
_FASTMATH = {"contract", "afn", "nnan", "ninf", "nsz", "arcp"}


def _jit(inline: bool = False, reassociate: bool = False):
    """numba's ``njit``; ``reassociate`` lets LLVM vectorize sums (no range reduction inside)."""
    if numba is None:  # pragma: no cover
        return lambda f: f
    fastmath = True if reassociate else _FASTMATH
    if inline:
        return numba.njit(fastmath=fastmath, inline="always")
    return numba.njit(fastmath=fastmath, cache=True, nogil=True)


@_jit(inline=True)
def _sincos(x):
    q = np.floor(x * _TWO_OVER_PI + _HALF)
    r = ((x - q * _PIO2_A) - q * _PIO2_B) - q * _PIO2_C
    z = r * r
    s = r + r * z * (_S1 + z * (_S2 + z * _S3))
    c = _ONE - _HALF * z + z * z * (_C1 + z * (_C2 + z * _C3))
    quadrant = np.int32(q)
    swap = (quadrant & 1) != 0
    sin_x = c if swap else s
    cos_x = s if swap else c
    sin_x = -sin_x if (quadrant & 2) != 0 else sin_x
    cos_x = -cos_x if ((quadrant + 1) & 2) != 0 else cos_x
    return sin_x, cos_x


@_jit()
def sincos(x, sin_out, cos_out):
    """Elementwise ``sin`` and ``cos`` of a float32 array (any shape, C-contiguous)."""
    xf, sf, cf = x.reshape(x.size), sin_out.reshape(x.size), cos_out.reshape(x.size)
    for i in range(xf.size):
        sf[i], cf[i] = _sincos(xf[i])


@_jit()
def sine_activation_(z, bias, w0, cos_out):
    """``z <- sin(w0 * (z + bias))`` in place and ``cos_out <- cos(w0 * (z + bias))``.

    ``z`` is ``[K, D, P]`` (a layer's matmul output), ``bias`` ``[K, D]``.
    """
    K, D, P = z.shape
    for k in range(K):
        for d in range(D):
            b = bias[k, d]
            for p in range(P):
                z[k, d, p], cos_out[k, d, p] = _sincos(w0 * (z[k, d, p] + b))


@_jit()
def backprop_rank_one_(cos, weight, grad_out):
    """``cos <- weight[k, d] * grad_out[k, p] * cos[k, d, p]``: the gradient w.r.t. the
    pre-activations of the last hidden layer when the output layer has a single channel
    (``weight`` = its ``[K, D]`` weights times any scale, ``grad_out`` ``[K, P]``), in place."""
    K, D, P = cos.shape
    for k in range(K):
        for d in range(D):
            w = weight[k, d]
            for p in range(P):
                cos[k, d, p] *= w * grad_out[k, p]


@_jit()
def grid_sine_layer(weight, bias, w0, ys, xs, h, sin_row, cos_row, sin_col, cos_col):
    """First SIREN layer on a row-major grid: ``h[k, d, i*W + j] = sin(w0 (W[k,d,0] ys[i] +
    W[k,d,1] xs[j] + b[k,d]))`` via ``sin(r + c) = sin r cos c + cos r sin c``.

    Also stores the row and column sines and cosines (``[K, D, H]``, ``[K, D, W]``) for the backward.
    """
    K, D, _ = weight.shape
    H, W = ys.size, xs.size
    for k in range(K):
        for d in range(D):
            wy, wx, b = w0 * weight[k, d, 0], w0 * weight[k, d, 1], w0 * bias[k, d]
            for j in range(W):
                sin_col[k, d, j], cos_col[k, d, j] = _sincos(wx * xs[j])
            for i in range(H):
                sr, cr = _sincos(wy * ys[i] + b)
                sin_row[k, d, i], cos_row[k, d, i] = sr, cr
                row = i * W
                for j in range(W):
                    h[k, d, row + j] = sr * cos_col[k, d, j] + cr * sin_col[k, d, j]


@_jit(reassociate=True)
def grid_sine_layer_grads(grad_h, w0, ys, xs, sin_row, cos_row, sin_col, cos_col, grad_w, grad_b):
    """First-layer weight and bias gradients on a grid from ``grad_h`` = dLoss/d(activation).

    The cosine of pixel ``(i, j)`` is ``cos r_i cos c_j - sin r_i sin c_j``, so the per-row and
    per-column sums of ``grad_h * cos`` come from four running sums without the ``[K, D, H*W]``
    cosine tensor.
    """
    K, D, _ = grad_h.shape
    H, W = ys.size, xs.size
    col_c = np.empty(W, np.float32)  # sum_i g[i, j] cos r_i
    col_s = np.empty(W, np.float32)  # sum_i g[i, j] sin r_i
    for k in range(K):
        for d in range(D):
            col_c[:] = 0.0
            col_s[:] = 0.0
            gy = np.float32(0.0)
            gb = np.float32(0.0)
            for i in range(H):
                sr, cr = sin_row[k, d, i], cos_row[k, d, i]
                row = i * W
                acc_c = np.float32(0.0)  # sum_j g[i, j] cos c_j
                acc_s = np.float32(0.0)  # sum_j g[i, j] sin c_j
                for j in range(W):
                    g = grad_h[k, d, row + j]
                    acc_c += g * cos_col[k, d, j]
                    acc_s += g * sin_col[k, d, j]
                    col_c[j] += g * cr
                    col_s[j] += g * sr
                per_row = cr * acc_c - sr * acc_s
                gy += per_row * ys[i]
                gb += per_row
            gx = np.float32(0.0)
            for j in range(W):
                gx += (cos_col[k, d, j] * col_c[j] - sin_col[k, d, j] * col_s[j]) * xs[j]
            grad_w[k, d, 0] = w0 * gy
            grad_w[k, d, 1] = w0 * gx
            grad_b[k, d] = w0 * gb
