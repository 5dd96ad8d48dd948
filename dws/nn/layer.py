"""The DWS layer: the most general affine equivariant map between weight spaces (Thm. 5.1).

Instead of one module per block of the paper's four tables, blocks that keep the same set indices
after pooling share one matmul (see :mod:`dws.nn.structure`): the inputs of a group are pooled once,
concatenated along features, mapped by a single ``[F_in, F_out]`` matrix, and each output slice is
added by broadcasting. A layer for an M-layer MLP therefore runs ``O(M)`` small matmuls, one
channel-mixing matmul per hidden weight matrix, and no dense map over the weight space; the block
``s -> t`` of the tables is the ``(s, t)`` sub-matrix of each group holding both (see
:meth:`DWSLayer.block_weight`, used by the block-by-block reference in :mod:`dws.nn.reference`).
With max pooling, the channel-mixing product of a weight between two hidden layers and that
weight's row and column pools come from one autograd node (:mod:`dws.nn.identity`).
"""

from __future__ import annotations

from math import sqrt
from typing import Sequence

import torch
from torch import nn

from dws.nn.blocks import block_classes
from dws.nn.init import scaled_xavier_normal_
from dws.nn.layout import from_features
from dws.nn.matmul import mix_channels
from dws.nn.pending import PendingSum
from dws.nn.identity import MatmulAndMaxPools
from dws.nn.pooling import PooledInputs, check_pool, direct_pools
from dws.nn.structure import PoolGroup, Slot, make_groups, make_slots
from dws.nn.validate import prepare_input
from dws.weightspace import WeightSpace

Tensor = torch.Tensor


class DWSLayer(nn.Module):
    """Affine ``G``-equivariant map from a weight space with ``in_channels`` to one with ``out_channels``.

    Args:
        widths: ``(d_0, ..., d_M)`` of the input MLPs, ``M >= 2``.
        pool: aggregation for the POOL components: ``"max"`` (paper's experiments), ``"mean"`` or
            ``"sum"`` (scaled by ``1/sqrt(n)``); with mean/sum the layer is linear.
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
        # max pooling: each slot's pools taken straight from its input tensor, computed together
        needed = ((s, g.kept) for g in self.groups for s in g.members)
        self._direct_pools = direct_pools(needed) if self.pool == "max" else {}
        # groups whose product shares one autograd node with its slot's direct pools: the identity
        # term of a weight between two hidden layers (see dws.nn.identity)
        self._fused_identity = {
            i: g.members[0] for i, g in enumerate(self.groups)
            if len(g.members) == 1 and g.kept == g.members[0].set_axes and not g.members[0].free_axes
            and g.members[0] in self._direct_pools
        }

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

    # -------------------------------------------------------------------- forward
    def forward(self, ws: WeightSpace) -> WeightSpace:
        weights, biases = self.forward_parts(ws, pending=False)
        return WeightSpace(tuple(weights), tuple(biases))

    def identity_input(self, index: int) -> tuple[Tensor, list[tuple[int]]] | None:
        """For ``weights[index]`` of the input, when it is a weight between two hidden layers whose
        identity product and max pools share one node: ``(the product's matrix, the pooled dims)``
        (what an upstream module computes for :meth:`forward_parts`' ``ready``); else None."""
        for i, slot in self._fused_identity.items():
            if slot.kind == "weight" and slot.layer - 1 == index:  # (ablations also fuse biases' nodes)
                return self.group_weights[i], [(d,) for d in self._direct_pools[slot].values()]
        return None

    def forward_parts(self, ws: WeightSpace, pending: bool = True,
                      ready: dict[int, tuple[Tensor, list[Tensor]]] | None = None) -> tuple[list, list]:
        """The output's weights and biases; with ``pending``, a tensor that is a fresh product plus
        broadcast terms comes as a :class:`~dws.nn.pending.PendingSum` (for a module that adds the
        terms on the fly, see :class:`dws.nn.models.EquivariantStack`). ``ready`` gives, for some
        ``weights[index]`` (see :meth:`identity_input`), their identity product and pools computed
        upstream; those input tensors are then not read (they may be placeholders)."""
        ws = prepare_input(ws, self.widths, self.in_channels, type(self).__name__)
        pooled = PooledInputs(dict(zip(self.slots, ws.weights + ws.biases)), self.pool)
        products: dict[int, Tensor] = {}
        for i, slot in self._fused_identity.items():
            pools = self._direct_pools[slot]  # {kept: pooled dim}
            if ready and slot.kind == "weight" and slot.layer - 1 in ready:
                products[i], outs = ready[slot.layer - 1]
            else:
                dims = ((d,) for d in pools.values())
                products[i], *outs = MatmulAndMaxPools.apply(pooled.tensors[slot], self.group_weights[i], *dims)
            pooled.store(slot, pools, outs)
        pooled.prefetch(self._direct_pools)
        terms: dict[Slot, list[Tensor]] = {s: [] for s in self.slots}
        for i, (group, weight) in enumerate(zip(self.groups, self.group_weights)):
            if i in products:
                y = products[i]
            else:
                feats = [pooled.features(s, group.kept) for s in group.members]
                y = mix_channels(torch.cat(feats, dim=-1) if len(feats) > 1 else feats[0], weight)
            if len(group.members) == 1:  # no split: keeps e.g. the identity term a fresh tensor
                parts: Sequence[Tensor] = (y,)
            else:
                parts = y.split([s.free_size * self.out_channels for s in group.members], dim=-1)
            for s, part in zip(group.members, parts):
                terms[s].append(from_features(part, s, group.kept, self.widths))
        out = [self._assemble(s, terms[s], ws.batch_size, pending) for s in self.slots]
        M = len(self.widths) - 1
        return out[:M], out[M:]

    def _assemble(self, slot: Slot, terms: list[Tensor], batch_size: int, pending: bool) -> Tensor | PendingSum:
        """Sum a slot's broadcast terms with as few full-size passes as possible.

        Terms whose shapes nest (e.g. the global pool term and the bias into a row term) are summed
        while small; what is left is added **in place** into the full-size term when there is one
        that this layer owns (a fresh matmul output: the channel-mixing identity term), so e.g. a
        hidden weight's output costs its matmul plus one pass per broadcast direction (none with
        ``pending``: the full-size term and the rest come back as a :class:`PendingSum`).
        """
        shape = (batch_size, *(self.widths[a] for a in slot.axes), self.out_channels)
        if self.slot_bias is not None:
            terms = [self.slot_bias[slot.name]] + terms
        if not terms:
            return terms_zero(shape, self.group_weights[0] if len(self.group_weights) else None)
        full = next((t for t in terms if tuple(t.shape) == shape and _owned(t)), None)
        small = _fold_nested(sorted((t for t in terms if t is not full), key=Tensor.numel))
        if full is not None:
            summed = PendingSum(full, small)
            return summed if pending and small else summed.resolve()
        acc = small[0]
        for t in small[1:]:
            acc = acc.add_(t) if tuple(acc.shape) == shape and acc is not small[0] else acc + t
        return acc.expand(shape)


def _owned(t: Tensor) -> bool:
    """A tensor produced inside the layer that nothing else references (safe to add into in place)."""
    return not t._is_view() and not (t.is_leaf and t.requires_grad)


def _fold_nested(terms: list[Tensor]) -> list[Tensor]:
    """Sum terms (sorted by size) whose shapes broadcast into another term's shape: the result has
    that term's (small) shape. Terms broadcasting along different axes stay separate."""
    out: list[Tensor] = []
    for t in terms:
        for k, s in enumerate(out):
            if _broadcasts_into(s.shape, t.shape):
                out[k] = t + s
                break
        else:
            out.append(t)
    return out


def _broadcasts_into(small, big) -> bool:
    """Whether a tensor of shape ``small`` broadcasts to shape ``big`` (``torch.broadcast_shapes``
    is a Python reference implementation, ~20x slower for this check)."""
    return len(small) <= len(big) and all(a == 1 or a == b for a, b in zip(reversed(small), reversed(big)))


def terms_zero(shape, like: Tensor | None) -> Tensor:
    """Output of a slot no block writes to and without a bias (possible only in ablations)."""
    return torch.zeros(shape) if like is None else like.new_zeros(shape)
