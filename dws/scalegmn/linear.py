"""How ScaleGMN's linear maps of edge features are computed (the same maps, cheaper; docs/dws.md,
ScaleGMN, "Speed"). Most of a CPU step is ``[B, n_out, n_in, d] x [d, d]`` products, every edge's MLPs.

* Dense features: a 1x1 convolution. ``F.linear`` sends the product to MKL's sgemm, which runs
  ``[65536, 128] x [128, 128]`` at ~90 GFLOP/s on one core of the development machine (AMD EPYC,
  AVX-512); the tensor seen as a channels-last image ``[B, d, n_out, n_in]`` (a view, no copy) goes
  to oneDNN's convolution at ~200, forward and backward; node features ``[B, n, d]`` as ``[B, d, n,
  1]`` gain ~1.5x. Only float32 CPU tensors of 3 or 4 axes and at least :data:`MIN_ROWS` rows take
  that route (oneDNN's fast kernel wants that shape: a flattened ``[1, d, N, 1]`` image is as slow
  as sgemm; below ~1,000 rows the call costs more than it saves); anything else (float64, a GPU,
  where cuBLAS is the fast path) is ``F.linear``.
* :class:`ScaledEdges`, the graph's initial edges ``e_ij = w_ij v_ij`` (a weight times a learned
  vector of the edge's type): a bias-free linear map commutes with the scalar, ``W e_ij = w_ij (W
  v_ij)``, so it is applied to the few vectors and scaled after, never to every edge.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
from torch import nn

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


MIN_ROWS = 1024  # products of fewer rows stay with F.linear
ONEDNN = torch.backends.mkldnn.is_available()  # read once: torch.compile cannot trace the call (a graph break)


def as_convolution(x: Tensor) -> bool:
    """Whether :func:`linear` maps ``x`` by a 1x1 convolution (see the module docstring)."""
    return (x.dim() in (3, 4) and x.numel() >= MIN_ROWS * x.shape[-1] and x.device.type == "cpu"
            and x.dtype == torch.float32 and ONEDNN)


def linear(x: Tensor | ScaledEdges, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T + bias`` (``F.linear``) as a dense tensor: by a 1x1 convolution where that is faster;
    of scaled edges, ``w_ij (W v_ij) + bias``."""
    if isinstance(x, ScaledEdges):
        mapped = linear(x.vectors, weight)
        return x.weights * mapped if bias is None else torch.addcmul(bias, x.weights, mapped)
    if not as_convolution(x):
        return nn.functional.linear(x, weight, bias)
    image = (x if x.dim() == 4 else x[:, :, None]).permute(0, 3, 1, 2)  # [B, d, n_out, n_in]: channels-last in memory
    y = nn.functional.conv2d(image, weight[:, :, None, None], bias).permute(0, 2, 3, 1)
    return y if x.dim() == 4 else y[:, :, 0]


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same state-dict keys) that maps edge features by :func:`linear`."""

    def forward(self, x: Tensor | ScaledEdges) -> Tensor:
        return linear(x, self.weight, self.bias)
