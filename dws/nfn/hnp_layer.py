"""The HNP layer (Zhou et al. 2023, Sec. 3 and App. A): equivariant to permutations of the *hidden*
neurons only, the true symmetry of an MLP. Input and output neurons are fixed, so terms that NP
must tie together may differ per input or output neuron; the layer has more terms than NP:

* a hidden neuron of layer 1 also sees its whole incoming row ``W_1[n, :]`` (one value per input
  neuron), and one of layer ``L-1`` its whole outgoing column ``W_L[:, n]`` (one per output);
* the global features ``g`` also hold ``W_1`` averaged over its rows (per input neuron), ``W_L``
  averaged over its columns and ``b_L`` (per output neuron);
* ``W_1`` is a vector of ``d_0 * C`` features per hidden neuron ``j`` and is mapped as one:
  ``W'_1[j, :] = A h_1(j) + G g``; likewise ``W_L`` per column ``k``: ``W'_L[:, k] = A' h_{L-1}(k) + G' g``;
  ``b_L`` is indexed by output neurons only, so ``b'_L = H g``;
* the middle ``W_l`` (``2 <= l <= L-1``) and the hidden biases follow NP's form with the extended
  neuron features ``h``.

This is the reference code's ``HNPLinear`` term by term, with one term more: the code leaves
``b_{L-1}[k]`` out of the last layer's per-column inputs, which the symmetry allows (docs/dws.md).
Needs at least one hidden layer (``L >= 2``).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from dws.nfn.init import init_summed_
from dws.nfn.neurons import check_input, global_means, neuron_feature_count, neuron_features
from dws.weightspace import WeightSpace

Tensor = torch.Tensor


def hidden_neuron_features(weights: Sequence[Tensor], biases: Sequence[Tensor], layer: int) -> Tensor:
    """``[B, d_layer, F]``: NP's neuron features, plus the whole ``W_1`` row (layer 1) and the whole
    ``W_L`` column (layer ``L-1``), whose entries belong to fixed input / output neurons."""
    L = len(weights)
    parts = [neuron_features(weights, biases, layer)]
    if layer == 1:
        parts.append(weights[0].flatten(2))  # [B, d_1, d_0 * C]
    if layer == L - 1:
        parts.append(weights[-1].transpose(1, 2).flatten(2))  # [B, d_{L-1}, d_L * C]
    return torch.cat(parts, dim=-1)


def hidden_feature_count(widths: Sequence[int], layer: int) -> int:
    """Channel blocks of :func:`hidden_neuron_features` for ``layer``."""
    L = len(widths) - 1
    return neuron_feature_count(L, layer) + (widths[0] if layer == 1 else 0) + (widths[-1] if layer == L - 1 else 0)


def hnp_global_features(weights: Sequence[Tensor], biases: Sequence[Tensor]) -> Tensor:
    """``[B, (2L + d_0 + 2 d_L) C]``: NP's global means, ``W_1`` averaged over its rows, ``W_L``
    averaged over its columns, and ``b_L``."""
    return torch.cat([global_means(weights, biases), weights[0].mean(dim=1).flatten(1),
                      weights[-1].mean(dim=2).flatten(1), biases[-1].flatten(1)], dim=-1)


class HNPLayer(nn.Module):
    """HNP-equivariant affine map: a weight space of ``widths`` with ``in_channels`` -> ``out_channels``."""

    def __init__(self, widths: Sequence[int], in_channels: int, out_channels: int):
        super().__init__()
        self.widths = tuple(int(d) for d in widths)
        L = len(self.widths) - 1
        if L < 2:
            raise ValueError(f"HNPLayer needs networks with a hidden layer, got widths {self.widths}")
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        c_in, c_out = self.in_channels, self.out_channels
        d_in, d_out = self.widths[0], self.widths[-1]
        n_global = (2 * L + d_in + 2 * d_out) * c_in
        h = [None] + [hidden_feature_count(self.widths, l) * c_in for l in range(1, L)]  # h[l], hidden l

        # W_1: one vector of d_0 * C_out per hidden neuron of layer 1
        self.first = nn.Linear(h[1], d_in * c_out)
        self.first_global = nn.Linear(n_global, d_in * c_out, bias=False)
        # W_L: one vector of d_L * C_out per hidden neuron of layer L-1; b_L from the global features
        self.last = nn.Linear(h[L - 1], d_out * c_out)
        self.last_global = nn.Linear(n_global, d_out * c_out, bias=False)
        self.last_bias = nn.Linear(n_global, d_out * c_out)
        # the middle W_l, l = 2..L-1 (index l-2): NP's four terms with HNP's neuron features
        self.entry = nn.ModuleList(nn.Linear(c_in, c_out) for _ in range(2, L))
        self.row = nn.ModuleList(nn.Linear(h[l], c_out, bias=False) for l in range(2, L))
        self.col = nn.ModuleList(nn.Linear(h[l - 1], c_out, bias=False) for l in range(2, L))
        self.weight_global = nn.ModuleList(nn.Linear(n_global, c_out, bias=False) for _ in range(2, L))
        # the hidden biases b_l, l = 1..L-1 (index l-1)
        self.bias_neuron = nn.ModuleList(nn.Linear(h[l], c_out) for l in range(1, L))
        self.bias_global = nn.ModuleList(nn.Linear(n_global, c_out, bias=False) for _ in range(1, L))

        init_summed_(self.first, self.first_global)
        init_summed_(self.last, self.last_global)
        init_summed_(self.last_bias)
        for i in range(L - 2):
            init_summed_(self.entry[i], self.row[i], self.col[i], self.weight_global[i])
        for i in range(L - 1):
            init_summed_(self.bias_neuron[i], self.bias_global[i])

    def forward(self, ws: WeightSpace) -> WeightSpace:
        ws = ws.with_channels()
        weights, biases = ws.weights, ws.biases
        check_input(weights, biases, self.widths, self.in_channels, type(self).__name__)
        L, B, c_out = len(weights), weights[0].shape[0], self.out_channels
        d_in, d_out = self.widths[0], self.widths[-1]
        g = hnp_global_features(weights, biases)
        h = [None] + [hidden_neuron_features(weights, biases, l) for l in range(1, L)]

        first = self.first(h[1]) + self.first_global(g)[:, None]  # [B, d_1, d_0 * C_out]
        out_w = [first.reshape(B, self.widths[1], d_in, c_out)]
        for l in range(2, L):
            i = l - 2
            out_w.append(self.entry[i](weights[l - 1])
                         + self.row[i](h[l])[:, :, None]
                         + self.col[i](h[l - 1])[:, None, :]
                         + self.weight_global[i](g)[:, None, None])
        last = self.last(h[L - 1]) + self.last_global(g)[:, None]  # [B, d_{L-1}, d_L * C_out]
        out_w.append(last.reshape(B, self.widths[L - 1], d_out, c_out).transpose(1, 2))

        out_b = [self.bias_neuron[l - 1](h[l]) + self.bias_global[l - 1](g)[:, None] for l in range(1, L)]
        out_b.append(self.last_bias(g).reshape(B, d_out, c_out))
        return WeightSpace(tuple(out_w), tuple(out_b))

    def extra_repr(self) -> str:
        return f"widths={self.widths}, in_channels={self.in_channels}, out_channels={self.out_channels}"
