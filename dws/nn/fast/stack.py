"""A stack of DWS layers with fusions across module boundaries (the same function as the plain
``nn.Sequential``, the same modules and state dict).

* A DWS layer followed by batch norm + ReLU hands it its outputs before the broadcast terms are
  added (:meth:`FusedDWSLayer.forward_parts <dws.nn.fast.layer.FusedDWSLayer.forward_parts>`), so
  the batch norm adds them on the fly in the native kernel (:mod:`dws.nn.fast.pending`): two
  full-size passes fewer each way per hidden weight.
* When the next module is again a DWS layer, that batch norm + ReLU also computes the next
  layer's identity product and max pools of each weight between two hidden layers
  (:meth:`~dws.nn.fast.batchnorm.FusedBatchNorm.forward_into`), so the normalized tensor is never
  written or read back.

Modules with hooks or of another type are called as in an ``nn.Sequential``
(:mod:`dws.nn.fast.guard`), checked at every call since hooks can be registered at any time.
"""

from __future__ import annotations

from torch import nn

from dws.nn.fast.batchnorm import FusedBatchNorm
from dws.nn.fast.guard import autocasting, fusable
from dws.nn.fast.layer import FusedDWSLayer
from dws.weightspace import WeightSpace


class FusedStack(nn.Sequential):
    """An ``nn.Sequential`` of DWS layers and the modules after them, accelerated in place by
    :func:`dws.nn.fast.accelerate` (only with the native kernels: the fusions are theirs)."""

    def forward(self, ws: WeightSpace) -> WeightSpace:
        if autocasting(ws.weights[0]):  # every module called, each on its plain path
            return super().forward(ws)
        mods = list(self)
        ready = None  # the next DWS layer's identity products and pools, computed by a batch norm
        i = 0
        while i < len(mods):
            module, after = mods[i], mods[i + 1] if i + 1 < len(mods) else None
            if not fusable(module, FusedDWSLayer):  # (ready is only prepared for a fusable DWS layer)
                ws, i = module(ws), i + 1
                continue
            fuse = fusable(after, FusedBatchNorm) and after.relu
            weights, biases = module.forward_parts(ws, pending=fuse, ready=ready)
            following = mods[i + 2] if fuse and i + 2 < len(mods) else None
            if not fuse:
                ws, ready, i = WeightSpace(tuple(weights), tuple(biases)), None, i + 1
            elif fusable(following, FusedDWSLayer):
                (ws, ready), i = after.forward_into(weights, biases, following), i + 2
            else:
                ws, ready, i = after.forward_parts(weights, biases), None, i + 2
        return ws
