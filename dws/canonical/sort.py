"""``sort``: the canonical order of hidden neurons (a representative of the permutation group's orbit).

Each hidden layer's neurons are put in ascending order of a fixed key: the bias, ties broken by the
incoming weights compared entry by entry (lexicographically). Layers are sorted first to last, so
a layer's incoming weights are compared with their columns already in canonical order. A
permutation of hidden neurons leaves the function unchanged (``dws.weightspace``); the sort is
stable, so an already sorted network is left bit for bit as it is, and two networks that differ by
a permutation get the same result whenever no two neurons of a layer have equal bias and
incoming weights.
"""

from __future__ import annotations

import torch

from dws.weightspace import WeightSpace

Tensor = torch.Tensor


def neuron_order(incoming: Tensor, bias: Tensor) -> Tensor:
    """``[B, d]``: the permutation sorting a layer's neurons by ``(bias, incoming[0], incoming[1], ...)``
    (``incoming``: ``[B, d, d_in]``). One sort when no two biases tie (the usual case), else one stable
    sort per key from the least significant up."""
    order = bias.argsort(dim=1, stable=True)
    ranked = bias.gather(1, order)
    if not (ranked[:, 1:] == ranked[:, :-1]).any():
        return order
    keys = torch.cat([bias.unsqueeze(2), incoming], dim=2)
    order = torch.arange(bias.shape[1], device=bias.device).expand_as(bias)
    for j in reversed(range(keys.shape[2])):
        order = order.gather(1, keys[:, :, j].gather(1, order).argsort(dim=1, stable=True))
    return order


def canonical_perms(ws: WeightSpace) -> list[Tensor]:
    """The group element (``[B, d_{k+1}]`` per hidden layer, as :meth:`WeightSpace.permute` takes it)
    that :func:`canonical_order` applies."""
    if ws.has_channels:
        raise ValueError("the neuron sort acts on weights without a channel dimension")
    perms: list[Tensor] = []
    for k in range(ws.num_layers - 1):
        incoming = ws.weights[k]
        if k > 0:  # columns in the previous layer's new order
            incoming = incoming.gather(2, perms[-1].unsqueeze(1).expand_as(incoming))
        perms.append(neuron_order(incoming, ws.biases[k]))
    return perms


def canonical_order(ws: WeightSpace) -> WeightSpace:
    """``ws`` with every hidden layer's neurons in the order of :func:`neuron_order` (same functions)."""
    return ws.permute(canonical_perms(ws))
