"""Whether a fused path may compute a module's forward without calling the module.

The fusions of :class:`dws.nn.models.EquivariantStack` and the native batch norm
(:mod:`dws.nn.bn_relu`) read a module's parameters and compute what its ``forward`` would, so
anything that relies on the module being *called* (forward hooks, pre-hooks such as pruning's or
``weight_norm``'s, backward hooks, or a subclass with its own ``forward``) would silently be
skipped. They only fuse modules for which :func:`fusable` holds; everything else is called as usual.
"""

from __future__ import annotations

from torch import nn
from torch.nn.modules import module as _module

_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def fusable(module: nn.Module, cls: type) -> bool:
    """``module`` is exactly a ``cls`` (not a subclass) and no hook of its own or global module hook
    is registered."""
    return (
        type(module) is cls
        and not any(getattr(module, name, None) for name in _HOOKS)
        and not any(getattr(_module, f"_global{name}", None) for name in _HOOKS)
    )
