"""The native form of the max-pool nodes: a hidden weight's pools (and channel-mixing product).

Shared by :class:`dws.nn.fast.identity.MatmulAndMaxPools` (pools + product of a weight between two
hidden layers) and :class:`dws.nn.fast.pools.MaxOverDims` (pools alone, e.g. the invariant layer's):
the kernels of :mod:`dws.nn.fast.native` take the pools over H and/or W of a ``[B, H, W, C]`` tensor
one network at a time, and the backward writes the input gradient (product gradient, or zeros)
and scatters the pools' gradients into it while the network's block is in cache. Called from the
nodes' ``forward``/``backward`` with their ``ctx``.
"""

from __future__ import annotations

import torch

from dws.nn.fast import native

Tensor = torch.Tensor
ROWS, COLUMNS = (2,), (1,)  # pooled dims of [B, H, W, C]: over W (one max per row), over H


def applies(x: Tensor, weight: Tensor | None, dims_list) -> bool:
    """A ``[B, H, W, C]`` input pooled over H and/or W (each once), on tensors the kernels take."""
    tensors = (x,) if weight is None else (x, weight)
    channels = (x.shape[-1],) if weight is None else (x.shape[-1], weight.shape[-1])
    return (
        x.dim() == 4 and len(dims_list) >= 1 and len(set(dims_list)) == len(dims_list)
        and all(d in (ROWS, COLUMNS) for d in dims_list) and native.usable(*tensors, channels=channels)
    )


def forward(ctx, x: Tensor, weight: Tensor | None, dims_list) -> tuple[Tensor, ...]:
    """``(x @ weight, *pools in dims_list order)``, or the pools alone when ``weight`` is None."""
    y, row, col = native.pools_product(x, weight, ROWS in dims_list, COLUMNS in dims_list)
    pools, args = split_pools(dims_list, row, col)
    ctx.with_product = weight is not None
    ctx.save_for_backward(*((x, weight) if ctx.with_product else ()), *args)  # (pools alone: not x)
    ctx.dims_list, ctx.shape = dims_list, x.shape
    return pools if weight is None else (y, *pools)


def backward(ctx, grad_y: Tensor | None, grad_pools) -> tuple[Tensor | None, Tensor | None]:
    """``(grad_x, grad_weight)`` from the product's gradient (None: not used) and the pools'."""
    if torch.is_grad_enabled():  # (create_graph=True) the kernels' gradients have no graph of their own
        raise RuntimeError("double backward through the native DWS kernels is not supported; for "
                           "higher-order gradients use accelerate(model, backend='pytorch') or ZOO_NATIVE=0")
    saved = ctx.saved_tensors
    x, weight, args = (saved[0], saved[1], saved[2:]) if ctx.with_product else (ctx.shape, None, saved)
    row, col = pool_gradients(ctx.dims_list, grad_pools, args)
    want_weight = weight is not None and ctx.needs_input_grad[1]
    return native.pools_product_backward(x, weight, grad_y, row, col, ctx.needs_input_grad[0], want_weight)


def split_pools(dims_list, row, col) -> tuple[tuple[Tensor, ...], list[Tensor]]:
    """From the kernels' ``(max, argmax)`` row and column pools (None where not taken): the maxima
    in ``dims_list`` order (the node's outputs) and the argmaxes to save (rows first)."""
    pools = tuple((row if d == ROWS else col)[0] for d in dims_list)
    return pools, [p[1] for p in (row, col) if p is not None]


def pool_gradients(dims_list, grad_pools, args):
    """``(row, col)`` for the kernels' backward: ``(gradient or None, argmax)`` per pool taken, else
    None; ``grad_pools`` in ``dims_list`` order, ``args`` as :func:`split_pools` saved them."""
    grads = dict(zip(dims_list, grad_pools))
    arg = dict(zip([d for d in (ROWS, COLUMNS) if d in dims_list], args))
    return tuple((grads[d], arg[d]) if d in arg else None for d in (ROWS, COLUMNS))
