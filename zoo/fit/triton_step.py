"""The GPU fitting step: one Triton kernel per step does forward, loss, backward, early stop and Adam.

Why: on a GPU the PyTorch step (:func:`zoo.fit.siren.mse_and_grads` + :class:`~zoo.fit.adam.MaskedAdam`)
is ~68 kernels a step, every activation makes a round trip through GPU memory, and the early stop
synchronizes with the host every step (measured on an H100: 5.7 ms a step for 4,096 MNIST SIRENs,
~6% of the fp32 peak). Here one program fits one network: it walks the network's points in tiles
of ``BLOCK_P``, keeps each tile's activations, cosines and gradients in registers, accumulates the
parameter gradients over the tiles, then (same program, no second launch) decides the early stop
and applies Adam to its own parameters. The step never synchronizes with the host; the driver
(:func:`fit_group_triton`) reads the frozen flags every ``CHECK_EVERY`` steps to stop once all
networks are done.

Same math as ``zoo/fit/siren_step.c`` and :func:`zoo.fit.siren.mse_and_grads` (the sine and cosine
by the same Cody-Waite reduction and minimax polynomials, max error ~1e-7), and the same update as
``torch.optim.Adam``; results agree with the PyTorch step up to float rounding (tested in Triton's
CPU interpreter, ``TRITON_INTERPRET=1``). Architectures: SIRENs with one hidden sine layer after
the first (widths ``d_0, H, H, d_out``; every INR kind of this project), ``H`` a power of two of
at least 16, ``d_0`` and ``d_out`` at most 4. Others fall back to the PyTorch step.

A network's parameters live in one flat float32 row ``[W1 (H x d_0), b1, W2 (H x H), b2,
W3 (d_out x H), b3]`` (PyTorch's out x in layout), with Adam's two moments in rows of the same
shape.
"""

from __future__ import annotations

import math
import os

import torch

from .siren import Grid2D, SirenSpec, init_params, point_count

try:  # optional: CUDA machines with Triton, and the dev install (its CPU interpreter runs the tests)
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where Triton is not installed
    triton = None

Tensor = torch.Tensor
CHECK_EVERY = 25  # steps between the driver's looks at the frozen flags (its only host synchronization)
MAX_IO = 4  # largest d_0 and d_out the kernel takes


def available() -> bool:
    """Triton is importable (whether a GPU or its interpreter runs it is the caller's business)."""
    return triton is not None


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def supports(spec: SirenSpec) -> str | None:
    """``None`` where the kernel fits ``spec``, else why not."""
    w = spec.widths
    if len(w) != 4:
        return f"the Triton step fits SIRENs of widths (d_0, H, H, d_out), not {w}"
    if w[1] != w[2] or w[1] < 16 or w[1] & (w[1] - 1):
        return f"the Triton step needs equal hidden widths that are a power of two >= 16, not {w}"
    if w[0] > MAX_IO or w[3] > MAX_IO:
        return f"the Triton step takes at most {MAX_IO} inputs and outputs, not {w}"
    return None


def step_supported(spec: SirenSpec, device) -> bool:
    """Whether the Triton step is the default: Triton importable, a CUDA device, ``spec`` fits. (In
    the interpreter it runs on the CPU too, when asked for by name: slowly, for tests.)"""
    return available() and torch.device(device).type == "cuda" and supports(spec) is None


# the fastest accurate configuration measured on an H100 (benchmarks/README.md: 0.904 ms a step of 4,096
# MNIST SIRENs, against 1.273 ms for 16,4,split3 with point tiles, the default before)
DEFAULT_CONFIG = {"block_p": 16, "num_warps": 1, "precision": "split3", "layout": "grid"}
PRECISIONS = ("ieee", "tf32x3", "split3", "tf32")
LAYOUTS = ("points", "grid")


def kernel_config() -> dict:
    """The kernel's tile, warps and ``tl.dot`` precision: :data:`DEFAULT_CONFIG`, or
    ``ZOO_TRITON_CONFIG`` (what ``benchmarks/fit_gpu_step.py`` measured fastest on a GPU;
    ``gpu_session.sh`` passes it on)."""
    value = os.environ.get("ZOO_TRITON_CONFIG")
    return dict(DEFAULT_CONFIG) if not value else parse_config(value, "ZOO_TRITON_CONFIG=")


def parse_config(value: str, where: str = "") -> dict:
    """``BLOCK_P,NUM_WARPS,PRECISION[,LAYOUT]`` (e.g. ``64,4,ieee`` or ``16,4,split3,grid``).

    ``LAYOUT`` ``grid`` tiles an image grid by rows (a tile = ``BLOCK_P`` pixels of one row) and
    takes the first layer's sines from per-row and per-column tables; ``points`` (the default)
    tiles the point list. On a point list ``grid`` falls back to ``points``."""
    try:
        block_p, warps, precision, *layout = value.split(",")
        config = {"block_p": int(block_p), "num_warps": int(warps), "precision": precision,
                  "layout": layout[0] if layout else "points"}
        if len(layout) > 1:
            raise ValueError
    except ValueError:
        raise ValueError(f"{where}{value!r}: expected BLOCK_P,NUM_WARPS,PRECISION[,LAYOUT], e.g. 16,4,split3") from None
    if (precision not in PRECISIONS or config["layout"] not in LAYOUTS or config["block_p"] < 16
            or config["block_p"] & (config["block_p"] - 1)):
        raise ValueError(f"{where}{value!r}: BLOCK_P a power of two >= 16, PRECISION one of {PRECISIONS}, "
                         f"LAYOUT one of {LAYOUTS}")
    return config


def _pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(n)))


if triton is not None:

    @triton.jit
    def _sincos(x):
        """``sin x, cos x``: Cody-Waite reduction by pi/2 and Cephes' minimax polynomials, as
        ``siren_step.c`` computes them."""
        q = tl.floor(x * 0.6366197723675814 + 0.5)
        r = ((x - q * 1.5703125) - q * 4.837512969970703125e-4) - q * 7.54978995489188216e-8
        z = r * r
        s = r + r * z * (-1.6666654611e-1 + z * (8.3321608736e-3 + z * -1.9515295891e-4))
        c = 1.0 - 0.5 * z + z * z * (4.166664568298827e-2 + z * (-1.388731625493765e-3 + z * 2.443315711809948e-5))
        quadrant = q.to(tl.int32)
        swap = (quadrant & 1) != 0
        sin_x = tl.where(swap, c, s)
        cos_x = tl.where(swap, s, c)
        sin_x = tl.where((quadrant & 2) != 0, -sin_x, sin_x)
        cos_x = tl.where(((quadrant + 1) & 2) != 0, -cos_x, cos_x)
        return sin_x, cos_x

    @triton.jit
    def _tf32_high(a):
        """``a`` with the low 13 mantissa bits cleared: exactly representable in TF32."""
        return (a.to(tl.uint32, bitcast=True) & 0xFFFFE000).to(tl.float32, bitcast=True)

    @triton.jit
    def _split(b, PRECISION: tl.constexpr):
        """``b``'s high and low TF32 parts for ``"split3"`` (``b`` twice otherwise): done once,
        outside the tile loop, for the weight matrix every tile multiplies by."""
        if PRECISION == "split3":
            b_hi = _tf32_high(b)
            return b_hi, b - b_hi
        else:
            return b, b

    @triton.jit
    def _dot(a, b_hi, b_lo, PRECISION: tl.constexpr):
        """``a @ b`` for ``b_hi, b_lo = _split(b)``. ``"split3"``: three TF32 tensor-core products
        of the operands' high and low parts (``a_hi b_hi + a_hi b_lo + a_lo b_hi``, the 3xTF32
        scheme), ~fp32 accurate; else ``tl.dot``'s own ``input_precision``."""
        if PRECISION == "split3":
            a_hi = _tf32_high(a)
            acc = tl.dot(a - a_hi, b_hi, input_precision="tf32")
            acc = tl.dot(a_hi, b_lo, acc, input_precision="tf32")
            return tl.dot(a_hi, b_hi, acc, input_precision="tf32")
        else:
            return tl.dot(a, b_hi, input_precision=PRECISION)

    @triton.jit
    def _adam(p_ptr, m_ptr, v_ptr, offs, mask, grad, beta1, beta2, step_size, bc2_sqrt, eps):
        """``torch.optim.Adam``'s update of the parameters at ``offs`` with gradient ``grad``."""
        p = tl.load(p_ptr + offs, mask=mask, other=0.0)
        m = tl.load(m_ptr + offs, mask=mask, other=0.0)
        v = tl.load(v_ptr + offs, mask=mask, other=0.0)
        m = m + (1.0 - beta1) * (grad - m)  # torch's lerp
        v = v * beta2 + (1.0 - beta2) * grad * grad
        p = p - step_size * (m / (tl.sqrt(v) / bc2_sqrt + eps))
        tl.store(p_ptr + offs, p, mask=mask)
        tl.store(m_ptr + offs, m, mask=mask)
        tl.store(v_ptr + offs, v, mask=mask)

    @triton.jit
    def _hidden_and_output_tile(s1, c1, p, p_ok, targets_ptr, target_base, w3_ptr, b3_ptr, b2, w2_t_hi, w2_t_lo,
                                w2_hi, w2_lo, h, o, g_w2, g_b2, g_w3, g_b3, sq_err, grad_scale, w0_hidden,
                                output_offset, H: tl.constexpr, DOUT: tl.constexpr, PRECISION: tl.constexpr):
        """One tile's second and output layers, loss and backward from the first layer's sines
        ``s1`` and cosines ``c1`` (``[BLOCK_P, H]``): the accumulated gradients of layers 2 and 3,
        the squared errors, and ``g1``, d(loss)/d(first pre-activation) without its w0."""
        z2 = _dot(s1, w2_t_hi, w2_t_lo, PRECISION) + b2[None, :]
        s2, c2 = _sincos(z2 * w0_hidden)
        # ---- loss and backward: g is d(loss)/d(pre-activation) without the layer's w0 (the output
        # layer one output at a time: d_out is tiny, and 3-D broadcasts would cost registers)
        g2 = tl.zeros(s2.shape, dtype=tl.float32)
        for j in tl.static_range(DOUT):
            w3_j = tl.load(w3_ptr + j * H + h)
            b3_j = tl.load(b3_ptr + j)
            y_j = tl.sum(s2 * w3_j[None, :], axis=1) + b3_j + output_offset
            t_j = tl.load(targets_ptr + target_base + p * DOUT + j, mask=p_ok, other=0.0)
            err = tl.where(p_ok, y_j - t_j, 0.0)
            sq_err += err * err
            g3 = err * grad_scale
            g_w3 += tl.where(o[:, None] == j, tl.sum(g3[:, None] * s2, axis=0)[None, :], 0.0)
            g_b3 += tl.where(o == j, tl.sum(g3, axis=0), 0.0)
            g2 += g3[:, None] * w3_j[None, :]
        g2 = g2 * c2
        s1_hi, s1_lo = _split(s1, PRECISION)
        g_w2 += _dot(tl.trans(g2), s1_hi, s1_lo, PRECISION)
        g1 = _dot(g2, w2_hi, w2_lo, PRECISION) * (w0_hidden * c1)
        g_b2 += tl.sum(g2, axis=0)
        return g1, g_w2, g_b2, g_w3, g_b3, sq_err

    # ``step`` changes every launch: specializing on its value (Triton does so for 1 and multiples of
    # 16) would compile the kernel again and again
    @triton.jit(do_not_specialize=["step"])
    def _siren_fit_step(
        params_ptr, exp_avg_ptr, exp_avg_sq_ptr, coords_ptr, ys_ptr, xs_ptr, targets_ptr, peak_sq_ptr, frozen_ptr,
        steps_ptr, mse_ptr, P, ROWS, COLS, step, w0_first, w0_hidden, output_offset, psnr_stop,
        beta1, beta2, step_size, bc2_sqrt, eps,
        D0: tl.constexpr, H: tl.constexpr, DOUT: tl.constexpr, D0_P: tl.constexpr, DOUT_P: tl.constexpr,
        BLOCK_P: tl.constexpr, EARLY_STOP: tl.constexpr, PRECISION: tl.constexpr, GRID: tl.constexpr,
        COL_BLOCKS: tl.constexpr,
    ):
        """One step of network ``program_id``. ``GRID``: the points are a ``ROWS x COLS`` image grid,
        point ``(i, j) = (ys[i], xs[j])`` at ``i * COLS + j``; a tile is ``BLOCK_P`` columns of one
        row, and the first layer's ``sin(w0 (w_y y_i + b) + w0 w_x x_j)`` comes from per-row and
        per-column sines by ``sin(a + b) = sin a cos b + cos a sin b`` (as the PyTorch step does on
        a grid), so its sines cost one ``[H]`` vector a row instead of a ``[BLOCK_P, H]`` tile.
        Else the points are a ``[P, D0]`` list, tiled in order."""
        k = tl.program_id(0).to(tl.int64)
        NPARAM: tl.constexpr = H * D0 + H + H * H + H + DOUT * H + DOUT
        OFF_B1: tl.constexpr = H * D0
        OFF_W2: tl.constexpr = OFF_B1 + H
        OFF_B2: tl.constexpr = OFF_W2 + H * H
        OFF_W3: tl.constexpr = OFF_B2 + H
        OFF_B3: tl.constexpr = OFF_W3 + DOUT * H
        frozen = tl.load(frozen_ptr + k)
        if frozen == 0:
            base = k * NPARAM
            h = tl.arange(0, H)
            d = tl.arange(0, D0_P)
            o = tl.arange(0, DOUT_P)
            d_ok = d < D0
            o_ok = o < DOUT
            w1_offs = h[:, None] * D0 + d[None, :]  # [H, D0_P]
            w1_mask = (h[:, None] < H) & d_ok[None, :]
            w2_offs = h[:, None] * H + h[None, :]  # [H(out), H(in)]
            w3_offs = o[:, None] * H + h[None, :]  # [DOUT_P, H]
            w3_mask = o_ok[:, None] & (h[None, :] < H)
            b1 = tl.load(params_ptr + base + OFF_B1 + h)
            w2 = tl.load(params_ptr + base + OFF_W2 + w2_offs)
            b2 = tl.load(params_ptr + base + OFF_B2 + h)
            w2_hi, w2_lo = _split(w2, PRECISION)  # z2 = s1 @ W2^T, g1 = g2 @ W2
            w2_t_hi = tl.trans(w2_hi)
            w2_t_lo = tl.trans(w2_lo)

            g_w1 = tl.zeros((H, D0_P), dtype=tl.float32)
            g_b1 = tl.zeros((H,), dtype=tl.float32)
            g_w2 = tl.zeros((H, H), dtype=tl.float32)
            g_b2 = tl.zeros((H,), dtype=tl.float32)
            g_w3 = tl.zeros((DOUT_P, H), dtype=tl.float32)
            g_b3 = tl.zeros((DOUT_P,), dtype=tl.float32)
            sq_err = tl.zeros((BLOCK_P,), dtype=tl.float32)
            grad_scale = 2.0 / (P * DOUT)  # d(mean squared error)/dy
            target_base = k * P * DOUT
            w3_ptr = params_ptr + base + OFF_W3
            b3_ptr = params_ptr + base + OFF_B3
            if GRID:  # D0 == 2: input 0 is y (the row), input 1 is x (the column)
                w1_y = tl.load(params_ptr + base + h * 2)
                w1_x = tl.load(params_ptr + base + h * 2 + 1)
                g_w1_y = tl.zeros((H,), dtype=tl.float32)
                g_w1_x = tl.zeros((H,), dtype=tl.float32)
                for cb in tl.static_range(COL_BLOCKS):
                    col = cb * BLOCK_P + tl.arange(0, BLOCK_P)
                    col_ok = col < COLS
                    x = tl.load(xs_ptr + col, mask=col_ok, other=0.0)
                    s_col, c_col = _sincos(w0_first * (x[:, None] * w1_x[None, :]))  # [BLOCK_P, H], once a step
                    g1_per_col = tl.zeros((BLOCK_P, H), dtype=tl.float32)  # g1 summed over the rows
                    for i in range(ROWS):
                        y = tl.load(ys_ptr + i)
                        s_row, c_row = _sincos(w0_first * (w1_y * y + b1))  # [H]
                        s1 = s_row[None, :] * c_col + c_row[None, :] * s_col
                        c1 = c_row[None, :] * c_col - s_row[None, :] * s_col
                        g1, g_w2, g_b2, g_w3, g_b3, sq_err = _hidden_and_output_tile(
                            s1, c1, i * COLS + col, col_ok, targets_ptr, target_base, w3_ptr, b3_ptr, b2,
                            w2_t_hi, w2_t_lo, w2_hi, w2_lo, h, o, g_w2, g_b2, g_w3, g_b3, sq_err, grad_scale,
                            w0_hidden, output_offset, H, DOUT, PRECISION)
                        per_row = tl.sum(g1, axis=0)  # masked columns have g1 = 0 (their error is 0)
                        g_b1 += per_row
                        g_w1_y += per_row * y
                        g1_per_col += g1
                    g_w1_x += tl.sum(g1_per_col * x[:, None], axis=0)
                g_w1 = tl.where(d[None, :] == 0, g_w1_y[:, None], tl.where(d[None, :] == 1, g_w1_x[:, None], 0.0))
            else:
                for p0 in range(0, P, BLOCK_P):
                    p = p0 + tl.arange(0, BLOCK_P)
                    p_ok = p < P
                    # the input layer one coordinate at a time (d_0 is tiny)
                    z1 = tl.zeros((BLOCK_P, H), dtype=tl.float32) + b1[None, :]
                    for i in tl.static_range(D0):
                        x_i = tl.load(coords_ptr + p * D0 + i, mask=p_ok, other=0.0)
                        w1_i = tl.load(params_ptr + base + h * D0 + i)
                        z1 += x_i[:, None] * w1_i[None, :]
                    s1, c1 = _sincos(z1 * w0_first)  # [BLOCK_P, H]
                    g1, g_w2, g_b2, g_w3, g_b3, sq_err = _hidden_and_output_tile(
                        s1, c1, p, p_ok, targets_ptr, target_base, w3_ptr, b3_ptr, b2, w2_t_hi, w2_t_lo, w2_hi,
                        w2_lo, h, o, g_w2, g_b2, g_w3, g_b3, sq_err, grad_scale, w0_hidden, output_offset,
                        H, DOUT, PRECISION)
                    g_b1 += tl.sum(g1, axis=0)
                    for i in tl.static_range(D0):
                        x_i = tl.load(coords_ptr + p * D0 + i, mask=p_ok, other=0.0)
                        g_w1 += tl.where(d[None, :] == i, tl.sum(g1 * x_i[:, None], axis=0)[:, None], 0.0)
            mse = tl.sum(sq_err, axis=0) / (P * DOUT)
            tl.store(mse_ptr + k, mse)
            stop = False
            if EARLY_STOP:
                peak_sq = tl.load(peak_sq_ptr + k)
                psnr = 4.342944819032518 * tl.log(peak_sq / tl.maximum(mse, 1e-30))  # 10 log10
                stop = psnr >= psnr_stop
            if stop:
                tl.store(frozen_ptr + k, 1)
                tl.store(steps_ptr + k, step)
            else:
                _adam(params_ptr + base, exp_avg_ptr + base, exp_avg_sq_ptr + base, w1_offs, w1_mask,
                      g_w1 * w0_first, beta1, beta2, step_size, bc2_sqrt, eps)
                _adam(params_ptr + base, exp_avg_ptr + base, exp_avg_sq_ptr + base, OFF_B1 + h, h < H,
                      g_b1 * w0_first, beta1, beta2, step_size, bc2_sqrt, eps)
                _adam(params_ptr + base, exp_avg_ptr + base, exp_avg_sq_ptr + base, OFF_W2 + w2_offs,
                      w2_offs < H * H, g_w2 * w0_hidden, beta1, beta2, step_size, bc2_sqrt, eps)
                _adam(params_ptr + base, exp_avg_ptr + base, exp_avg_sq_ptr + base, OFF_B2 + h, h < H,
                      g_b2 * w0_hidden, beta1, beta2, step_size, bc2_sqrt, eps)
                _adam(params_ptr + base, exp_avg_ptr + base, exp_avg_sq_ptr + base, OFF_W3 + w3_offs, w3_mask,
                      g_w3, beta1, beta2, step_size, bc2_sqrt, eps)
                _adam(params_ptr + base, exp_avg_ptr + base, exp_avg_sq_ptr + base, OFF_B3 + o, o_ok,
                      g_b3, beta1, beta2, step_size, bc2_sqrt, eps)


def pack(weights: list[Tensor], biases: list[Tensor]) -> Tensor:
    """``[K, NPARAM]`` rows ``W1, b1, W2, b2, W3, b3`` (each flattened out x in)."""
    parts = []
    for w, b in zip(weights, biases):
        parts += [w.reshape(w.shape[0], -1), b]
    return torch.cat(parts, dim=1).contiguous()


def unpack(spec: SirenSpec, rows: Tensor) -> tuple[list[Tensor], list[Tensor]]:
    """Inverse of :func:`pack`: per-layer ``[K, out, in]`` weights and ``[K, out]`` biases."""
    weights, biases, at = [], [], 0
    for d_in, d_out in zip(spec.widths[:-1], spec.widths[1:]):
        weights.append(rows[:, at : at + d_out * d_in].reshape(-1, d_out, d_in))
        at += d_out * d_in
        biases.append(rows[:, at : at + d_out])
        at += d_out
    return weights, biases


def _points(coords) -> Tensor:
    """The ``[P, d_0]`` point list (a grid's points, row-major as :meth:`Grid2D.points`)."""
    return (coords.points() if isinstance(coords, Grid2D) else coords).to(torch.float32).contiguous()


class TritonFit:
    """The fit of one group of networks on the GPU: parameters, Adam moments, frozen flags and step
    counts held on the device, one :meth:`step` a kernel launch.

    ``layout`` ``"grid"`` tiles a :class:`Grid2D` by rows (see :func:`parse_config`); on a point list
    it is ``"points"``. ``precision`` is ``tl.dot``'s input precision for the three hidden-layer products: ``"ieee"``
    (fp32 FMAs), ``"tf32x3"`` (tensor cores, three TF32 products, ~fp32 accuracy) or ``"tf32"``.
    """

    def __init__(self, spec: SirenSpec, coords, targets: Tensor, weights, biases, peak: Tensor, lr: float,
                 psnr_stop: float | None, betas=(0.9, 0.999), eps: float = 1e-8, block_p: int | None = None,
                 num_warps: int | None = None, precision: str | None = None, layout: str | None = None):
        problem = supports(spec)
        if problem:
            raise ValueError(problem)
        if triton is None:
            raise RuntimeError("Triton is not installed (pip install triton)")
        self.spec = spec
        self.device = targets.device
        self.points = _points(coords).to(self.device)
        self.P = point_count(coords)
        K = targets.shape[0]
        self.targets = targets.to(torch.float32).contiguous()
        if self.targets.shape != (K, self.P, spec.widths[-1]):
            raise ValueError(f"targets of shape {tuple(targets.shape)}, expected {(K, self.P, spec.widths[-1])}")
        self.params = pack(weights, biases).to(self.device)
        self.exp_avg = torch.zeros_like(self.params)
        self.exp_avg_sq = torch.zeros_like(self.params)
        self.peak_sq = (peak.to(self.device, torch.float32) ** 2).contiguous()
        self.frozen = torch.zeros(K, dtype=torch.int32, device=self.device)
        self.steps_taken = torch.zeros(K, dtype=torch.int32, device=self.device)
        self.mse = torch.zeros(K, dtype=torch.float32, device=self.device)
        self.lr, self.betas, self.eps, self.psnr_stop = lr, betas, eps, psnr_stop
        default = kernel_config()
        self.block_p = block_p or default["block_p"]
        self.num_warps = num_warps or default["num_warps"]
        self.precision = precision or default["precision"]
        self.grid = (layout or default["layout"]) == "grid" and isinstance(coords, Grid2D) and spec.widths[0] == 2
        if self.grid:  # the grid's axes (the point list stays for nothing but a valid pointer)
            self.ys = coords.ys.to(self.device, torch.float32).contiguous()
            self.xs = coords.xs.to(self.device, torch.float32).contiguous()
        else:
            self.ys = self.xs = self.points
        self.count = 0  # steps taken so far (Adam's bias correction)

    def step(self) -> None:
        """One fitting step of every network not yet frozen (no host synchronization)."""
        spec, K = self.spec, self.params.shape[0]
        w0 = spec.w0()
        step = self.count
        self.count += 1
        beta1, beta2 = self.betas
        step_size = self.lr / (1 - beta1**self.count)
        bc2_sqrt = math.sqrt(1 - beta2**self.count)
        d0, dout = spec.widths[0], spec.widths[-1]
        _siren_fit_step[(K,)](
            self.params, self.exp_avg, self.exp_avg_sq, self.points, self.ys, self.xs, self.targets, self.peak_sq,
            self.frozen, self.steps_taken, self.mse, self.P, self.ys.numel(), self.xs.numel(), step, float(w0[0]),
            float(w0[1]), float(spec.output_offset), float(self.psnr_stop if self.psnr_stop is not None else 0.0), beta1, beta2, step_size, bc2_sqrt,
            self.eps, D0=d0, H=spec.widths[1], DOUT=dout, D0_P=_pow2(d0), DOUT_P=_pow2(dout),
            BLOCK_P=self.block_p, EARLY_STOP=self.psnr_stop is not None, PRECISION=self.precision, GRID=self.grid,
            COL_BLOCKS=-(-self.xs.numel() // self.block_p) if self.grid else 1, num_warps=self.num_warps,
        )

    def all_frozen(self) -> bool:
        return bool(self.frozen.all())

    def frozen_count(self) -> int:
        return int(self.frozen.sum())

    def result(self, steps: int) -> tuple[list[Tensor], list[Tensor], Tensor]:
        """Per-layer parameters and each network's steps taken (``steps`` for those never frozen)."""
        weights, biases = unpack(self.spec, self.params)
        taken = torch.where(self.frozen.bool(), self.steps_taken, steps).to(torch.int64)
        return weights, biases, taken


def fit_group_triton(spec: SirenSpec, coords, targets: Tensor, indices, seed: int, config, peak: Tensor,
                     device, progress=None, init=None, **kernel_options):
    """Fit ``len(indices)`` networks with the Triton step; returns ``(weights, biases, steps_taken)``
    on the device. ``progress(networks done)`` every :data:`CHECK_EVERY` steps. ``init``: the
    networks' initial ``(weights, biases)`` where already drawn (else drawn here)."""
    w_init, b_init = init if init is not None else init_params(spec, seed, indices)
    K = len(indices)
    fit = TritonFit(spec, coords, targets.to(device), [w.to(device) for w in w_init],
                    [b.to(device) for b in b_init], peak, config.lr, config.psnr_stop, **kernel_options)
    for step in range(config.steps):
        fit.step()
        if (step + 1) % CHECK_EVERY == 0 or step + 1 == config.steps:
            if config.psnr_stop is not None:
                stopped = fit.frozen_count()
                if progress is not None:
                    progress(stopped + (K - stopped) * (step + 1) / config.steps)
                if stopped == K:
                    break
            elif progress is not None:
                progress(K * (step + 1) / config.steps)
    return fit.result(config.steps)


def flops_per_step(spec: SirenSpec, points: int, networks: int) -> float:
    """The useful floating-point operations of one fitting step (the matmul-equivalent work: forward,
    backward of weights and activations; elementwise work not counted), for throughput figures."""
    d0, hidden, dout = spec.widths[0], spec.widths[1], spec.widths[-1]
    forward = 2 * (d0 * hidden + hidden * hidden + hidden * dout)
    backward = 2 * (d0 * hidden + 2 * hidden * hidden + 2 * hidden * dout)
    return float(networks) * points * (forward + backward)


