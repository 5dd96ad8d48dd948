"""Entry-wise and per-channel modules on weight spaces: ReLU, dropout, batch normalization.

They act the same way on every entry of a tensor (BN statistics pool over the batch and all
positions of one tensor), so they commute with the neuron permutations and keep equivariance.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from dws.nn import native_pools
from dws.nn.bn_relu import bn_relu_product_train, bn_relu_train, native_applies
from dws.nn.pending import PendingSum
from dws.weightspace import WeightSpace

Tensor = torch.Tensor


class WSReLU(nn.Module):
    def forward(self, ws: WeightSpace) -> WeightSpace:
        return ws.map(torch.relu)


class WSDropout(nn.Module):
    """Element-wise dropout on every weight and bias entry (equivariant in distribution)."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.p = float(p)

    def forward(self, ws: WeightSpace) -> WeightSpace:
        if self.p == 0.0 or not self.training:
            return ws
        return ws.map(lambda t: nn.functional.dropout(t, self.p, training=True))


class WSBatchNorm(nn.Module):
    """One ``BatchNorm1d`` over the channels of each weight and each bias tensor.

    Each tensor gets its own statistics because weights of different layers live on different
    scales; within a tensor all positions share them, which is what keeps the map equivariant.
    With ``relu=True`` a ReLU follows: in training mode on the native kernels one node
    (:mod:`dws.nn.bn_relu`) that also takes a DWS layer's unadded broadcast terms
    (:meth:`forward_parts`) and can compute the next layer's product (:meth:`forward_into`); else
    in place on PyTorch's normalized output.
    """

    def __init__(self, num_layers: int, channels: int, relu: bool = False, **bn_kwargs):
        super().__init__()
        self.relu = relu
        self.weight_norms = nn.ModuleList(nn.BatchNorm1d(channels, **bn_kwargs) for _ in range(num_layers))
        self.bias_norms = nn.ModuleList(nn.BatchNorm1d(channels, **bn_kwargs) for _ in range(num_layers))

    def forward(self, ws: WeightSpace) -> WeightSpace:
        return self.forward_parts(ws.weights, ws.biases)

    def forward_parts(self, weights: Sequence[Tensor | PendingSum], biases: Sequence[Tensor | PendingSum],
                      skip: set[int] = frozenset()) -> WeightSpace:
        """Normalize a weight space given as its tensors, some of which may still be
        :class:`~dws.nn.pending.PendingSum` outputs of a DWS layer (their terms are added on the
        fly where the native batch norm + ReLU applies, else first); ``weights[k]`` for ``k`` in
        ``skip`` pass through (placeholders, see :meth:`forward_into`)."""
        first = weights[0].full if isinstance(weights[0], PendingSum) else weights[0]
        if first.dim() != 4 or len(weights) != len(self.weight_norms):
            raise ValueError(
                f"WSBatchNorm expects a weight space with channels and {len(self.weight_norms)} layers"
            )
        return WeightSpace(
            tuple(w if k in skip else self._norm(bn, w) for k, (bn, w) in enumerate(zip(self.weight_norms, weights))),
            tuple(self._norm(bn, b) for bn, b in zip(self.bias_norms, biases)),
        )

    def forward_into(self, weights: list, biases: list, layer) -> tuple[WeightSpace, dict]:
        """:meth:`forward_parts`, where the next module is the DWS layer ``layer``: each hidden weight
        that ``layer`` only reads through its identity product and max pools
        (:meth:`~dws.nn.layer.DWSLayer.identity_input`) gets those computed here straight from this
        batch norm + ReLU (:func:`~dws.nn.bn_relu.bn_relu_product_train`; the normalized tensor is
        never materialized) where the native kernels apply. Returns the weight space, with a
        ``meta`` placeholder for each such weight, and ``{weight index: (product, pools)}`` for
        ``layer.forward_parts(..., ready=)``."""
        weights, ready = list(weights), {}
        for k, x in enumerate(weights):
            fused = self._fused_product(self.weight_norms[k], x, layer.identity_input(k))
            if fused is not None:
                ready[k] = fused
                weights[k] = torch.empty(x.full.shape, dtype=x.full.dtype, device="meta")
        out = self.forward_parts(weights, biases, skip=set(ready))
        return out, ready

    def _fused_product(self, bn: nn.BatchNorm1d, x, identity) -> tuple[Tensor, list[Tensor]] | None:
        if identity is None or not self.relu or not isinstance(x, PendingSum):
            return None
        weight, dims = identity
        terms = x.row_and_column()
        if terms is None or not native_applies(bn, x.full, *terms) or not native_pools.applies(x.full, weight, dims):
            return None
        return bn_relu_product_train(bn, x.full, *terms, weight, dims)

    def _norm(self, bn: nn.BatchNorm1d, x: Tensor | PendingSum) -> Tensor:
        if isinstance(x, PendingSum):
            terms = x.row_and_column() if self.relu else None
            if terms is not None and native_applies(bn, x.full, *terms):
                return bn_relu_train(bn, x.full, *terms)  # the broadcast terms added on the fly
            x = x.resolve()
        flat = x.reshape(-1, x.shape[-1])
        if self.relu and native_applies(bn, flat):  # two passes each way instead of five
            return bn_relu_train(bn, flat).reshape(x.shape)
        # Else PyTorch's own [N, C] batch norm, the ReLU in place on its fresh output (batch norm's
        # backward needs only its input).
        if bn.training and flat.shape[0] == 1:  # one value per channel (b_M of a single network):
            out = flat * 0 + bn.bias  # centred it is 0, so BN gives beta; torch's BN would raise
        else:
            out = bn(flat)
        return (out.relu_() if self.relu else out).reshape(x.shape)


def activation_block(num_layers: int, channels: int, bn: bool, dropout: float) -> list[nn.Module]:
    """The modules that follow a hidden DWS layer: BN+ReLU (fused) or ReLU, then dropout."""
    mods: list[nn.Module] = [WSBatchNorm(num_layers, channels, relu=True) if bn else WSReLU()]
    if dropout > 0:
        mods.append(WSDropout(dropout))
    return mods
