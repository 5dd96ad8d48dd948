"""The DWS layer with fewer memory passes: the same function as :class:`dws.nn.layer.DWSLayer`.

Three changes to the plain forward, all about the largest tensors (a hidden weight's
``[B, d_m, d_{m-1}, C]`` features):

* With max pooling, the channel-mixing product of a weight between two hidden layers and that
  weight's row and column pools come from one autograd node (:mod:`dws.nn.fast.identity`), and the
  other pools taken straight from an input tensor share one node per tensor
  (:meth:`~dws.nn.fast.pools.FastPooledInputs.prefetch`): one gradient buffer per input tensor.
* Large float32 CPU products go to oneDNN (:mod:`dws.nn.fast.matmul`).
* A slot's broadcast terms are summed while small and then added **in place** into its full-size
  term where the layer owns one (a fresh product: the identity term), so a hidden weight's output
  costs its product plus one pass per broadcast direction, or none when the next module adds them
  on the fly (``pending``: a :class:`~dws.nn.fast.pending.PendingSum`, see
  :mod:`dws.nn.fast.stack`).

What the layer computes once per module, from its structure, is its :class:`LayerPlan`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from dws.nn.fast.guard import autocasting
from dws.nn.fast.identity import MatmulAndMaxPools
from dws.nn.fast.matmul import mix_channels
from dws.nn.fast.pending import PendingSum
from dws.nn.fast.pools import FastPooledInputs, direct_pools
from dws.nn.layer import DWSLayer, broadcast_sum, concat_features
from dws.nn.layout import from_features
from dws.nn.structure import Slot
from dws.nn.validate import prepare_input
from dws.weightspace import WeightSpace

Tensor = torch.Tensor


@dataclass(frozen=True)
class LayerPlan:
    """What the fused forward needs to know about a layer's structure.

    ``direct_pools``: for max pooling, each slot's pools taken straight from its input tensor,
    ``{slot: {kept: pooled dim}}``. ``identity``: ``{group index: slot}`` for the groups whose
    product shares one node with the slot's direct pools (the identity term of a weight between two
    hidden layers; in some ablations also of a hidden bias). ``owned``: the groups whose product is
    their single member's full-size output term, a fresh tensor the layer may add into in place.
    """

    direct_pools: dict[Slot, dict[tuple[int, ...], int]]
    identity: dict[int, Slot]
    owned: frozenset[int]

    @classmethod
    def of(cls, layer: DWSLayer) -> LayerPlan:
        needed = ((s, g.kept) for g in layer.groups for s in g.members)
        direct = direct_pools(needed) if layer.pool == "max" else {}
        # a single member keeping all its set indices and without free axes: from_features returns
        # the group's product itself, already shaped like the member's output
        owned = frozenset(i for i, g in enumerate(layer.groups)
                          if len(g.members) == 1 and g.kept == g.members[0].set_axes and not g.members[0].free_axes)
        identity = {i: layer.groups[i].members[0] for i in sorted(owned) if layer.groups[i].members[0] in direct}
        return cls(direct, identity, owned)


class FusedDWSLayer(DWSLayer):
    """A :class:`~dws.nn.layer.DWSLayer` accelerated in place by :func:`dws.nn.fast.accelerate`
    (same parameters, same function); ``plan`` and ``use_native`` are set there."""

    plan: LayerPlan
    use_native: bool

    def forward(self, ws: WeightSpace) -> WeightSpace:
        if autocasting(ws.weights[0]):
            return super().forward(ws)
        weights, biases = self.forward_parts(ws, pending=False)
        return WeightSpace(tuple(weights), tuple(biases))

    def identity_input(self, index: int) -> tuple[Tensor, list[tuple[int]]] | None:
        """For ``weights[index]`` of the input, when it is a weight between two hidden layers whose
        identity product and max pools share one node: ``(the product's matrix, the pooled dims)``
        (what an upstream module computes for :meth:`forward_parts`' ``ready``); else None."""
        for i, slot in self.plan.identity.items():
            if slot.kind == "weight" and slot.layer - 1 == index:  # (ablations also fuse biases' nodes)
                return self.group_weights[i], [(d,) for d in self.plan.direct_pools[slot].values()]
        return None

    def forward_parts(self, ws: WeightSpace, pending: bool = True,
                      ready: dict[int, tuple[Tensor, list[Tensor]]] | None = None) -> tuple[list, list]:
        """The output's weights and biases; with ``pending``, a tensor that is a fresh product plus
        broadcast terms comes as a :class:`~dws.nn.fast.pending.PendingSum` (for a module that adds
        the terms on the fly). ``ready`` gives, for some ``weights[index]`` (see
        :meth:`identity_input`), their identity product and pools computed upstream; those input
        tensors are then not read (they may be placeholders)."""
        ws = prepare_input(ws, self.widths, self.in_channels, type(self).__name__)
        pooled = FastPooledInputs(dict(zip(self.slots, ws.weights + ws.biases)), self.pool, self.use_native)
        products: dict[int, Tensor] = {}
        for i, slot in self.plan.identity.items():
            pools = self.plan.direct_pools[slot]  # {kept: pooled dim}
            if ready and slot.kind == "weight" and slot.layer - 1 in ready:
                products[i], outs = ready[slot.layer - 1]
            else:
                dims = ((d,) for d in pools.values())
                products[i], *outs = MatmulAndMaxPools.apply(pooled.tensors[slot], self.group_weights[i],
                                                             self.use_native, *dims)
            pooled.store(slot, pools, outs)
        pooled.prefetch(self.plan.direct_pools)
        terms: dict[Slot, list[Tensor]] = {s: [] for s in self.slots}
        full: dict[Slot, Tensor] = {}  # each slot's fresh full-size term, if it has one
        for i, (group, weight) in enumerate(zip(self.groups, self.group_weights)):
            if i in products:
                y = products[i]
            else:
                y = mix_channels(concat_features([pooled.features(s, group.kept) for s in group.members]), weight)
            if i in self.plan.owned:  # no split: keeps the identity term a fresh tensor
                full[group.members[0]] = y
                continue
            parts = y.split(self.output_sizes(group), dim=-1) if len(group.members) > 1 else (y,)
            for s, part in zip(group.members, parts):
                terms[s].append(from_features(part, s, group.kept, self.widths))
        out = [self._assemble(s, full.get(s), terms[s], ws.batch_size, pending) for s in self.slots]
        M = len(self.widths) - 1
        return out[:M], out[M:]

    def _assemble(self, slot: Slot, full: Tensor | None, terms: list[Tensor], batch_size: int,
                  pending: bool) -> Tensor | PendingSum:
        """Sum a slot's terms with as few full-size passes as possible.

        Terms whose shapes nest (e.g. the global pool term and the bias into a row term) are summed
        while small; what is left is added **in place** into ``full`` (the slot's fresh full-size
        term) when there is one, so e.g. a hidden weight's output costs its product plus one pass per
        broadcast direction (none with ``pending``: ``full`` and the rest come back as a
        :class:`PendingSum`).
        """
        if self.slot_bias is not None:
            terms = [self.slot_bias[slot.name]] + terms
        small = _fold_nested(sorted(terms, key=Tensor.numel))
        if full is not None:
            summed = PendingSum(full, small)
            return summed if pending and small else summed.resolve()
        return broadcast_sum(small, self.output_shape(slot, batch_size), self.group_weights)


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


def _broadcasts_into(small: Sequence[int], big: Sequence[int]) -> bool:
    """Whether a tensor of shape ``small`` broadcasts to shape ``big`` (``torch.broadcast_shapes``
    is a Python reference implementation, ~20x slower for this check)."""
    return len(small) <= len(big) and all(a == 1 or a == b for a, b in zip(reversed(small), reversed(big)))
