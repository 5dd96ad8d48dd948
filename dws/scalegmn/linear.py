"""How ScaleGMN's linear maps of edge features are computed (the same maps, cheaper; docs/dws.md,
ScaleGMN, "Speed"). Most of a CPU step is ``[B, n_out, n_in, d] x [d, d]`` products, every edge's MLPs.

* Dense features: :func:`dws.ops.linear.linear`, a 1x1 convolution for large float32 CPU tensors
  (oneDNN's kernel, ~2x MKL's sgemm there), ``F.linear`` otherwise.
* :class:`ScaledEdges`, the graph's initial edges ``e_ij = w_ij v_ij`` (a weight times a learned
  vector of the edge's type): a bias-free linear map commutes with the scalar, ``W e_ij = w_ij (W
  v_ij)``, so it is applied to the few vectors and scaled after, never to every edge.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from dws.ops.linear import Linear as DenseLinear, linear as dense_linear

Tensor = torch.Tensor


class ScaledEdges(NamedTuple):
    """Edge features ``e_ij = w_ij v_ij``: ``weights`` ``[B, n_out, n_in, 1]`` (one channel) times ``vectors``
    that broadcast against them (``[d]``, ``[n_in, d]``, ``[n_out, 1, d]``; per sender ``[B, 1, n_in, d]``
    or ``[B, n_out, 1, d]`` after a product with its features)."""

    weights: Tensor
    vectors: Tensor

    def dense(self) -> Tensor:
        """``[B, n_out, n_in, d]``, every edge's feature."""
        return self.weights * self.vectors

    def per_vector(self, f: Callable[[Tensor], Tensor]) -> ScaledEdges:
        """``f(e)`` for an ``f`` with ``f(w v) = w f(v)`` (a bias-free linear map, a product with features
        of the edge's sender): applied to the vectors only."""
        return ScaledEdges(self.weights, f(self.vectors))

    def norm(self) -> Tensor:
        """``|e_ij| = |w_ij| |v_ij|`` over the feature axis, ``[B, n_out, n_in, 1]``."""
        return self.weights.abs() * torch.linalg.vector_norm(self.vectors, dim=-1, keepdim=True)


def linear(x: Tensor | ScaledEdges, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T + bias`` (``F.linear``) as a dense tensor (:func:`dws.ops.linear.linear`); of scaled
    edges, ``w_ij (W v_ij) + bias``."""
    if isinstance(x, ScaledEdges):
        mapped = dense_linear(x.vectors, weight)
        weights = x.weights.to(mapped.dtype)  # under bf16 autocast: a bf16 product, not a float32 one per edge
        return weights * mapped if bias is None else torch.addcmul(bias.to(mapped.dtype), weights, mapped)
    return dense_linear(x, weight, bias)


class Linear(DenseLinear):
    """``nn.Linear`` (same parameters, same state-dict keys) that also maps :class:`ScaledEdges`."""

    def forward(self, x: Tensor | ScaledEdges) -> Tensor:
        return linear(x, self.weight, self.bias)
