"""Shared helpers for the DWS tests: random architectures and random weight spaces."""

from __future__ import annotations

import random

import torch

from dws.weightspace import WeightSpace


def random_widths(seed: int, min_layers: int = 2, max_layers: int = 5, max_width: int = 4) -> tuple[int, ...]:
    """A random MLP architecture ``(d_0, ..., d_M)`` with ``M`` in ``[min_layers, max_layers]``."""
    rng = random.Random(seed)
    M = rng.randint(min_layers, max_layers)
    return tuple(rng.randint(1, max_width) for _ in range(M + 1))


def num_params(widths) -> int:
    return sum(a * b for a, b in zip(widths[:-1], widths[1:])) + sum(widths[1:])


def random_ws(widths, batch: int, channels: int | None = None, seed: int = 0, dtype=torch.float64) -> WeightSpace:
    g = torch.Generator().manual_seed(seed)
    shape = (batch, num_params(widths)) + (() if channels is None else (channels,))
    return WeightSpace.unflatten(torch.randn(shape, generator=g, dtype=dtype), widths)


def max_abs_diff(a: WeightSpace, b: WeightSpace) -> float:
    return (a.flatten() - b.flatten()).abs().max().item()
