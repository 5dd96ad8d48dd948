"""Augmentations of weight-space batches: callables ``aug(ws, generator) -> ws``.

Every augmentation draws one set of random parameters per network from the given
``torch.Generator`` (so a seeded loader is reproducible) and works on RAW weights: the loader
applies them before normalization. That matters for the INR geometric ones, which are exact only
on raw weights.

Geometric augmentations of INRs (DWSNets appendix, "Data augmentation") act through the first
layer. A network computes ``f(p) = g(W1 p + b1)`` on coordinates ``p`` (``(y, x)`` for images, see
``docs/store-format.md``), so the network ``f(A p + c)`` is ``W1' = W1 A``, ``b1' = b1 + W1 c``
(:func:`warp_inputs`), whatever ``w0`` the SIREN multiplies by. Moving the signal by
``p -> R p`` (rotation), ``p -> p + t`` (translation) or ``p -> s p`` (scaling) means evaluating
the original at the inverse map: ``A = R^T``; ``c = -t``; ``A = I / s``.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from dws.weightspace import WeightSpace, random_group_element

Tensor = torch.Tensor
Augmentation = Callable[[WeightSpace, "torch.Generator | None"], WeightSpace]


# ----------------------------------------------------------------- functional, explicit parameters
def warp_inputs(ws: WeightSpace, matrix: Tensor | None = None, shift: Tensor | None = None) -> WeightSpace:
    """Networks ``p -> f(matrix p + shift)``: ``matrix`` ``[B, d0, d0]``, ``shift`` ``[B, d0]``."""
    w1, b1 = ws.weights[0], ws.biases[0]
    if w1.dim() != 3:
        raise ValueError("input warps need raw weights without a channel dimension")
    new_w1 = w1 if matrix is None else torch.bmm(w1, matrix.to(w1))
    new_b1 = b1 if shift is None else b1 + torch.bmm(w1, shift.to(w1).unsqueeze(2)).squeeze(2)
    return WeightSpace((new_w1,) + ws.weights[1:], (new_b1,) + ws.biases[1:])


def rotation_matrix(angles: Tensor) -> Tensor:
    """``[B, 2, 2]`` rotations by ``angles`` (radians) in the ``(y, x)`` plane."""
    c, s = torch.cos(angles), torch.sin(angles)
    return torch.stack([torch.stack([c, -s], -1), torch.stack([s, c], -1)], -2)


def rotate_inr(ws: WeightSpace, angles: Tensor) -> WeightSpace:
    """2-D INRs whose signal is rotated by ``angles`` (radians, ``[B]``).

    ``pi / 2`` turns a decoded image as ``torch.rot90(image, 1)`` does (counter-clockwise on screen).
    """
    _need_inputs(ws, 2, "rotation")
    return warp_inputs(ws, matrix=rotation_matrix(angles).transpose(1, 2))


def translate_inr(ws: WeightSpace, shifts: Tensor) -> WeightSpace:
    """INRs whose signal is moved by ``shifts`` ``[B, d0]`` (coordinate units; the grid spans [-1, 1])."""
    _need_inputs(ws, shifts.shape[-1], "translation")
    return warp_inputs(ws, shift=-shifts)


def scale_inr(ws: WeightSpace, scales: Tensor) -> WeightSpace:
    """INRs whose signal is magnified by ``scales`` ``[B]`` (isotropic) or ``[B, d0]`` (per axis)."""
    d0 = ws.widths[0]
    per_axis = scales.unsqueeze(-1).expand(-1, d0) if scales.dim() == 1 else scales
    _need_inputs(ws, per_axis.shape[-1], "scaling")
    return warp_inputs(ws, matrix=torch.diag_embed(1.0 / per_axis))


def _need_inputs(ws: WeightSpace, d0: int, what: str) -> None:
    if ws.widths[0] != d0:
        raise ValueError(f"{what} for {d0}-D inputs, but these networks take {ws.widths[0]}-D inputs")


# -------------------------------------------------------------------- random, one draw per network
def _interval(value, symmetric: bool) -> tuple[float, float]:
    """``v`` -> ``(-v, v)`` (or ``(v, v)``), ``(lo, hi)`` as given."""
    if isinstance(value, (int, float)):
        return (-float(value), float(value)) if symmetric else (float(value), float(value))
    lo, hi = (float(v) for v in value)
    if lo > hi:
        raise ValueError(f"empty range ({lo}, {hi})")
    return lo, hi


def _uniform(shape, interval, generator) -> Tensor:
    lo, hi = interval
    return lo + (hi - lo) * torch.rand(shape, generator=generator)


class _Augmentation:
    """Shows its parameters in ``repr`` (they end up in training logs)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"


class Compose:
    """Apply augmentations in order with the same generator."""

    def __init__(self, *augmentations: Augmentation):
        self.augmentations = augmentations

    def __call__(self, ws: WeightSpace, generator: torch.Generator | None = None) -> WeightSpace:
        for aug in self.augmentations:
            ws = aug(ws, generator)
        return ws

    def __repr__(self) -> str:
        return f"Compose({', '.join(map(repr, self.augmentations))})"


class GaussianNoise(_Augmentation):
    """Add ``N(0, sigma^2)`` to every weight and bias.

    ``relative``: the noise std is ``sigma`` times each tensor's std in that network, so layers of
    different scales are perturbed alike (single-entry tensors, std 0, are left as they are).
    """

    def __init__(self, sigma: float, relative: bool = False):
        self.sigma, self.relative = float(sigma), relative

    def __call__(self, ws: WeightSpace, generator: torch.Generator | None = None) -> WeightSpace:
        def noisy(t: Tensor) -> Tensor:
            noise = torch.randn(t.shape, generator=generator).to(t) * self.sigma
            if self.relative:
                noise = noise * t.flatten(1).std(dim=1, correction=0).reshape(-1, *[1] * (t.dim() - 1))
            return t + noise

        return ws.map(noisy)


class WeightDropout(_Augmentation):
    """Zero each weight and bias with probability ``p``; ``rescale`` divides the rest by ``1 - p``
    (as ``torch.nn.functional.dropout``, which the DWSNets code uses, so the mean is kept)."""

    def __init__(self, p: float, rescale: bool = True):
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p, self.rescale = float(p), rescale

    def __call__(self, ws: WeightSpace, generator: torch.Generator | None = None) -> WeightSpace:
        factor = 1.0 / (1.0 - self.p) if self.rescale else 1.0

        def drop(t: Tensor) -> Tensor:
            keep = (torch.rand(t.shape, generator=generator) >= self.p).to(t)
            return t * keep * factor

        return ws.map(drop)


class RandomRotation(_Augmentation):
    """Rotate 2-D INRs by an angle uniform in ``degrees`` (``v`` means ``(-v, v)``)."""

    def __init__(self, degrees: float | Sequence[float] = 45.0):
        self.degrees = _interval(degrees, symmetric=True)

    def __call__(self, ws: WeightSpace, generator: torch.Generator | None = None) -> WeightSpace:
        angles = _uniform((ws.batch_size,), self.degrees, generator) * (math.pi / 180.0)
        return rotate_inr(ws, angles)


class RandomTranslation(_Augmentation):
    """Move INRs by a shift uniform in ``shift`` per input axis (``v`` means ``(-v, v)``, coordinate units)."""

    def __init__(self, shift: float | Sequence[float] = 0.1):
        self.shift = _interval(shift, symmetric=True)

    def __call__(self, ws: WeightSpace, generator: torch.Generator | None = None) -> WeightSpace:
        return translate_inr(ws, _uniform((ws.batch_size, ws.widths[0]), self.shift, generator))


class RandomScale(_Augmentation):
    """Magnify INRs by a factor uniform in ``scale`` (``(lo, hi)``, both > 0), the same on every axis."""

    def __init__(self, scale: Sequence[float] = (0.8, 1.2)):
        self.scale = _interval(scale, symmetric=False)
        if self.scale[0] <= 0:
            raise ValueError(f"scale factors must be positive, got {self.scale}")

    def __call__(self, ws: WeightSpace, generator: torch.Generator | None = None) -> WeightSpace:
        return scale_inr(ws, _uniform((ws.batch_size,), self.scale, generator))


class RandomPermutation(_Augmentation):
    """Move each network by a uniformly random hidden-neuron permutation (same function, new weights)."""

    def __call__(self, ws: WeightSpace, generator: torch.Generator | None = None) -> WeightSpace:
        perms = random_group_element(ws.widths, batch_size=ws.batch_size, generator=generator)
        return ws.permute([p.to(ws.weights[0].device) for p in perms])


def inr_augmentation(
    degrees: float = 45.0, shift: float = 0.1, scale: Sequence[float] = (0.8, 1.2),
    noise: float = 0.0, dropout: float = 0.0,
) -> Compose:
    """The appendix's recipe for 2-D INRs: rotation, translation and scaling, then noise and dropout."""
    augs: list[Augmentation] = [RandomRotation(degrees), RandomTranslation(shift), RandomScale(scale)]
    if noise:
        augs.append(GaussianNoise(noise))
    if dropout:
        augs.append(WeightDropout(dropout))
    return Compose(*augs)
