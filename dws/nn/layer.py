"""The DWS layer: the most general affine equivariant map between weight spaces (Thm. 5.1).

Instead of one module per block of the paper's four tables, blocks that keep the same set indices
after pooling share one matmul (see :mod:`dws.nn.structure`): the inputs of a group are pooled once,
concatenated along features, mapped by a single ``[F_in, F_out]`` matrix, and each output slice is
added by broadcasting. A layer for an M-layer MLP therefore runs ``O(M)`` small matmuls, one
channel-mixing matmul per hidden weight matrix, and no dense map over the weight space; the block
``s -> t`` of the tables is the ``(s, t)`` sub-matrix of each group holding both (see
:meth:`DWSLayer.block_weight`, used by the block-by-block reference in :mod:`dws.nn.reference`).
This module computes it the straightforward way (pool, concatenate, one matmul per group,
broadcast-add); :mod:`dws.nn.fast` computes the same function with fewer memory passes.
"""

from __future__ import annotations

from math import sqrt
from typing import Sequence

import torch
from torch import nn

from dws.nn.blocks import block_classes
from dws.nn.init import scaled_xavier_normal_
from dws.nn.layout import from_features
from dws.nn.pooling import PooledInputs, check_pool
from dws.nn.structure import PoolGroup, Slot, make_groups, make_slots
from dws.nn.validate import prepare_input
from dws.weightspace import WeightSpace

Tensor = torch.Tensor


class DWSLayer(nn.Module):
    """Affine ``G``-equivariant map from a weight space with ``in_channels`` to one with ``out_channels``.

    Args:
        widths: ``(d_0, ..., d_M)`` of the input MLPs, ``M >= 2``.
        pool: aggregation for the POOL components: ``"max"`` (paper's experiments), ``"mean"`` or
            ``"sum"`` (normalized by the set size: the same map as ``"mean"``); with mean/sum the layer
            is linear.
        blocks: which blocks exist (``"all"`` or an ablation, see :mod:`dws.nn.blocks`).
        bias: add the equivariant constant (one value per orbit of the group, per channel).
        init_scale: the ``mu`` of the initialization (1e-3 when the output parameterizes a network).
    """

    def __init__(
        self,
        widths: Sequence[int],
        in_channels: int,
        out_channels: int,
        pool: str = "max",
        blocks: str = "all",
        bias: bool = True,
        init_scale: float = 1.0,
    ):
        super().__init__()
        self.widths = tuple(int(d) for d in widths)
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.pool = check_pool(pool)
        self.blocks = blocks
        self.slots: tuple[Slot, ...] = make_slots(self.widths)
        self.groups: tuple[PoolGroup, ...] = make_groups(block_classes(self.slots, blocks))
        self.group_weights = nn.ParameterList(
            nn.Parameter(torch.empty(self._features(g, self.in_channels), self._features(g, self.out_channels)))
            for g in self.groups
        )
        self.slot_bias = (
            nn.ParameterDict({s.name: nn.Parameter(torch.zeros(self._bias_shape(s))) for s in self.slots})
            if bias
            else None
        )
        self.reset_parameters(init_scale)

    # ------------------------------------------------------------------ structure
    def _features(self, group: PoolGroup, channels: int) -> int:
        return sum(s.free_size for s in group.members) * channels

    def _bias_shape(self, slot: Slot) -> tuple[int, ...]:
        """Constant on each orbit: varies along free axes only (the paper's orbit table)."""
        return tuple(self.widths[a] if a in slot.free_axes else 1 for a in slot.axes) + (self.out_channels,)

    def _offsets(self, group: PoolGroup, slot: Slot, channels: int) -> slice:
        start = 0
        for s in group.members:
            if s == slot:
                return slice(start, start + s.free_size * channels)
            start += s.free_size * channels
        raise KeyError(f"{slot.name} is not in the group keeping {group.kept}")

    def block_weight(self, src: Slot, dst: Slot, kept: tuple[int, ...]) -> Tensor | None:
        """The ``[free(src) * C_in, free(dst) * C_out]`` matrix of block ``src -> dst`` for the term
        keeping set indices ``kept``; None if that block is switched off."""
        for group, weight in zip(self.groups, self.group_weights):
            if group.kept == kept and src in group.members and dst in group.members:
                return weight[self._offsets(group, src, self.in_channels), self._offsets(group, dst, self.out_channels)]
        return None

    @torch.no_grad()
    def reset_parameters(self, init_scale: float = 1.0) -> None:
        """Scaled Xavier-normal per group matrix, then each output slot's columns divided by
        ``sqrt(#groups feeding it)`` so the sum of its 2-4 terms keeps the variance of one."""
        terms = {s: sum(s in g.members for g in self.groups) for s in self.slots}
        for group, weight in zip(self.groups, self.group_weights):
            scaled_xavier_normal_(weight, weight.shape[0], weight.shape[1], init_scale)
            for s in group.members:
                weight[:, self._offsets(group, s, self.out_channels)] /= sqrt(terms[s])
        if self.slot_bias is not None:
            for b in self.slot_bias.values():
                b.zero_()

    def extra_repr(self) -> str:
        return (
            f"widths={self.widths}, in_channels={self.in_channels}, out_channels={self.out_channels}, "
            f"pool={self.pool!r}, blocks={self.blocks!r}, groups={len(self.groups)}"
        )

    def output_shape(self, slot: Slot, batch_size: int) -> tuple[int, ...]:
        """``[B, *slot axes' widths, C_out]``: the shape of ``slot``'s output tensor."""
        return (batch_size, *(self.widths[a] for a in slot.axes), self.out_channels)

    def output_sizes(self, group: PoolGroup) -> list[int]:
        """Widths of the group members' slices of the group's output features."""
        return [s.free_size * self.out_channels for s in group.members]

    # -------------------------------------------------------------------- forward
    def forward(self, ws: WeightSpace) -> WeightSpace:
        """Per group: pool each member down to the group's kept indices, concatenate, one matmul;
        then each output tensor is its bias plus its slices of the group outputs, broadcast."""
        ws = prepare_input(ws, self.widths, self.in_channels, type(self).__name__)
        pooled = PooledInputs(dict(zip(self.slots, ws.weights + ws.biases)), self.pool)
        terms: dict[Slot, list[Tensor]] = {s: [] for s in self.slots}
        for group, weight in zip(self.groups, self.group_weights):
            y = concat_features([pooled.features(s, group.kept) for s in group.members]) @ weight
            for s, part in zip(group.members, y.split(self.output_sizes(group), dim=-1)):
                terms[s].append(from_features(part, s, group.kept, self.widths))
        outputs = []
        for s in self.slots:
            if self.slot_bias is not None:
                terms[s].insert(0, self.slot_bias[s.name])
            outputs.append(broadcast_sum(terms[s], self.output_shape(s, ws.batch_size), self.group_weights))
        M = len(self.widths) - 1
        return WeightSpace(tuple(outputs[:M]), tuple(outputs[M:]))


def concat_features(features: list[Tensor]) -> Tensor:
    """The members' features side by side (a single member's as they are, not copied)."""
    return features[0] if len(features) == 1 else torch.cat(features, dim=-1)


def broadcast_sum(terms: list[Tensor], shape: tuple[int, ...], params: nn.ParameterList) -> Tensor:
    """The sum of ``terms`` broadcast to ``shape``; zeros for a slot that no block writes to and
    that has no bias (possible only in ablations)."""
    if not terms:
        return params[0].new_zeros(shape) if len(params) else torch.zeros(shape)
    total = terms[0]
    for t in terms[1:]:
        total = total + t
    return total.expand(shape)
