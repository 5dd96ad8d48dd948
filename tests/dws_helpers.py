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


def derange(d: int, gen) -> torch.Tensor:
    """A random permutation of ``d`` items that moves the first one (so it is never the identity)."""
    while True:
        p = torch.randperm(d, generator=gen)
        if p[0] != 0:
            return p


def adam_losses(model, ws: WeightSpace, target, *, steps: int, lr: float,
                loss=torch.nn.functional.cross_entropy) -> list[float]:
    """The loss before each of ``steps`` Adam steps of ``model`` on one fixed batch (what a
    training-step test asserts on)."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        value = loss(model(ws), target)
        opt.zero_grad()
        value.backward()
        opt.step()
        losses.append(value.item())
    return losses
