"""The NP layer (Zhou et al. 2023, Sec. 3 and Eq. (4)-(5) / App. A): the linear map of a weight space
that is equivariant to the *neural permutation* group, permutations of every layer's neurons,
input and output neurons included.

For ``W_l`` (``l = 1..L``; rows: neurons ``j`` of layer ``l``, columns: neurons ``k`` of layer ``l-1``)::

    W'_l[j, k] = A_l W_l[j, k]                       # the entry itself (channels mixed)
               + R_l  f_l(j)                         # broadcast along the row: neuron j of layer l
               + Q_l  f_{l-1}(k)                     # broadcast along the column: neuron k of layer l-1
               + G_l  g                              # broadcast everywhere: the global means
               + a_l
    b'_l[j]    = S_l f_l(j) + H_l g + c_l

with ``f_l(n)`` the neuron's features (:func:`~dws.nfn.neurons.neuron_features`: mean incoming weight,
bias, mean outgoing weight) and ``g`` the mean of every tensor. All maps act on channels only, so
the layer takes ``C_in`` channels to ``C_out`` for any widths: it is the reference code's ``NPLinear``
term by term (its redundant per-term biases merged into one per output tensor).

Because input and output neurons are permuted too, an NP model cannot tell them apart unless it
is told: :class:`~dws.nfn.encoding.IOPositionEncoding` adds those positions as channels.
"""

from __future__ import annotations

from typing import Sequence

from torch import nn

from dws.nfn.init import init_summed_
from dws.nfn.neurons import check_input, global_means, neuron_feature_count, neuron_features
from dws.weightspace import WeightSpace


class NPLayer(nn.Module):
    """NP-equivariant affine map: a weight space of ``widths`` with ``in_channels`` -> ``out_channels``."""

    def __init__(self, widths: Sequence[int], in_channels: int, out_channels: int):
        super().__init__()
        self.widths = tuple(int(d) for d in widths)
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        L = len(self.widths) - 1
        c_in, c_out, n_global = self.in_channels, self.out_channels, 2 * L * self.in_channels

        def lin(blocks: int, bias: bool = False) -> nn.Linear:
            return nn.Linear(blocks * c_in, c_out, bias=bias)

        self.entry = nn.ModuleList(lin(1, bias=True) for _ in range(L))
        self.row = nn.ModuleList(lin(neuron_feature_count(L, l)) for l in range(1, L + 1))
        self.col = nn.ModuleList(lin(neuron_feature_count(L, l - 1)) for l in range(1, L + 1))
        self.weight_global = nn.ModuleList(nn.Linear(n_global, c_out, bias=False) for _ in range(L))
        self.bias_neuron = nn.ModuleList(lin(neuron_feature_count(L, l), bias=True) for l in range(1, L + 1))
        self.bias_global = nn.ModuleList(nn.Linear(n_global, c_out, bias=False) for _ in range(L))
        for i in range(L):
            init_summed_(self.entry[i], self.row[i], self.col[i], self.weight_global[i])
            init_summed_(self.bias_neuron[i], self.bias_global[i])

    def forward(self, ws: WeightSpace) -> WeightSpace:
        ws = ws.with_channels()
        weights, biases = ws.weights, ws.biases
        check_input(weights, biases, self.widths, self.in_channels, type(self).__name__)
        L = len(weights)
        g = global_means(weights, biases)  # [B, 2L * C_in]
        f = [neuron_features(weights, biases, l) for l in range(L + 1)]  # f[l]: [B, d_l, k * C_in]
        out_w, out_b = [], []
        for i in range(L):  # tensor W_{i+1}: rows are layer i+1's neurons, columns layer i's
            out_w.append(self.entry[i](weights[i])
                         + self.row[i](f[i + 1])[:, :, None]
                         + self.col[i](f[i])[:, None, :]
                         + self.weight_global[i](g)[:, None, None])
            out_b.append(self.bias_neuron[i](f[i + 1]) + self.bias_global[i](g)[:, None])
        return WeightSpace(tuple(out_w), tuple(out_b))

    def extra_repr(self) -> str:
        return f"widths={self.widths}, in_channels={self.in_channels}, out_channels={self.out_channels}"
