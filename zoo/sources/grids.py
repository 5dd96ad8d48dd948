"""Coordinate grids and per-item targets in the form the fitting code consumes.

Images: ``image_grid(H, W)`` is a float32 tensor [H*W, 2] of (y, x) coordinates in [-1, 1]^2,
built exactly as::

    y = torch.linspace(-1, 1, H); x = torch.linspace(-1, 1, W)
    yy, xx = torch.meshgrid(y, x, indexing="ij")
    grid = torch.stack([yy, xx], dim=-1).reshape(H * W, 2)

so row ``k = i * W + j`` holds pixel (row i, column j): row-major order, y (row, top = -1) first,
x (column, left = -1) second, the first and last pixel centres on the boundary of [-1, 1]. The
targets ``pixel_targets(images)`` [N, H*W, C] follow the same row-major order, so
``targets[n, k]`` is the colour at ``grid[k]``. (The paper speaks of [0, 1]^2 when describing
augmentations; we use [-1, 1]^2 like siren-pytorch, and the store manifest records it.)

Sines: ``sine_grid()`` is ``torch.linspace(-pi, pi, 2000)`` as a [2000, 1] float32 tensor
(both endpoints included) and the targets of an item are ``a * sin(b * x)`` on it, [N, 2000, 1].
"""

from __future__ import annotations

import math

import numpy as np
import torch

SINE_POINTS = 2000


def image_grid(height: int, width: int) -> torch.Tensor:
    """[H*W, 2] float32 (y, x) coordinates in [-1, 1]^2, row-major; see the module docstring."""
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, height), torch.linspace(-1, 1, width), indexing="ij")
    return torch.stack([yy, xx], dim=-1).reshape(height * width, 2)


def pixel_targets(images: np.ndarray) -> torch.Tensor:
    """[N, H, W, C] images -> [N, H*W, C] float32 targets, in :func:`image_grid` order."""
    n, h, w, c = images.shape
    return torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32).reshape(n, h * w, c))


def image_grid_manifest(height: int, width: int) -> dict:
    """How :func:`image_grid` was built, for the store manifest."""
    return {
        "shape": [height * width, 2],
        "domain": "[-1, 1]^2",
        "columns": ["y (row, top=-1)", "x (column, left=-1)"],
        "order": "row-major: row k = i*W + j is pixel (i, j)",
        "construction": "torch.stack(torch.meshgrid(torch.linspace(-1, 1, H), torch.linspace(-1, 1, W), "
                        "indexing='ij'), dim=-1).reshape(H*W, 2)",
        "targets": "pixel values in [0, 1], [N, H*W, C] in the same order",
    }


def sine_grid(points: int = SINE_POINTS) -> torch.Tensor:
    """[points, 1] float32 grid on [-pi, pi], endpoints included."""
    return torch.linspace(-math.pi, math.pi, points).unsqueeze(1)


def sine_targets(amplitude: np.ndarray, frequency: np.ndarray, grid: torch.Tensor | None = None) -> torch.Tensor:
    """``a * sin(b * x)`` per item on ``grid`` (default :func:`sine_grid`): [N, points, 1] float32.

    Evaluated in float64 and rounded once, so the targets do not depend on the batch they are in.
    """
    x = (sine_grid() if grid is None else grid).to(torch.float64).reshape(1, -1, 1)
    a = torch.as_tensor(np.asarray(amplitude, dtype=np.float64)).reshape(-1, 1, 1)
    b = torch.as_tensor(np.asarray(frequency, dtype=np.float64)).reshape(-1, 1, 1)
    return (a * torch.sin(b * x)).to(torch.float32)


def sine_grid_manifest(points: int = SINE_POINTS) -> dict:
    """How :func:`sine_grid` and the targets were built, for the store manifest."""
    return {
        "shape": [points, 1],
        "domain": "[-pi, pi]",
        "construction": f"torch.linspace(-math.pi, math.pi, {points}).unsqueeze(1) (float32)",
        "targets": "a * sin(b * x), evaluated in float64 on the float32 grid, stored as float32, [N, points, 1]",
    }
