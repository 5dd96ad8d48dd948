"""Native CPU kernels for a DWSNet's largest tensors (``kernels.c``), built on first use.

Why C: at the MNIST-INR configuration a hidden weight's features (``[64, 32, 32, 48]``, 12.6 MB at
batch 64) dominate a training step, and PyTorch runs each of their operations as its own pass
over memory: the channel-mixing product, two max pools, batch norm's statistics and normalization,
the ReLU, and in the backward the ReLU mask, batch norm's two passes, the product's two gradients
and the pools' scatter into a zero-filled buffer. The C kernels do the product, the pools and
(backward) both gradients and the scatter one network at a time while its ``[H, W, C]`` block is in
the core's L2 cache, and batch norm + ReLU in two passes each way, saving only batch norm's input
and adding the DWS layer's broadcast terms on the fly; one kernel pair also runs batch norm + ReLU
and the next layer's product and pools without storing the normalized tensor. They run on
PyTorch's OpenMP thread pool (see ``kernels.c``; a PyTorch built on another OpenMP runtime than
GNU libgomp leaves them their own pool, with as many threads as ``torch.get_num_threads()``).

Built and loaded only when a model is accelerated with the ``"auto"`` or ``"native"`` backend
(:func:`dws.nn.fast.accelerate`), where the library can be built (:mod:`zoo.cbuild`: x86-64 with
AVX2 and FMA, a C compiler, ``ZOO_NATIVE`` not ``0``). The accelerated modules then use it for
float32 CPU tensors whose channel counts are multiples of 8; everything else (float64, GPU, other
channel counts) takes the accelerator's PyTorch path, which computes the same function up to float
rounding (tested).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from zoo import cbuild

Tensor = torch.Tensor
SOURCE = Path(__file__).with_name("kernels.c")
FLAGS = [*cbuild.BASE_FLAGS, "-fopenmp"]

_int, _ptr, _float = ctypes.c_int, ctypes.c_void_p, ctypes.c_float


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded kernels, or ``None`` where they cannot run here (see the module doc)."""
    lib = cbuild.load(SOURCE, FLAGS, "native DWS kernels", "the PyTorch path of the DWS layers")
    return None if lib is None else declare(lib)


def declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Set the kernels' argument types on a loaded build of ``kernels.c``."""
    lib.dws_pools_product.argtypes = [_int] * 5 + [_ptr] * 7 + [_int]
    lib.dws_pools_product_backward.argtypes = [_int] * 5 + [_ptr] * 9 + [_int]
    lib.dws_bn_relu_forward.argtypes = [_int] * 4 + [_ptr] * 5 + [_float] + [_ptr] * 5 + [_float, _int]
    lib.dws_bn_relu_backward.argtypes = [_int] * 4 + [_ptr] * 13 + [_int]
    lib.dws_bn_relu_product_forward.argtypes = (
        [_int] * 4 + [_ptr] * 5 + [_float] + [_ptr] * 4 + [_float, _int] + [_ptr] * 6 + [_int])
    lib.dws_bn_relu_product_backward.argtypes = [_int] * 4 + [_ptr] * 7 + [_int] + [_ptr] * 12 + [_int]
    for fn in (lib.dws_pools_product, lib.dws_pools_product_backward, lib.dws_bn_relu_forward,
               lib.dws_bn_relu_backward, lib.dws_bn_relu_product_forward, lib.dws_bn_relu_product_backward):
        fn.restype = None
    return lib


def usable(*tensors: Tensor, channels: tuple[int, ...]) -> bool:
    """Whether the kernels apply: contiguous float32 CPU tensors, channel counts multiples of 8, in an eager
    step (``torch.compile`` cannot trace the foreign calls: its step keeps the PyTorch path, which computes
    the same function, and fuses it itself)."""
    return (
        not torch.compiler.is_compiling()
        and all(c % 8 == 0 and c > 0 for c in channels)
        and all(t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() for t in tensors)
        and library() is not None
    )


def _ptr_of(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _pool_outputs(like: Tensor, c: int, rows: bool, columns: bool):
    """Empty (max, int32 argmax) pairs for the row pools ([B, H, C]) and the column pools ([B, W, C]),
    None where not taken."""
    B, H, W = like.shape[:3]
    row = (like.new_empty(B, H, c), torch.empty(B, H, c, dtype=torch.int32)) if rows else None
    col = (like.new_empty(B, W, c), torch.empty(B, W, c, dtype=torch.int32)) if columns else None
    return row, col


def _contiguous_grads(pool):
    """A pool's ``(gradient or None, argmax)`` with the gradient made contiguous (bound to the returned
    pair: a temporary's memory could be freed before the kernel call); None stays None."""
    if pool is None or pool[0] is None:
        return pool
    return pool[0].contiguous(), pool[1]


def _pool_pointers(row, col) -> tuple:
    """The four addresses (row max or gradient, row argmax, column ..., column argmax) a kernel takes."""
    return tuple(_ptr_of(t) for pool in (row, col) for t in (pool or (None, None)))


def pools_product(x: Tensor, weight: Tensor | None, rows: bool, columns: bool):
    """``x`` [B, H, W, Ci] -> ``(x @ weight, (max over W, its argmax) or None, (max over H, argmax) or None)``;
    argmaxes are int32 indices along the pooled axis. With ``weight`` None, the pools alone (the
    product is None)."""
    B, H, W, ci = x.shape
    co = 0 if weight is None else weight.shape[1]
    y = None if weight is None else x.new_empty(B, H, W, co)
    row, col = _pool_outputs(x, ci, rows, columns)
    library().dws_pools_product(B, H, W, ci, co, x.data_ptr(), _ptr_of(weight), _ptr_of(y),
                                *_pool_pointers(row, col), torch.get_num_threads())
    return y, row, col


def pools_product_backward(x: Tensor | torch.Size, weight: Tensor | None, grad_y: Tensor | None, row, col,
                           want_x: bool, want_weight: bool) -> tuple[Tensor | None, Tensor | None]:
    """Gradients of :func:`pools_product` for ``x`` and ``weight``; ``row``/``col`` are ``(grad, argmax)``
    with ``grad`` None where that pool received none. Without ``weight`` (the pools alone), ``x`` may
    be just its shape."""
    shape = x if isinstance(x, torch.Size) else x.shape
    B, H, W, ci = shape
    co = 0 if weight is None else weight.shape[1]
    like = next(t for t in (grad_y, *(row or ()), *(col or ()), x) if isinstance(t, Tensor) and t.is_floating_point())
    grad_x = like.new_empty(shape) if want_x else None
    grad_w = weight.new_empty(ci, co) if want_weight and grad_y is not None else None
    # (contiguous copies are bound to names: a temporary's memory could be freed before the call)
    grad_y = None if grad_y is None else grad_y.contiguous()
    weight_t = None if weight is None else weight.t().contiguous()
    row, col = _contiguous_grads(row), _contiguous_grads(col)
    x_ptr = None if weight is None else x.data_ptr()  # (x is read for the weight gradient only)
    library().dws_pools_product_backward(
        B, H, W, ci, co, x_ptr, _ptr_of(weight_t), _ptr_of(grad_y), *_pool_pointers(row, col), _ptr_of(grad_x),
        _ptr_of(grad_w), torch.get_num_threads())
    return grad_x, grad_w


def _rows_of(t: Tensor) -> tuple[int, int]:
    """Addresses of the two rows of a contiguous ``[2, C]`` float32 tensor (no ``select`` ops)."""
    return t.data_ptr(), t.data_ptr() + 4 * t.shape[1]


def _groups(y: Tensor) -> tuple[int, int, int, int]:
    """``(networks, h, w, c)`` of a ``[B, H, W, C]`` input, or ``(N, 1, 1, C)`` of an ``[N, C]`` one."""
    return (*y.shape[:3], y.shape[3]) if y.dim() == 4 else (y.shape[0], 1, 1, y.shape[1])


def bn_relu(y: Tensor, row: Tensor | None, col: Tensor | None, gamma: Tensor, beta: Tensor, eps: float,
            running: tuple[Tensor, Tensor, float] | None) -> tuple[Tensor, Tensor]:
    """``relu(batch_norm(v))`` with batch statistics over the channels (last axis) of ``v = y`` ([N, C])
    or ``v = y + row + col`` (``y`` [B, H, W, C], ``row`` [B, H, C] broadcast over W, ``col`` [B, W, C]
    over H, either may be None): ``(z shaped like y, stats)``, ``stats`` [2, C] the mean and invstd.
    ``running`` is ``(running_mean, running_var, factor)`` to update in place as ``nn.BatchNorm1d``
    does, or None."""
    networks, h, w, c = _groups(y)
    z = torch.empty_like(y)
    stats = y.new_empty(2, c)
    running_mean, running_var, factor = running or (None, None, 0.0)
    library().dws_bn_relu_forward(networks, h, w, c, y.data_ptr(), _ptr_of(row), _ptr_of(col), gamma.data_ptr(),
                                  beta.data_ptr(), eps, z.data_ptr(), *_rows_of(stats),
                                  _ptr_of(running_mean), _ptr_of(running_var), factor, torch.get_num_threads())
    return z, stats


def bn_relu_backward(y: Tensor, row: Tensor | None, col: Tensor | None, grad_z: Tensor, gamma: Tensor,
                     beta: Tensor, stats: Tensor):
    """Gradients of :func:`bn_relu`: ``(grad_y, grad_row or None, grad_col or None, grad_gamma, grad_beta)``."""
    networks, h, w, c = _groups(y)
    grad_z = grad_z.contiguous()
    grad_y, grad_gamma, grad_beta = torch.empty_like(y), gamma.new_empty(c), gamma.new_empty(c)
    grad_row = None if row is None else torch.empty_like(row)
    grad_col = None if col is None else torch.empty_like(col)
    library().dws_bn_relu_backward(networks, h, w, c, y.data_ptr(), _ptr_of(row), _ptr_of(col), grad_z.data_ptr(),
                                   gamma.data_ptr(), beta.data_ptr(), *_rows_of(stats), grad_y.data_ptr(),
                                   _ptr_of(grad_row), _ptr_of(grad_col), grad_gamma.data_ptr(), grad_beta.data_ptr(),
                                   torch.get_num_threads())
    return grad_y, grad_row, grad_col, grad_gamma, grad_beta


def bn_relu_product(y: Tensor, row: Tensor | None, col: Tensor | None, gamma: Tensor, beta: Tensor, eps: float,
                    running: tuple[Tensor, Tensor, float] | None, weight: Tensor, rows: bool, columns: bool):
    """:func:`bn_relu` of ``y + row + col`` (``[B, H, W, C]``) followed by :func:`pools_product` of the
    result with ``weight``, without materializing the result: ``(y_next, row pools or None, column
    pools or None, stats)``, pools as ``(max, argmax)``, ``stats`` as in :func:`bn_relu`."""
    networks, h, w, c = y.shape
    co = weight.shape[1]
    y_next = y.new_empty(networks, h, w, co)
    stats = y.new_empty(2, c)
    pool_row, pool_col = _pool_outputs(y, c, rows, columns)
    running_mean, running_var, factor = running or (None, None, 0.0)
    library().dws_bn_relu_product_forward(
        networks, h, w, c, y.data_ptr(), _ptr_of(row), _ptr_of(col), gamma.data_ptr(), beta.data_ptr(), eps,
        *_rows_of(stats), _ptr_of(running_mean), _ptr_of(running_var), factor, co,
        weight.data_ptr(), y_next.data_ptr(), *_pool_pointers(pool_row, pool_col), torch.get_num_threads())
    return y_next, pool_row, pool_col, stats


def bn_relu_product_backward(y: Tensor, row: Tensor | None, col: Tensor | None, gamma: Tensor, beta: Tensor,
                             stats: Tensor, weight: Tensor, grad_y_next: Tensor | None,
                             pool_row, pool_col, want_weight: bool):
    """Gradients of :func:`bn_relu_product`: ``(grad_y, grad_row, grad_col, grad_gamma, grad_beta,
    grad_weight)`` (None where not applicable); ``pool_row``/``pool_col`` are ``(grad or None, argmax)``."""
    networks, h, w, c = y.shape
    co = weight.shape[1]
    grad_y_next = None if grad_y_next is None else grad_y_next.contiguous()
    weight_t = weight.t().contiguous()
    pool_row, pool_col = _contiguous_grads(pool_row), _contiguous_grads(pool_col)
    grad_y, grad_gamma, grad_beta = torch.empty_like(y), gamma.new_empty(c), gamma.new_empty(c)
    grad_row = None if row is None else torch.empty_like(row)
    grad_col = None if col is None else torch.empty_like(col)
    grad_w = weight.new_empty(c, co) if want_weight and grad_y_next is not None else None
    library().dws_bn_relu_product_backward(
        networks, h, w, c, y.data_ptr(), _ptr_of(row), _ptr_of(col), gamma.data_ptr(), beta.data_ptr(),
        *_rows_of(stats), co, weight_t.data_ptr(), _ptr_of(grad_y_next), *_pool_pointers(pool_row, pool_col),
        grad_y.data_ptr(), _ptr_of(grad_row), _ptr_of(grad_col), grad_gamma.data_ptr(), grad_beta.data_ptr(),
        _ptr_of(grad_w), torch.get_num_threads())
    return grad_y, grad_row, grad_col, grad_gamma, grad_beta, grad_w
