"""Per-tensor batch norm + ReLU on the native kernels: the same function as
:class:`dws.nn.pointwise.WSBatchNorm`.

In training mode, where the kernels take a tensor, batch norm + ReLU is one node
(:mod:`dws.nn.fast.bn_relu`: two passes each way instead of five). Two more entry points serve
:class:`dws.nn.fast.stack.FusedStack`: :meth:`FusedBatchNorm.forward_parts` takes a DWS layer's
outputs before their broadcast terms are added (:class:`~dws.nn.fast.pending.PendingSum`) and adds
them on the fly, and :meth:`FusedBatchNorm.forward_into` also computes the next DWS layer's identity
product and max pools of each hidden weight without storing the normalized tensor. Everything
else (eval mode, float64, channel counts the kernels do not take, a hooked or subclassed
``BatchNorm1d``) goes through the plain module's path.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from dws.nn.fast import native_pools
from dws.nn.fast.bn_relu import bn_relu_product_train, bn_relu_train, native_applies
from dws.nn.fast.guard import autocasting
from dws.nn.fast.pending import PendingSum
from dws.nn.pointwise import WSBatchNorm
from dws.weightspace import WeightSpace

Tensor = torch.Tensor


class FusedBatchNorm(WSBatchNorm):
    """A :class:`~dws.nn.pointwise.WSBatchNorm` accelerated in place by
    :func:`dws.nn.fast.accelerate` (same modules and statistics, same function); only applied with
    the native kernels."""

    def forward(self, ws: WeightSpace) -> WeightSpace:
        return self.forward_parts(ws.weights, ws.biases)

    def forward_parts(self, weights: Sequence[Tensor | PendingSum], biases: Sequence[Tensor | PendingSum],
                      skip: set[int] = frozenset()) -> WeightSpace:
        """Normalize a weight space given as its tensors, some of which may still be
        :class:`~dws.nn.fast.pending.PendingSum` outputs of a DWS layer (their terms are added on the
        fly where the native batch norm + ReLU applies, else first); ``weights[k]`` for ``k`` in
        ``skip`` pass through (placeholders, see :meth:`forward_into`)."""
        first = weights[0].full if isinstance(weights[0], PendingSum) else weights[0]
        self.check_input(first, len(weights))
        return WeightSpace(
            tuple(w if k in skip else self.normalize(bn, w)
                  for k, (bn, w) in enumerate(zip(self.weight_norms, weights))),
            tuple(self.normalize(bn, b) for bn, b in zip(self.bias_norms, biases)),
        )

    def forward_into(self, weights: list, biases: list, layer) -> tuple[WeightSpace, dict]:
        """:meth:`forward_parts`, where the next module is the fused DWS layer ``layer``: each hidden
        weight that ``layer`` only reads through its identity product and max pools
        (:meth:`~dws.nn.fast.layer.FusedDWSLayer.identity_input`) gets those computed here straight
        from this batch norm + ReLU (:func:`~dws.nn.fast.bn_relu.bn_relu_product_train`; the
        normalized tensor is never materialized) where the native kernels apply. Returns the weight
        space, with a ``meta`` placeholder for each such weight, and ``{weight index: (product,
        pools)}`` for ``layer.forward_parts(..., ready=)``."""
        weights, ready = list(weights), {}
        for k, x in enumerate(weights):
            fused = self._fused_product(self.weight_norms[k], x, layer.identity_input(k) if layer.use_native else None)
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
        if (terms is None or not native_applies(bn, x.full, *terms)
                or not native_pools.applies(x.full, weight, dims)):
            return None
        return bn_relu_product_train(bn, x.full, *terms, weight, dims)

    def normalize(self, bn: nn.BatchNorm1d, x: Tensor | PendingSum) -> Tensor:
        if isinstance(x, Tensor) and autocasting(x):  # every path to a tensor's normalization comes here
            return super().normalize(bn, x)
        if isinstance(x, PendingSum):
            terms = x.row_and_column() if self.relu else None
            if terms is not None and native_applies(bn, x.full, *terms):
                return bn_relu_train(bn, x.full, *terms)  # the broadcast terms added on the fly
            x = x.resolve()
        flat = x.reshape(-1, x.shape[-1])
        if self.relu and native_applies(bn, flat):  # two passes each way instead of five
            return bn_relu_train(bn, flat).reshape(x.shape)
        return super().normalize(bn, x)
