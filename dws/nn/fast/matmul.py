"""The DWS layer's channel-mixing matmul, routed to oneDNN for the large, thin CPU case.

The identity term of a hidden weight maps ``[B * d_m * d_{m-1}, C_in]`` by a ``[C_in, C_out]``
matrix (65,536 x 48 x 48 for the MNIST-INR DWSNet at batch 64). MKL's sgemm, behind
``torch.matmul`` on CPU, runs that shape at ~35 GFLOP/s on one core of the development machine
and gains nothing from a second thread; oneDNN's linear kernel (PyTorch's ``mkldnn`` build, the one
``torch.compile`` uses for CPU linears) runs it at ~70 GFLOP/s on one core and ~110 on two. The
backward's input gradient is the same shape of product and goes to oneDNN too; the weight gradient
(a long reduction, where MKL is faster) stays with ``torch.mm``. Anything else (float64, GPU,
small products, a PyTorch built without oneDNN) is a plain ``torch.matmul``, and so is every product
traced by ``torch.compile`` (``zoo train --compile``): inductor cannot lower the private op (an
``InductorError`` at the first step) and picks its own oneDNN kernels for a ``matmul``. Results
equal ``torch.matmul``'s up to float rounding (tested).

The oneDNN linear op (``torch.ops.mkldnn._linear_pointwise``) is private: other PyTorch builds
may lack it or change its signature. It is used only if a trial product on import gives
``torch.matmul``'s result (:func:`_onednn_linear_op`); otherwise every product is a
``torch.matmul`` (tested). The public route that the other models use for such products, a 1x1
``F.conv2d`` of a channels-last view (:mod:`dws.ops.linear`), was measured slower here on the
DWSNet's shapes (the input gradients 0.47-0.93x of this op's speed; docs/dws.md, "Accelerator").
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor

ONEDNN_MIN_ROWS = 16384  # below this, MKL is as fast and a custom autograd node is not worth it


def _onednn_linear_op():
    """The oneDNN linear op if this PyTorch has it with the signature used here, else None."""
    try:
        if not torch.backends.mkldnn.is_available():
            return None
        op = torch.ops.mkldnn._linear_pointwise
        x, w = torch.randn(5, 3), torch.randn(4, 3)
        ok = torch.allclose(op(x, w, None, "none", [], ""), x @ w.t(), atol=1e-5)
        return op if ok else None
    except Exception:  # noqa: BLE001 (missing, renamed or changed: use torch.matmul)
        return None


_LINEAR = _onednn_linear_op()


def uses_onednn(x: Tensor, weight: Tensor, min_rows: int | None = None) -> bool:
    """Whether ``x @ weight`` goes to oneDNN: a large float32 CPU product (see the module doc)."""
    min_rows = ONEDNN_MIN_ROWS if min_rows is None else min_rows
    return (
        _LINEAR is not None and x.numel() // max(x.shape[-1], 1) >= min_rows and x.device.type == "cpu"
        and x.dtype == torch.float32 and weight.dtype == torch.float32 and not torch.compiler.is_compiling()
    )


def mix_channels(x: Tensor, weight: Tensor, min_rows: int | None = None) -> Tensor:
    """``x @ weight`` for ``x`` [..., F_in] and ``weight`` [F_in, F_out]."""
    if uses_onednn(x, weight, min_rows):
        return _OneDNNMatmul.apply(x, weight)
    return torch.matmul(x, weight)


def product(x: Tensor, weight: Tensor, onednn: bool) -> Tensor:
    """``x @ weight`` as a fresh tensor, without autograd (for custom autograd nodes)."""
    return _linear(x, weight.t()) if onednn else torch.matmul(x, weight)


def input_grad(grad: Tensor, weight: Tensor, onednn: bool) -> Tensor:
    """``grad @ weight.T``: the gradient of ``x @ weight`` with respect to ``x``, a fresh tensor."""
    return _linear(grad.contiguous(), weight) if onednn else torch.matmul(grad, weight.t())


def weight_grad(x: Tensor, grad: Tensor) -> Tensor:
    """``x.T @ grad`` over all leading axes: the gradient of ``x @ weight`` with respect to ``weight``
    (a long reduction, where MKL beats oneDNN)."""
    return torch.mm(x.reshape(-1, x.shape[-1]).t(), grad.reshape(-1, grad.shape[-1]))


def _linear(x: Tensor, weight_t: Tensor) -> Tensor:
    """oneDNN's ``x @ weight_t.t()`` as a fresh N-D tensor, not a view: the DWS layer adds its
    broadcast terms in place into a hidden weight's product, and autograd refuses in-place changes
    of a custom node's output that is a view (the op returns a view of its 2-D result for an N-D
    input; ``resize_`` gives the 2-D result the N-D shape without a copy)."""
    out = _LINEAR(x.reshape(-1, x.shape[-1]), weight_t, None, "none", [], "")
    return out.resize_(*x.shape[:-1], out.shape[-1])


class _OneDNNMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor) -> Tensor:
        ctx.save_for_backward(x, weight)
        return product(x, weight, onednn=True)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        grad_x = input_grad(grad, weight, onednn=True) if ctx.needs_input_grad[0] else None
        grad_w = weight_grad(x, grad) if ctx.needs_input_grad[1] else None
        return grad_x, grad_w
