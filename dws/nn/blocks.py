"""Which blocks of the DWS layer are switched on (the paper's ablation, Table "Ablation").

Every ablation keeps a block-diagonal pattern: the slots are partitioned into *classes* and a block
``s -> t`` exists iff ``s`` and ``t`` are in the same class; slots in no class only get their
equivariant bias. Expressing the choice this way lets the fused layer drop whole groups instead of
masking parameters, so parameter counts reflect the ablation.
"""

from __future__ import annotations

from typing import Sequence

from dws.nn.structure import Slot

BLOCK_CHOICES = ("all", "W2W", "B2B", "W2W+B2B", "diagonal")


def block_classes(slots: Sequence[Slot], blocks: str) -> list[tuple[Slot, ...]]:
    """Partition ``slots`` for ``blocks``.

    ``"all"``: the full layer. ``"W2W"`` / ``"B2B"``: only weight-to-weight / bias-to-bias blocks.
    ``"W2W+B2B"``: both, without the weight<->bias blocks. ``"diagonal"``: only the blocks on the
    diagonal of each of the four block matrices (``W_m, b_m -> W_m, b_m``), i.e. the internal
    blocks between tensors of the same layer.
    """
    weights = tuple(s for s in slots if s.kind == "weight")
    biases = tuple(s for s in slots if s.kind == "bias")
    if blocks == "all":
        return [tuple(slots)]
    if blocks == "W2W":
        return [weights]
    if blocks == "B2B":
        return [biases]
    if blocks == "W2W+B2B":
        return [weights, biases]
    if blocks == "diagonal":
        return [(w, b) for w, b in zip(weights, biases)]
    raise ValueError(f"blocks must be one of {BLOCK_CHOICES}, got {blocks!r}")
