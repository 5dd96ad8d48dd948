"""Baseline (ii): the flat MLP trained on inputs moved by random elements of the symmetry group."""

from __future__ import annotations

import torch

from dws.baselines.mlp import MLPBaseline
from dws.weightspace import WeightSpace, random_group_element

Tensor = torch.Tensor


def random_permute(
    ws: WeightSpace, generator: torch.Generator | None = None
) -> tuple[WeightSpace, list[Tensor]]:
    """``ws`` with one uniformly random group element per sample, and those elements.

    The result represents the same functions as ``ws``: a label-preserving augmentation.
    """
    perms = random_group_element(
        ws.widths, batch_size=ws.batch_size, generator=generator, device=ws.weights[0].device
    )
    return ws.permute(perms), perms


class PermAugMLP(MLPBaseline):
    """:class:`MLPBaseline` whose training inputs are randomly permuted (evaluation inputs are not).

    Same constructor as :class:`MLPBaseline`. In equivariant mode the output is permuted back, so
    the targets need no augmentation.
    """

    def transform_input(self, ws: WeightSpace) -> tuple[WeightSpace, list[Tensor] | None]:
        if not self.training:
            return ws, None
        return random_permute(ws)
