"""Whether a fused path may compute a module's forward without calling the module.

The fused stack (:mod:`dws.nn.fast.stack`) and the native batch norm (:mod:`dws.nn.fast.batchnorm`)
read a module's parameters and compute what its ``forward`` would, so anything that relies on the
module being *called* (forward hooks, pre-hooks such as pruning's or ``weight_norm``'s, backward
hooks, or a subclass with its own ``forward``) would silently be skipped. They only fuse modules
for which :func:`fusable` holds; everything else is called as usual.

PyTorch has no public way to ask whether a module has hooks. This module reads the hook
dictionaries of ``nn.Module`` (private attributes) behind a capability check run once: it
registers a hook on a probe module and checks that it is seen, and that it is gone once removed.
Where that fails (a PyTorch that keeps hooks elsewhere), :func:`fusable` is always False and every
module is called, which is always correct, only slower.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.modules import module as _module

_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def _own_hooks(module: nn.Module) -> bool:
    return any(getattr(module, name, None) for name in _HOOKS)


def _global_hooks() -> bool:
    return any(getattr(_module, f"_global{name}", None) for name in _HOOKS)


def _hooks_visible() -> bool:
    """The capability check: a registered hook is seen, a removed one is not."""
    try:
        if not all(isinstance(getattr(_module, f"_global{name}", None), dict) for name in _HOOKS):
            return False
        probe = nn.Module()
        seen = []
        for register in (probe.register_forward_hook, probe.register_forward_pre_hook,
                         probe.register_full_backward_hook, probe.register_full_backward_pre_hook):
            handle = register(lambda *args: None)
            seen.append(_own_hooks(probe))
            handle.remove()
            seen.append(not _own_hooks(probe))
        already = _global_hooks()
        handle = _module.register_module_forward_pre_hook(lambda *args: None)
        seen.append(_global_hooks())
        handle.remove()
        return all(seen) and _global_hooks() == already
    except Exception:  # noqa: BLE001 (any surprise means: we cannot see hooks)
        return False


HOOKS_VISIBLE = _hooks_visible()


def autocasting(tensor) -> bool:
    """``torch.autocast`` is on for ``tensor``'s device (``zoo train --precision bf16``). The fused forms'
    autograd nodes and kernels are float32 code that mixes their inputs' dtype with float32 parameters, so
    under autocast every fused form steps aside for its plain module's forward, which autocast runs in its
    dtype as it would any model's (docs/dws.md, "Accelerator")."""
    return torch.is_autocast_enabled(tensor.device.type)


def fusable(module: nn.Module, cls: type) -> bool:
    """``module`` is exactly a ``cls`` (not a subclass) and no hook of its own or global module hook
    is registered (as far as this PyTorch lets us see; see the module doc)."""
    return type(module) is cls and HOOKS_VISIBLE and not _own_hooks(module) and not _global_hooks()
