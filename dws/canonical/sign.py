"""``sign``: the sign-flip symmetry of odd activations, and its canonical representative.

For an odd activation (``sin``, ``tanh``: ``act(-z) = -act(z)``) flipping hidden neuron ``i`` --
negating its incoming weights and bias (row ``i`` of ``W_m``, entry ``i`` of ``b_m``) and its
outgoing weights (column ``i`` of ``W_{m+1}``) -- leaves the network's function unchanged: the next
layer sees ``(-w) * act(-z) = w * act(z)``. The canonical representative flips exactly the neurons
whose key is negative; the key is the bias, or, where the bias is exactly 0, the sum of the incoming
weights. Layers are done first to last, so a layer's key sees its inputs already canonical (a
flip in layer ``m`` negates columns of ``W_{m+1}``, hence the next layer's weight sums).
A neuron whose bias and weight sum are both 0 keeps its sign (the one case left undecided).
"""

from __future__ import annotations

from typing import Sequence

import torch

from dws.weightspace import ACTIVATION_SCALES, WeightSpace

Tensor = torch.Tensor

#: activation names (as manifests write them) with ``act(-z) = -act(z)``
ODD_ACTIVATIONS = tuple(name for name, scales in ACTIVATION_SCALES.items() if scales == "sign")


def flip_signs(ws: WeightSpace, flips: Sequence[Tensor]) -> WeightSpace:
    """The sign-flip group's action: ``flips[k]`` (bool ``[B, d_{k+1}]``) flips those neurons of hidden
    layer ``k + 1`` (:meth:`WeightSpace.scale_neurons` by -1; exact, so flipping twice gives back the same bits)."""
    if ws.has_channels:
        raise ValueError("sign flips act on weights without a channel dimension")
    one = torch.ones((), dtype=ws.weights[0].dtype, device=ws.weights[0].device)
    return ws.scale_neurons([torch.where(flip, -one, one) for flip in flips])


def sign_keys(incoming: Tensor, bias: Tensor) -> Tensor:
    """``[B, d]``: each neuron's bias, or the sum of its incoming weights (``[B, d, d_in]``) where the
    bias is exactly 0."""
    return torch.where(bias != 0, bias, incoming.sum(2))


def canonical_flips(ws: WeightSpace) -> list[Tensor]:
    """The flips (bool ``[B, d_{k+1}]`` per hidden layer) that :func:`canonical_signs` applies."""
    flips: list[Tensor] = []
    for k in range(ws.num_layers - 1):
        incoming = ws.weights[k]
        if k > 0:  # the previous layer's flips negate these columns (exactly, so sums are those of the result)
            incoming = torch.where(flips[-1].unsqueeze(1), -incoming, incoming)
        flips.append(sign_keys(incoming, ws.biases[k]) < 0)
    return flips


def canonical_signs(ws: WeightSpace) -> WeightSpace:
    """``ws`` with every hidden neuron flipped to a non-negative key (same functions for odd activations)."""
    return flip_signs(ws, canonical_flips(ws))
