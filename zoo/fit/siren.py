"""Batched SIREN: K independent networks held as stacked tensors and evaluated as one computation.

Convention (identical to ``siren_pytorch.SirenNet``, recorded in every store manifest):
hidden layer ``m`` computes ``sin(w0_m * (W_m x + b_m))`` with ``w0 = w0_first`` for the first
layer and ``w0_hidden`` after it; the last layer is linear, ``y = W_M x + b_M + output_offset``.

Initialization ``"siren"`` is the standard one (Sitzmann et al.; siren-pytorch): first layer
``U(-1/d_in, 1/d_in)``, later layers ``U(-sqrt(6/d_in)/w0, +sqrt(6/d_in)/w0)``, biases drawn with
the same bound as their weights. ``"published"`` is the INR of the published DWSNets code
(``nn/inr.py``): **every** sine layer, the first included, drawn in the hidden range
``U(+-sqrt(6/d_in)/w0)`` (that code never sets ``is_first``), zero biases, the output layer a plain
``nn.Linear`` (weights and bias ``U(-1/sqrt(d_in), 1/sqrt(d_in))``) and an output offset of 0.5.
``"reference"`` (what the pipelines use) is the same except that the output layer is drawn in the
SIREN range with a zero bias: its random start is 12x smaller, so the fitted output layer holds
more of the signal and less initialization noise. ``"reference-siren-first"`` is ``"reference"``
with siren's wide first layer ``U(+-1/d_in)``; it was our ``"reference"`` before 2026-11-23 and
fits MNIST to 40 dB in ~320 steps, but its weights are far harder to learn from (docs/train.md:
ci-scale DWSNet MNIST accuracy 53% against 67%, sine-frequency MSE 6.2 against 0.31).

Network ``i``'s initial parameters depend on ``(seed, i)`` only, so a store's content does not
depend on how networks are grouped into batches or workers.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass

import numpy as np
import torch

Tensor = torch.Tensor
INITS = ("siren", "reference", "published", "reference-siren-first")


@dataclass(frozen=True)
class SirenSpec:
    """Architecture and conventions needed to evaluate a stored SIREN."""

    widths: tuple[int, ...]  # (d_0, d_1, ..., d_M)
    w0_first: float = 30.0
    w0_hidden: float = 30.0
    init: str = "siren"

    def __post_init__(self):
        if len(self.widths) < 3:
            raise ValueError(f"a SIREN needs at least one hidden layer, got widths {self.widths}")
        if self.init not in INITS:
            raise ValueError(f"unknown init {self.init!r}; choose one of {INITS}")

    @property
    def num_layers(self) -> int:
        return len(self.widths) - 1

    @property
    def output_offset(self) -> float:
        return 0.0 if self.init == "siren" else 0.5

    def w0(self) -> list[float | None]:
        """Frequency factor per layer; ``None`` for the linear output layer."""
        hidden = [self.w0_first] + [self.w0_hidden] * (self.num_layers - 2)
        return hidden + [None]

    def to_manifest(self) -> dict:
        return {
            **asdict(self),
            "widths": list(self.widths),
            "activation": "sine",
            "w0_per_layer": self.w0(),
            "output_offset": self.output_offset,
            "init_ranges": init_ranges(self),
            "hidden_layer": "sin(w0 * (W @ x + b))",
            "output_layer": "W @ x + b + output_offset",
            "weight_layout": "out x in (PyTorch)",
            "siren_pytorch": {
                "class": "siren_pytorch.SirenNet",
                "kwargs": {
                    "dim_in": self.widths[0],
                    "dim_hidden": self.widths[1],
                    "dim_out": self.widths[-1],
                    "num_layers": self.num_layers - 1,
                    "w0": self.w0_hidden,
                    "w0_initial": self.w0_first,
                },
                "exact": len(set(self.widths[1:-1])) == 1,
                "usage": "SirenNet(**kwargs)(x) + output_offset",
            },
        }


@functools.lru_cache(maxsize=1 << 16)
def network_seed(base_seed: int, index: int) -> int:
    """A 63-bit seed for network ``index``; mixing avoids correlated streams for nearby indices.

    Cached: a chunk's seeds are needed for its initial parameters (drawn ahead of the fit on a GPU)
    and again for the seed column of its table."""
    low, high = np.random.SeedSequence([int(base_seed), int(index)]).generate_state(2, dtype=np.uint32).tolist()
    return (low + (high << 31)) & ((1 << 63) - 1)


def init_ranges(spec: SirenSpec) -> list[dict[str, float]]:
    """Per layer, the half-width of the uniform range of its weights and of its biases (0: zeros).

    Recorded in the manifest, so a store says exactly how its networks started and a resume with
    different ranges is refused.
    """
    w0 = spec.w0()
    ranges = []
    for m, d_in in enumerate(spec.widths[:-1]):
        first, last = m == 0, m == spec.num_layers - 1
        if first and spec.init in ("siren", "reference-siren-first"):
            weight = 1.0 / d_in
        elif last and spec.init == "published":
            weight = 1.0 / math.sqrt(d_in)  # nn.Linear's default initialization
        else:
            weight = math.sqrt(6.0 / d_in) / (w0[m] if w0[m] is not None else spec.w0_hidden)
        bias = weight if spec.init == "siren" or (last and spec.init == "published") else 0.0
        ranges.append({"weight": weight, "bias": bias})
    return ranges


def init_params(spec: SirenSpec, seed: int, indices) -> tuple[list[Tensor], list[Tensor]]:
    """Stacked initial parameters for networks ``indices``: ``W[m]`` [K, out, in], ``b[m]`` [K, out].

    Network ``i`` draws from its own stream (seeded by ``network_seed(seed, i)``) layer by layer,
    weight then bias, skipping zero biases. The per-network loop is the cost (Python calls, not the
    random numbers), so it holds only the draws: one generator reseeded per network (the same stream
    as a new one), each tensor drawn into a scratch tensor and copied into its row by numpy (views
    of the rows, one object per network and tensor, would wake Python's garbage collector)."""
    K = len(indices)
    weights = [torch.empty(K, o, i) for i, o in zip(spec.widths[:-1], spec.widths[1:])]
    biases = [torch.zeros(K, o) for o in spec.widths[1:]]
    drawn = []  # (stacked tensor, half-width of its range), in the order a network draws them
    for m, bounds in enumerate(init_ranges(spec)):
        drawn.append((weights[m], bounds["weight"]))
        if bounds["bias"]:
            drawn.append((biases[m], bounds["bias"]))
    draws = [(stacked.numpy(), scratch, scratch.numpy(), bound)
             for stacked, bound in drawn for scratch in [torch.empty(stacked.shape[1:])]]
    gen = torch.Generator()
    for k, index in enumerate(indices):
        gen.manual_seed(network_seed(seed, index))
        for rows, scratch, values, bound in draws:
            scratch.uniform_(-bound, bound, generator=gen)
            rows[k] = values
    return weights, biases


@dataclass(frozen=True)
class Grid2D:
    """A full row-major 2-D grid of coordinates: point ``(i, j)`` is ``(ys[i], xs[j])``.

    Fitting on a grid lets the first SIREN layer use ``sin(a + b) = sin a cos b + cos a sin b``:
    the sines of the row and column terms are computed once per row and once per column instead of
    once per pixel, which removes half of the transcendental work of a fitting step.
    """

    ys: Tensor
    xs: Tensor

    @classmethod
    def square(cls, size: int, low: float = -1.0, high: float = 1.0) -> "Grid2D":
        axis = torch.linspace(low, high, size)
        return cls(axis, axis.clone())

    def points(self) -> Tensor:
        """``[H*W, 2]`` coordinates, ``(y, x)`` per pixel, row-major."""
        return torch.stack(torch.meshgrid(self.ys, self.xs, indexing="ij"), dim=-1).reshape(-1, 2)

    def to(self, *args, **kwargs) -> "Grid2D":
        return Grid2D(self.ys.to(*args, **kwargs), self.xs.to(*args, **kwargs))


def point_count(coords) -> int:
    """Number of points of ``[P, d_0]`` coordinates or of a :class:`Grid2D`."""
    return coords.ys.numel() * coords.xs.numel() if isinstance(coords, Grid2D) else coords.shape[0]


def _first_sine_layer(w0: float, weight: Tensor, bias: Tensor, coords):
    """``sin`` and ``cos`` of ``w0 * (W x + b)`` for the first layer, ``[K, d_1, P]`` each."""
    K, d1 = weight.shape[:2]
    if isinstance(coords, Grid2D):
        row = w0 * (weight[:, :, :1] * coords.ys + bias.unsqueeze(2))  # [K, d1, H]
        col = w0 * (weight[:, :, 1:] * coords.xs)  # [K, d1, W]
        sr, cr, sc, cc = torch.sin(row), torch.cos(row), torch.sin(col), torch.cos(col)
        # sin(r + c) and cos(r + c) for every (row, column) pair as two rank-2 products, which
        # MKL's batched matmul computes far faster than broadcast elementwise products.
        cols = torch.stack([cc, sc], dim=2).view(K * d1, 2, -1)
        h = torch.bmm(torch.stack([sr, cr], dim=3).view(K * d1, -1, 2), cols)
        c = torch.bmm(torch.stack([cr, -sr], dim=3).view(K * d1, -1, 2), cols)
        return h.view(K, d1, -1), c.view(K, d1, -1)
    x = coords.transpose(-1, -2) if coords.dim() == 3 else coords.T.unsqueeze(0).expand(K, -1, -1)
    z = torch.baddbmm(bias.unsqueeze(2), weight, x, beta=w0, alpha=w0)
    return torch.sin(z), torch.cos(z)


def forward_with_cache(spec: SirenSpec, weights, biases, coords):
    """Forward pass, channel-first (``[K, d_m, P]``), with what the hand-written backward needs.

    ``w0`` multiplies the small weight matrices rather than the large pre-activations.
    """
    w0 = spec.w0()
    h, c = _first_sine_layer(w0[0], weights[0], biases[0], coords)
    acts, coss = [coords], [c]  # acts[m]: input of layer m (the coordinates for m = 0)
    for m in range(1, spec.num_layers - 1):
        acts.append(h)
        z = torch.bmm(weights[m] * w0[m], h).add_(biases[m].unsqueeze(2) * w0[m])  # faster than baddbmm
        h = torch.sin(z)
        coss.append(torch.cos(z))
    acts.append(h)
    y = torch.baddbmm(biases[-1].unsqueeze(2), weights[-1], h)  # [K, d_M, P]
    if spec.output_offset:
        y = y + spec.output_offset
    return y, acts, coss


def forward(spec: SirenSpec, weights, biases, coords) -> Tensor:
    """Evaluate K networks on shared coordinates ``[P, d_0]`` or a :class:`Grid2D` -> ``[K, P, d_M]``."""
    return forward_with_cache(spec, weights, biases, coords)[0].transpose(1, 2)


def mse_and_grads(spec: SirenSpec, weights, biases, coords, targets: Tensor):
    """Per-network MSE ``[K]`` and the gradients of ``sum_k MSE_k`` (so network k sees only its loss).

    ``targets`` is ``[K, P, d_M]``. Written by hand rather than with autograd: it skips the
    coordinate gradient, keeps the cosines from the forward pass and folds ``w0`` into small
    tensors, roughly halving a CPU step's cost.
    """
    w0 = spec.w0()
    y, acts, coss = forward_with_cache(spec, weights, biases, coords)
    err = y - targets.transpose(1, 2)
    mse = err.square().mean(dim=(1, 2))
    g = err * (2.0 / (err.shape[1] * err.shape[2]))  # d(sum_k mse_k)/dy, [K, d_M, P]
    grad_w, grad_b = [None] * spec.num_layers, [None] * spec.num_layers
    for m in range(spec.num_layers - 1, -1, -1):
        # g holds dLoss/d(pre-activation) of layer m, without layer m's w0 factor.
        scale = 1.0 if w0[m] is None else w0[m]
        if m == 0 and isinstance(coords, Grid2D):
            grad_w[m], grad_b[m] = _grid_input_grads(g, coords)
        else:
            if m == 0:  # point list [P, d_0] or [K, P, d_0]
                x = coords if coords.dim() == 3 else coords.unsqueeze(0).expand(g.shape[0], -1, -1)
            else:  # activations [K, d_{m-1}, P]
                x = acts[m].transpose(1, 2)
            grad_w[m] = torch.bmm(g, x)
            grad_b[m] = g.sum(dim=2)
        grad_w[m].mul_(scale)
        grad_b[m].mul_(scale)
        if m > 0:
            w_t = weights[m].transpose(1, 2) * scale
            # a single output channel makes this an outer product: cheaper as a broadcast multiply
            g = (w_t * g if g.shape[1] == 1 else torch.bmm(w_t, g)).mul_(coss[m - 1])
    return mse, grad_w, grad_b


def _grid_input_grads(g: Tensor, grid: Grid2D):
    """First-layer weight and bias gradients on a grid: sum over columns, then over rows."""
    K, d1, _ = g.shape
    g = g.view(K, d1, grid.ys.numel(), grid.xs.numel())
    per_row = g.sum(dim=3)  # [K, d1, H]
    per_col = g.sum(dim=2)  # [K, d1, W]
    grad_w = torch.stack([per_row @ grid.ys, per_col @ grid.xs], dim=2)
    return grad_w, per_row.sum(dim=2)


def psnr(mse: Tensor | np.ndarray, peak: float = 1.0):
    """Peak signal-to-noise ratio in dB for signals in ``[0, peak]``."""
    if isinstance(mse, np.ndarray):
        return 10.0 * np.log10(peak**2 / np.maximum(mse, 1e-30))
    return 10.0 * torch.log10(peak**2 / mse.clamp_min(1e-30))
