"""Initialization from the paper's appendix: Xavier-normal times ``mu * sqrt(2 d_in / d_out)``.

``mu = 1`` for invariant tasks; ``mu = 1e-3`` for the last layer when the output parameterizes a
network, so a freshly initialized model predicts (almost) zero.
"""

from __future__ import annotations

from math import sqrt

import torch

Tensor = torch.Tensor


@torch.no_grad()
def scaled_xavier_normal_(weight: Tensor, fan_in: int, fan_out: int, mu: float = 1.0) -> Tensor:
    """Fill ``weight`` (any shape) with N(0, std^2), std = xavier(fan_in, fan_out) * mu * sqrt(2 fan_in / fan_out)."""
    std = sqrt(2.0 / (fan_in + fan_out)) * mu * sqrt(2.0 * fan_in / fan_out)
    return weight.normal_(0.0, std)
