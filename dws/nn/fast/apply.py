"""Applying the accelerator to a model, and taking it off again.

:func:`accelerate` walks the model once and gives each module it has a fused form for (exactly a
:class:`~dws.nn.layer.DWSLayer`, :class:`~dws.nn.invariant.DWSInvariantLayer`,
:class:`~dws.nn.pointwise.WSBatchNorm`, or an ``nn.Sequential`` holding DWS layers; subclasses are
left alone) that form's class, in place, as ``torch.nn.utils.parametrize`` does: the module stays
the same object with the same parameters, buffers, children and hooks, so the state dict, the
optimizer's parameter list and any reference to the module are unchanged. :func:`restore` gives
the modules their plain classes back.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from torch import nn

from dws.nn.fast import native
from dws.nn.fast.batchnorm import FusedBatchNorm
from dws.nn.fast.invariant import FusedInvariantLayer
from dws.nn.fast.layer import FusedDWSLayer, LayerPlan
from dws.nn.fast.stack import FusedStack
from dws.nn.invariant import DWSInvariantLayer
from dws.nn.layer import DWSLayer
from dws.nn.pointwise import WSBatchNorm

BACKENDS = ("auto", "native", "pytorch", "plain")
_FUSED = {DWSLayer: FusedDWSLayer, DWSInvariantLayer: FusedInvariantLayer, WSBatchNorm: FusedBatchNorm,
          nn.Sequential: FusedStack}
_PLAIN = {fused: plain for plain, fused in _FUSED.items()}
_ATTRIBUTES = ("use_native", "plan")  # what accelerate adds to a module


def accelerate(model: nn.Module, backend: str = "auto") -> nn.Module:
    """Accelerate ``model``'s DWS modules in place (see the module doc) and return ``model``.

    ``backend``: ``"native"`` uses the C kernels (:mod:`dws.nn.fast.native`, built on first use)
    where they take the tensors and the accelerator's PyTorch operators elsewhere, and raises if
    the kernels cannot be built here; ``"pytorch"`` uses only PyTorch operators (any device;
    second derivatives work); ``"auto"`` is ``"native"`` where the kernels can be built (not with
    ``ZOO_NATIVE=0``), else ``"pytorch"``; ``"plain"`` restores the plain modules. A model that is
    already accelerated is restored first. Results equal the plain modules' up to float rounding.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    restore(model)
    if backend == "plain":
        return model
    use_native = backend != "pytorch" and _kernels(required=backend == "native")
    for module in model.modules():
        fused = _FUSED.get(type(module))
        if fused is None or not _worth_it(fused, module, use_native):
            continue
        module.__class__ = fused
        module.use_native = use_native
        if fused is FusedDWSLayer:
            module.plan = LayerPlan.of(module)
    return model


def restore(model: nn.Module) -> nn.Module:
    """Give every accelerated module of ``model`` its plain class back (in place); returns ``model``."""
    for module in model.modules():
        plain = _PLAIN.get(type(module))
        if plain is not None:
            module.__class__ = plain
            for name in _ATTRIBUTES:
                if name in vars(module):
                    delattr(module, name)
    return model


@contextmanager
def suspended(model: nn.Module) -> Iterator[nn.Module]:
    """Run ``model`` on its plain modules inside the block (e.g. for a comparison or second
    derivatives through the native kernels' modules), accelerated as before after it."""
    modes = {getattr(m, "use_native", None) for m in model.modules() if type(m) in _PLAIN}
    restore(model)
    try:
        yield model
    finally:
        if modes:
            accelerate(model, "native" if True in modes else "pytorch")


def describe(model: nn.Module) -> dict[str, str]:
    """``{module name: fused class (native or pytorch)}`` for the accelerated modules of ``model``."""
    return {name or "(model)": f"{type(m).__name__} ({'native' if m.use_native else 'pytorch'})"
            for name, m in model.named_modules() if type(m) in _PLAIN}


def _kernels(required: bool) -> bool:
    """Whether the native kernels are loaded (built on first use); raises if ``required`` and not."""
    if native.library() is not None:
        return True
    if required:
        raise RuntimeError("backend='native': the native DWS kernels are not available here (ZOO_NATIVE=0, "
                           "not x86-64 with AVX2 and FMA, no C compiler, or the build failed; see the warning); "
                           "use backend='auto' or 'pytorch'")
    return False


def _worth_it(fused: type, module: nn.Module, use_native: bool) -> bool:
    """Whether the fused form of ``module`` differs from the plain one for this backend: batch norm
    and the stack's fusions exist only on the native kernels; a stack needs a DWS layer."""
    if fused is FusedBatchNorm:
        return use_native
    if fused is FusedStack:
        return use_native and any(type(m) is DWSLayer for m in module)
    return True
