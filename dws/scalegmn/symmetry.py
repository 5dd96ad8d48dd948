"""The scaling symmetry of an activation, and the maps that forget it (the paper's canonicalization
and symmetrization, Sec. 4).

A hidden neuron of an MLP with activation ``sigma`` can be rescaled by ``q`` without changing the
function when ``sigma(q x) = q sigma(x)``: ``q in {-1, 1}`` for odd activations (sine, tanh: *sign*
symmetry), ``q > 0`` for ReLU (*positive scale* symmetry). Its bias and incoming weights are
multiplied by ``q``, its outgoing weights by ``1 / q``. ScaleGMN's features of neuron ``i`` transform
the same way (``x_i -> q_i x_i``), and every nonlinearity is built from a map that is invariant to
that factor:

* :class:`SignSymmetrization`: ``rho(x) + rho(-x)`` (symmetrization over ``{-1, 1}``);
* :class:`ScaleNormalization`: ``x / |x|`` (canonicalization of ``q > 0``), which is *not* sign
  invariant, so a ReLU model tells a sign flip apart.
"""

from __future__ import annotations

import torch
from torch import nn

from dws.scalegmn.linear import Linear, ScaledEdges, linear

Tensor = torch.Tensor

# activation (the store manifest's ``architecture.activation``) -> the scaling group it has
SYMMETRY_OF_ACTIVATION = {"sine": "sign", "tanh": "sign", "relu": "scale"}
SYMMETRIES = ("sign", "scale")


def symmetry_of(activation: str | None) -> str:
    """``"sign"`` or ``"scale"`` for a store's activation; other activations are refused (ValueError)."""
    if activation not in SYMMETRY_OF_ACTIVATION:
        known = ", ".join(f"{a} ({s})" for a, s in SYMMETRY_OF_ACTIVATION.items())
        raise ValueError(f"ScaleGMN needs the networks' scaling symmetry, known for {known}; the store's "
                         f"activation is {activation!r}")
    return SYMMETRY_OF_ACTIVATION[activation]


class SignSymmetrization(nn.Module):
    """``rho(x) + rho(-x)`` with ``rho = Linear -> LayerNorm -> SiLU -> Linear`` (d -> d -> d): invariant
    to ``x -> -x``. Both branches share ``rho``'s linear maps, so each is applied once:
    ``A(-x) + b = -(Ax) + b`` and ``B h_+ + c + B h_- + c = B (h_+ + h_-) + 2c``."""

    def __init__(self, dim: int):
        super().__init__()
        self.first, self.norm, self.last = Linear(dim, dim), nn.LayerNorm(dim), Linear(dim, dim)

    def branches(self, x: Tensor) -> Tensor:
        """``h_+ + h_-``, the symmetrized hidden layer of ``rho``."""
        h = linear(x, self.first.weight)
        b = self.first.bias.to(h.dtype)  # under bf16 autocast: the per-edge branches stay bf16 (no float32 copies)
        return nn.functional.silu(self.norm(h + b)) + nn.functional.silu(self.norm(b - h))

    def forward(self, x: Tensor) -> Tensor:
        y = linear(self.branches(x), self.last.weight)
        return y + 2 * self.last.bias.to(y.dtype)

    def then(self, first: nn.Linear, x: Tensor) -> Tensor:
        """``first(self(x))`` with the two consecutive linear maps multiplied into one, ``C (B h + 2c) + e =
        (C B) h + (2 C c + e)``: one ``d x d`` product per input instead of two (every edge's message)."""
        weight = first.weight @ self.last.weight
        bias = 2 * first.weight @ self.last.bias + (0 if first.bias is None else first.bias)
        return linear(self.branches(x), weight, bias)


class ScaleNormalization(nn.Module):
    """``x / (|x| + eps)`` over the feature axis: invariant to ``x -> q x`` for every ``q > 0``."""

    def __init__(self, dim: int = 0, eps: float = 1e-10):
        super().__init__()
        self.eps = eps

    def forward(self, x: Tensor | ScaledEdges) -> Tensor | ScaledEdges:
        if isinstance(x, ScaledEdges):  # w v / (|w| |v| + eps): still a scalar times v
            return ScaledEdges(x.weights / (x.norm() + self.eps), x.vectors)
        return x / (torch.linalg.vector_norm(x, dim=-1, keepdim=True) + self.eps)

    def then(self, first: nn.Linear, x: Tensor) -> Tensor:
        """``first(self(x))`` (the same interface as :meth:`SignSymmetrization.then`)."""
        return first(self(x))


INVARIANT_MAPS = {"sign": SignSymmetrization, "scale": ScaleNormalization}


def invariant_map(symmetry: str, dim: int) -> nn.Module:
    """The map that forgets ``symmetry`` from ``dim``-dimensional features."""
    if symmetry not in INVARIANT_MAPS:
        raise ValueError(f"symmetry must be one of {', '.join(SYMMETRIES)}, got {symmetry!r}")
    return INVARIANT_MAPS[symmetry](dim)
