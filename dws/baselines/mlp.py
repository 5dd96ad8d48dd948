"""Baseline (i): an MLP on the flattened weight vector, blind to the permutation symmetry."""

from __future__ import annotations

from typing import Sequence

import torch

from dws.baselines.common import Baseline, check_widths, mlp_stack, num_weights
from dws.weightspace import WeightSpace

Tensor = torch.Tensor


def inverse_perms(perms: Sequence[Tensor]) -> list[Tensor]:
    """The inverse group element (per-sample permutations ``[B, d]`` are inverted row by row)."""
    return [p.argsort(dim=-1) for p in perms]


class MLPBaseline(Baseline):
    """``n_layers`` blocks of Linear/BN/ReLU/Dropout of width ``hidden`` on ``ws.flatten()``, then
    a Linear head; the default depth (4 + head) matches the DWSNet's.

    ``equivariant=True`` makes the output a weight-space element: ``out_features`` defaults to the
    flattened size and :meth:`forward_weightspace` reshapes it. Subclasses may transform the input
    by a group element (:meth:`transform_input`); the output is then mapped back by its inverse so
    that equivariant targets stay in the input's frame.
    """

    def __init__(
        self,
        widths: Sequence[int],
        out_features: int | None = None,
        hidden: int = 256,
        n_layers: int = 4,
        dropout: float = 0.0,
        equivariant: bool = False,
    ):
        size = num_weights(check_widths(widths))
        if out_features is None:
            if not equivariant:
                raise ValueError("out_features is required unless equivariant=True")
            out_features = size
        if equivariant and out_features != size:
            raise ValueError(
                f"equivariant output must have the weight-space size {size}, got {out_features}"
            )
        super().__init__(widths, out_features)
        self.equivariant = equivariant
        self.net = mlp_stack(size, [hidden] * n_layers, out_features, dropout)

    def transform_input(self, ws: WeightSpace) -> tuple[WeightSpace, list[Tensor] | None]:
        """Hook for augmentation/alignment: the input to use and the group element applied."""
        return ws, None

    def forward(self, ws: WeightSpace) -> Tensor:
        ws, perms = self.transform_input(self.plain(ws))
        out = self.net(ws.flatten())
        if self.equivariant and perms:
            out = WeightSpace.unflatten(out, self.widths).permute(inverse_perms(perms)).flatten()
        return out

    def forward_weightspace(self, ws: WeightSpace) -> WeightSpace:
        """Equivariant mode: the output as a :class:`WeightSpace` of the input's widths."""
        if not self.equivariant:
            raise RuntimeError("forward_weightspace needs a model built with equivariant=True")
        return WeightSpace.unflatten(self(ws), self.widths)
