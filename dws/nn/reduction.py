"""``LIN(d_0, d_0')`` / ``LIN(d_M, d_M')`` on the free indices, to keep large inputs affordable (the DWSNet's,
and :class:`InputReduced` in front of the newer models).

The parameter count of a DWS layer grows with ``d_0^2`` and ``d_M^2``; since the input and output
neurons are not permuted, a plain linear map on those axes is equivariant and can shrink them before
the DWS layers (and grow them back after, for equivariant tasks).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from dws.weightspace import WeightSpace


Reduction = int | tuple[int | None, int | None] | None


def reduced_widths(widths: Sequence[int], input_reduction: Reduction) -> tuple[int, ...]:
    """Widths after ``LIN(d_0, d_0')`` / ``LIN(d_M, d_M')``: ``input_reduction`` is ``d_0'`` or
    ``(d_0', d_M')`` (None keeps a size)."""
    widths = tuple(int(d) for d in widths)
    if input_reduction is None:
        return widths
    d0, dM = (input_reduction, None) if isinstance(input_reduction, int) else input_reduction
    for new, old, axis, flag in ((d0, widths[0], "inputs", "--input-reduction"),
                                 (dM, widths[-1], "outputs", "the output reduction")):
        if new is not None and not 0 < new < old:  # a map to as many or more would add cost, not save it
            raise ValueError(f"{flag} {new} must be between 1 and the networks' {old} {axis}, exclusive "
                             f"(widths {widths}); leave it out to keep the {axis} as they are")
    return (d0 or widths[0],) + widths[1:-1] + (dM or widths[-1],)


class FreeAxisLinear(nn.Module):
    """Maps the widths ``(d_0, ..., d_M)`` to ``(d_0', d_1, ..., d_{M-1}, d_M')``, shared over channels.

    Acts on the columns of ``W_1`` and on the rows of ``W_M`` and the entries of ``b_M``; an axis
    whose size does not change is left untouched (no parameters).
    """

    def __init__(self, widths: Sequence[int], new_widths: Sequence[int], bias: bool = True):
        super().__init__()
        self.widths, self.new_widths = tuple(widths), tuple(new_widths)
        if len(self.widths) != len(self.new_widths) or self.widths[1:-1] != self.new_widths[1:-1]:
            raise ValueError(f"only d_0 and d_M may change: {self.widths} -> {self.new_widths}")
        self.inputs = _maybe_linear(self.widths[0], self.new_widths[0], bias)
        self.outputs = _maybe_linear(self.widths[-1], self.new_widths[-1], bias)

    def forward(self, ws: WeightSpace) -> WeightSpace:
        if tuple(ws.widths) != self.widths:
            raise ValueError(f"FreeAxisLinear was built for widths {self.widths}, got {ws.widths}")
        weights, biases = list(ws.weights), list(ws.biases)
        if self.inputs is not None:  # columns of W_1: axis 2
            weights[0] = torch.movedim(self.inputs(torch.movedim(weights[0], 2, -1)), -1, 2)
        if self.outputs is not None:  # rows of W_M and entries of b_M: axis 1
            weights[-1] = torch.movedim(self.outputs(torch.movedim(weights[-1], 1, -1)), -1, 1)
            biases[-1] = torch.movedim(self.outputs(torch.movedim(biases[-1], 1, -1)), -1, 1)
        return WeightSpace(tuple(weights), tuple(biases))


def _maybe_linear(d: int, d_new: int, bias: bool = True) -> nn.Linear | None:
    return None if d == d_new else nn.Linear(d, d_new, bias=bias)


class InputReduced(nn.Module):
    """A weight-space model behind a bias-free ``LIN(d_0, d_0')`` on its networks' inputs: the newer
    models' ``--input-reduction`` (the NFNs, the neural graphs, ScaleGMN), which the DWSNet has inside.

    The map acts on the columns of ``W_1``; the hidden neurons' permutations, sign flips and positive
    scalings act on its rows, so they commute with it, and the model behind keeps every symmetry it
    claims. A bias would break the last two (``q W_1 R + c`` is not ``q (W_1 R + c)``), hence none.
    ``model`` is built for the reduced widths (``d_0'`` inputs: a graph of ``d_0'`` input nodes)."""

    def __init__(self, widths: Sequence[int], reduced_to: int, model: nn.Module):
        super().__init__()
        widths = tuple(int(d) for d in widths)
        # reduced_widths refuses a d_0' that does not reduce, in one line
        self.reduce = FreeAxisLinear(widths, reduced_widths(widths, reduced_to), bias=False)
        self.model = model

    def forward(self, ws: WeightSpace):
        return self.model(self.reduce(ws))
