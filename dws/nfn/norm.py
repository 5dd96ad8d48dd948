"""Layer norms of a weight space that keep the NF layers' symmetry (the reference code's ``lnorm``).

The reference's INR classifiers leave them off (``lnorm: null`` in every MNIST / Fashion-MNIST / CIFAR
config); they are options here (``NFNInvariant(norm=...)``), placed as in its ``InvariantNFN``: after
each NF layer, before the ReLU. A norm keeps a symmetry when the set it averages over is mapped to
itself by the group and its affine parameters are shared along every permuted axis:

* :class:`ChannelLayerNorm` (the code's ``SimpleLayerNorm``, ``lnorm: simple``): every entry of every
  tensor normalized over its own channels, one affine ``(gamma, beta)`` per tensor and channel. It acts
  entry by entry, so it commutes with *every* neuron permutation (NP's group and HNP's).
* :class:`NeuronLayerNorm` (the code's ``ParamLayerNorm``, ``lnorm: param``): ``W_1`` normalized per
  hidden neuron over its inputs and channels (``[d_0, C]``), ``W_L`` per hidden neuron over its outputs
  and channels (``[d_L, C]``), ``b_L`` over ``[d_L, C]``, every other entry over its channels; the
  affine parameters have those shapes. Input and output neurons get their own parameters, so it keeps
  hidden-neuron permutations only (HNP's group).

PyTorch's :class:`torch.nn.LayerNorm` does the normalizing (biased variance, ``eps`` inside the square
root; the code divides by the unbiased std plus ``eps``, the same up to a per-layer constant at init).
"""

from __future__ import annotations

from typing import Sequence

from torch import nn

from dws.weightspace import WeightSpace


class ChannelLayerNorm(nn.Module):
    """Each entry over its ``channels``; one ``nn.LayerNorm(channels)`` per tensor (``L`` weights, ``L`` biases)."""

    def __init__(self, num_layers: int, channels: int):
        super().__init__()
        self.channels = int(channels)
        self.weight_norms = nn.ModuleList(nn.LayerNorm(self.channels) for _ in range(num_layers))
        self.bias_norms = nn.ModuleList(nn.LayerNorm(self.channels) for _ in range(num_layers))

    def forward(self, ws: WeightSpace) -> WeightSpace:
        return WeightSpace(tuple(norm(w) for norm, w in zip(self.weight_norms, ws.weights)),
                           tuple(norm(b) for norm, b in zip(self.bias_norms, ws.biases)))

    def extra_repr(self) -> str:
        return f"channels={self.channels}"


class NeuronLayerNorm(nn.Module):
    """As :class:`ChannelLayerNorm`, except ``W_1``, ``W_L`` and ``b_L``, normalized together with their
    fixed input / output neuron axis (needs ``L >= 2``)."""

    def __init__(self, widths: Sequence[int], channels: int):
        super().__init__()
        self.widths, self.channels = tuple(int(d) for d in widths), int(channels)
        L, c = len(self.widths) - 1, self.channels
        if L < 2:
            raise ValueError(f"NeuronLayerNorm needs networks with a hidden layer, got widths {self.widths}")
        d_in, d_out = self.widths[0], self.widths[-1]
        self.weight_norms = nn.ModuleList(
            [nn.LayerNorm((d_in, c))] + [nn.LayerNorm(c) for _ in range(L - 2)] + [nn.LayerNorm((d_out, c))])
        self.bias_norms = nn.ModuleList([nn.LayerNorm(c) for _ in range(L - 1)] + [nn.LayerNorm((d_out, c))])

    def forward(self, ws: WeightSpace) -> WeightSpace:
        *first_to_middle, last = ws.weights
        weights = [norm(w) for norm, w in zip(self.weight_norms, first_to_middle)]  # W_1: rows [d_0, C]
        weights.append(self.weight_norms[-1](last.transpose(1, 2)).transpose(1, 2))  # W_L: columns [d_L, C]
        biases = [norm(b) for norm, b in zip(self.bias_norms, ws.biases)]  # b_L: the whole [d_L, C]
        return WeightSpace(tuple(weights), tuple(biases))

    def extra_repr(self) -> str:
        return f"widths={self.widths}, channels={self.channels}"


NFN_NORMS = {"simple": lambda widths, channels: ChannelLayerNorm(len(widths) - 1, channels),
             "param": NeuronLayerNorm}
