"""What an NF layer reads: summaries of the weight space indexed by one neuron, or by none.

A neuron ``n`` of layer ``l`` (``0..L``) touches its incoming weights ``W_l[n, :]`` (``l >= 1``), its
bias ``b_l[n]`` (``l >= 1``) and its outgoing weights ``W_{l+1}[:, n]`` (``l < L``). Averaging the
two weight vectors over the *other* neuron (a set the permutation group shuffles) leaves features
that move with ``n`` only: the paper's row/column broadcast terms are linear maps of these.
Means over every index of a tensor are invariant: the paper's "row-column" terms.
"""

from __future__ import annotations

from typing import Sequence

import torch

Tensor = torch.Tensor


def neuron_features(weights: Sequence[Tensor], biases: Sequence[Tensor], layer: int) -> Tensor:
    """``[B, d_layer, k * C]``: per neuron of ``layer``, the mean of its incoming weights and its bias
    (if ``layer >= 1``), then the mean of its outgoing weights (if ``layer < L``)."""
    L = len(weights)
    parts = []
    if layer >= 1:
        parts += [weights[layer - 1].mean(dim=2), biases[layer - 1]]
    if layer < L:
        parts.append(weights[layer].mean(dim=1))
    return torch.cat(parts, dim=-1)


def neuron_feature_count(num_layers: int, layer: int) -> int:
    """How many ``C``-blocks :func:`neuron_features` returns for ``layer``."""
    return 2 * (layer >= 1) + (layer < num_layers)


def global_means(weights: Sequence[Tensor], biases: Sequence[Tensor]) -> Tensor:
    """``[B, 2L * C]``: the mean of every weight matrix, then of every bias vector."""
    return torch.cat([w.mean(dim=(1, 2)) for w in weights] + [b.mean(dim=1) for b in biases], dim=-1)


def check_input(weights, biases, widths: Sequence[int], channels: int, name: str) -> None:
    got = (weights[0].shape[2],) + tuple(w.shape[1] for w in weights)
    if tuple(got) != tuple(widths) or weights[0].shape[-1] != channels or weights[0].dim() != 4:
        raise ValueError(f"{name} expects widths {tuple(widths)} with {channels} channels (channels last), "
                         f"got widths {got} and weight shape {tuple(weights[0].shape)}")
