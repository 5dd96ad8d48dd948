"""A straightforward block-by-block evaluation of a :class:`DWSLayer`, for testing and benchmarking.

It follows the paper's tables literally: for every input tensor ``U_j``, output tensor ``U_i`` and
choice of which shared set indices to keep, pool ``U_j`` from scratch over the others, apply that
block's linear map (a slice of the layer's group matrices), broadcast and accumulate. No pooled
tensor or matmul is shared between blocks, which is what the layer's grouping optimizes away; both
must compute the same function. Plain PyTorch operators only (no accelerator, no C).
"""

from __future__ import annotations

from itertools import combinations

import torch
from torch import nn

from dws.nn.layer import DWSLayer
from dws.nn.layout import from_features, to_features
from dws.nn.pooling import reduce, remaining_axes
from dws.nn.validate import prepare_input
from dws.weightspace import WeightSpace

Tensor = torch.Tensor


def block_by_block_forward(layer: DWSLayer, ws: WeightSpace) -> WeightSpace:
    """``layer(ws)`` computed one block ``U_j -> U_i`` (and one kept-index choice) at a time."""
    ws = prepare_input(ws, layer.widths, layer.in_channels, "block_by_block_forward")
    inputs = dict(zip(layer.slots, ws.weights + ws.biases))
    outputs = []
    for dst in layer.slots:
        shape = (ws.batch_size, *(layer.widths[a] for a in dst.axes), layer.out_channels)
        out = inputs[dst].new_zeros(shape)
        if layer.slot_bias is not None:
            out = out + layer.slot_bias[dst.name]
        for src in layer.slots:
            shared = [a for a in src.set_axes if a in dst.set_axes]
            for r in range(len(shared) + 1):
                for kept in combinations(shared, r):
                    weight = layer.block_weight(src, dst, kept)
                    if weight is None:
                        continue
                    dims = tuple(1 + src.axes.index(a) for a in src.set_axes if a not in kept)
                    pooled = reduce(inputs[src], dims, layer.pool)
                    y = torch.matmul(to_features(pooled, src, kept), weight)
                    out = out + from_features(y, dst, kept, layer.widths)
        outputs.append(out)
    M = len(layer.widths) - 1
    return WeightSpace(tuple(outputs[:M]), tuple(outputs[M:]))


class ReferenceDWSLayer(nn.Module):
    """Wraps a :class:`DWSLayer` (sharing its parameters) but evaluates it block by block."""

    def __init__(self, layer: DWSLayer):
        super().__init__()
        self.layer = layer

    def forward(self, ws: WeightSpace) -> WeightSpace:
        return block_by_block_forward(self.layer, ws)


def with_reference_layers(model: nn.Module) -> nn.Module:
    """Replace every :class:`DWSLayer` inside ``model`` (in place) by its block-by-block wrapper."""
    for name, child in list(model.named_children()):
        if isinstance(child, DWSLayer):
            setattr(model, name, ReferenceDWSLayer(child))
        else:
            with_reference_layers(child)
    return model
