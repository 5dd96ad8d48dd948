"""``scale``: the positive-scaling symmetry of ReLU, and its canonical representative.

ReLU is positively homogeneous (``relu(s z) = s relu(z)`` for ``s > 0``), so scaling hidden neuron ``i``
by ``s`` -- its incoming weights and bias (row ``i`` of ``W_m``, entry ``i`` of ``b_m``) times ``s``, its
outgoing weights (column ``i`` of ``W_{m+1}``) divided by ``s`` -- leaves the network's function unchanged
(ScaleGMN's symmetry for ReLU networks). The canonical representative scales every hidden neuron so that
its incoming weights and bias, as one vector, have Euclidean norm 1; a neuron whose vector is all zeros
(dead whatever follows) keeps its scale. Layers are done first to last, so a layer's norms see its
inputs' columns already divided by the layer before's scales.

Unlike ``sign`` and ``sort`` this is exact only up to float rounding: a scaled copy of a network gives
the same weights to a few units in the last place, and every function is kept to the same precision.
A neuron whose norm is already within :data:`TOLERANCE` of 1 is left as it is, so a second pass changes
no bit.
"""

from __future__ import annotations

import torch

from dws.weightspace import ACTIVATION_SCALES, WeightSpace

Tensor = torch.Tensor

#: activation names (as manifests write them) with ``act(s z) = s act(z)`` for every ``s > 0``
HOMOGENEOUS_ACTIVATIONS = tuple(name for name, scales in ACTIVATION_SCALES.items() if scales == "positive")
#: a norm this close to 1 counts as 1 (float32 rounding of a normalized vector's norm is ~1e-7)
TOLERANCE = 1e-5


def neuron_norms(incoming: Tensor, bias: Tensor) -> Tensor:
    """``[B, d]`` float64: the Euclidean norm of each neuron's incoming weights (``[B, d, d_in]``) and
    bias together."""
    return (incoming.double().square().sum(2) + bias.double().square()).sqrt()


def canonical_neuron_scales(ws: WeightSpace) -> list[Tensor]:
    """The positive scales (``[B, d_{k+1}]`` per hidden layer, as :meth:`WeightSpace.scale_neurons` takes
    them) that :func:`canonical_scales` applies."""
    if ws.has_channels:
        raise ValueError("neuron scaling acts on weights without a channel dimension")
    scales: list[Tensor] = []
    for k in range(ws.num_layers - 1):
        incoming = ws.weights[k]
        if k > 0:  # the columns as the previous layer's scales leave them
            incoming = incoming / scales[-1].unsqueeze(1)
        norms = neuron_norms(incoming, ws.biases[k])
        keep = (norms == 0) | ((norms - 1).abs() <= TOLERANCE)
        scales.append(torch.where(keep, torch.ones_like(norms), 1 / norms).to(incoming.dtype))
    return scales


def canonical_scales(ws: WeightSpace) -> WeightSpace:
    """``ws`` with every hidden neuron's incoming weights and bias scaled to norm 1 (same functions for
    ReLU, up to float rounding)."""
    return ws.scale_neurons(canonical_neuron_scales(ws))
