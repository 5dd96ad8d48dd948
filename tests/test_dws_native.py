"""The native DWS kernels (dws/nn/kernels.c) against the PyTorch path they replace: the hidden
weight's product + max pools node, batch norm + ReLU, and whole models, on random shapes."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
import torch

from dws import DWSNetEquivariant, DWSNetInvariant
from dws.nn import WSBatchNorm, native
from dws.nn.bn_relu import native_applies
from dws.nn.identity import MatmulAndMaxPools
from dws.nn.native_pools import applies as _native_applies
from dws_helpers import random_ws

needs_native = pytest.mark.skipif(native.library() is None, reason="native DWS kernels not buildable here")


@pytest.fixture
def torch_path(monkeypatch):
    """Call inside a test to switch the native kernels off (the PyTorch path) from then on."""
    return lambda: monkeypatch.setattr(native, "usable", lambda *tensors, channels: False)


def _grads(outputs, cotangents, inputs):
    loss = sum((o * c).sum() for o, c in zip(outputs, cotangents) if c is not None)
    return torch.autograd.grad(loss, inputs, allow_unused=True)


@needs_native
@pytest.mark.parametrize("seed", range(8))
def test_product_and_pools_node_matches_the_torch_path(seed, torch_path):
    """Random batch, widths and channel counts (multiples of 8), every choice of pools and of which
    outputs receive gradients, with and without an input that needs a gradient."""
    gen = torch.Generator().manual_seed(seed)
    b, h, w = (int(s) for s in torch.randint(1, 12, (3,), generator=gen))
    ci, co = (8 * int(s) for s in torch.randint(1, 7, (2,), generator=gen))
    dims = [[(1,), (2,)], [(2,), (1,)], [(1,)], [(2,)]][seed % 4]
    x = torch.randn(b, h, w, ci, generator=gen, requires_grad=seed % 3 != 0)
    weight = torch.randn(ci, co, generator=gen, requires_grad=True)
    assert _native_applies(x, weight, dims)
    used = [[0, 1, 2], [1, 2], [0], [0, 1]][seed % 4][: 1 + len(dims)]
    results = []
    for switch in (lambda: None, torch_path):
        switch()
        outs = MatmulAndMaxPools.apply(x, weight, *dims)
        cots = [torch.randn(o.shape, generator=torch.Generator().manual_seed(k)) if k in used else None
                for k, o in enumerate(outs)]
        results.append((outs, _grads(outs, cots, [t for t in (x, weight) if t.requires_grad])))
    (outs, grads), (want_outs, want_grads) = results
    for o, e in zip(outs, want_outs):
        assert o.shape == e.shape and torch.allclose(o, e, atol=1e-5, rtol=1e-5)
    for g, e in zip(grads, want_grads):
        assert (g is None) == (e is None)
        if g is not None:
            assert torch.allclose(g, e, atol=1e-4, rtol=1e-4)


@needs_native
def test_pools_break_ties_like_max_pool_and_propagate_nan(torch_path):
    """Tied maxima (zeros after a ReLU are common) send the gradient to the first one, as
    max_pool2d does; a NaN wins its row and column."""
    x = torch.zeros(2, 3, 4, 8)
    x[0, 1, 2, 5] = float("nan")
    x = x.requires_grad_()
    weight = torch.eye(8)
    got = []
    for switch in (lambda: None, torch_path):
        switch()
        _, rows, cols = MatmulAndMaxPools.apply(x, weight, (2,), (1,))
        got.append((rows, cols, torch.autograd.grad(rows.sum() + 2 * cols.sum(), x)[0]))
    (rows, cols, grad), (want_rows, want_cols, want_grad) = got
    assert torch.isnan(rows[0, 1, 5]) and torch.isnan(cols[0, 2, 5])
    assert torch.equal(rows.nan_to_num(), want_rows.nan_to_num()) and torch.equal(cols.nan_to_num(), want_cols.nan_to_num())
    assert torch.equal(grad, want_grad)
    assert grad[1, 0, 0].eq(3).all() and grad[1].sum() == 3 * 8 + 4 * 8 * 2  # first entry of each row and column


@needs_native
@pytest.mark.parametrize("seed", range(6))
def test_batchnorm_relu_matches_torch_and_float64(seed, torch_path):
    """Values, input/affine gradients and running statistics over two steps (momentum 0.1 and the
    cumulative average), against PyTorch's float32 path and a float64 reference."""
    gen = torch.Generator().manual_seed(seed)
    n, c = int(torch.randint(2, 3000, (1,), generator=gen)), 8 * int(torch.randint(1, 8, (1,), generator=gen))
    momentum = None if seed % 2 else 0.1
    bn = torch.nn.BatchNorm1d(c, momentum=momentum)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 2, generator=gen)
        bn.bias.uniform_(-1, 1, generator=gen)
    module = WSBatchNorm(1, c, relu=True)
    module.weight_norms[0] = bn
    runs = {}
    for name, dtype, switch in (("native", torch.float32, lambda: None), ("torch", torch.float32, torch_path),
                                ("float64", torch.float64, lambda: None)):
        switch()
        mod = copy.deepcopy(module).to(dtype)
        outs, grads = [], []
        for step in range(2):
            y = (3 * torch.randn(n, c, generator=torch.Generator().manual_seed(step)) + 5).to(dtype).requires_grad_()
            assert native_applies(mod.weight_norms[0], y) == (name == "native")
            z = mod._norm(mod.weight_norms[0], y)
            gz = torch.randn(n, c, generator=torch.Generator().manual_seed(10 + step)).to(dtype)
            grads.append(torch.autograd.grad((z * gz).sum(), [y, *mod.weight_norms[0].parameters()]))
            outs.append(z)
        runs[name] = (outs, grads, mod.weight_norms[0].state_dict())
    exact = runs["float64"]
    for name in ("native", "torch"):
        outs, grads, state = runs[name]
        for o, e in zip(outs, exact[0]):
            assert torch.allclose(o.double(), e, atol=1e-5, rtol=1e-5)
        for gs, es in zip(grads, exact[1]):
            for g, e in zip(gs, es):
                assert (g.double() - e).abs().max() <= 1e-4 * e.abs().max()
        for key, value in state.items():
            assert torch.allclose(value.double(), exact[2][key].double(), atol=1e-5, rtol=1e-5), key


@needs_native
def test_batchnorm_relu_native_path_only_in_training_with_what_it_takes():
    bn = torch.nn.BatchNorm1d(16)
    assert native_applies(bn, torch.randn(10, 16))
    assert not native_applies(bn, torch.randn(1, 16))  # one row: handled by WSBatchNorm itself
    assert not native_applies(bn, torch.randn(10, 16, dtype=torch.float64).float()[:, :12])  # 12 channels
    assert not native_applies(bn.double(), torch.randn(10, 16, dtype=torch.float64))
    bn.float().eval()
    assert not native_applies(bn, torch.randn(10, 16))  # running statistics: PyTorch's kernel


@needs_native
@pytest.mark.parametrize("kind", ["invariant", "equivariant"])
def test_whole_models_match_the_torch_path(kind, torch_path):
    """A training step of a float32 DWSNet with 8/16 channels: outputs and every parameter's
    gradient agree with the PyTorch path, and the native kernels were actually used."""
    widths = (3, 8, 6, 5, 2)
    torch.manual_seed(0)
    model = (DWSNetInvariant(widths, 4, hidden_channels=[8, 16, 8], num_layers=3) if kind == "invariant"
             else DWSNetEquivariant(widths, hidden_channels=16, num_layers=3, bn=True))
    ws = random_ws(widths, batch=5, channels=1, dtype=torch.float32, seed=3)
    calls = []
    real_pools_product = native.pools_product
    results = []
    for switch in (lambda: None, torch_path):
        switch()
        mod = copy.deepcopy(model)
        native.pools_product = lambda *a, **k: calls.append(1) or real_pools_product(*a, **k)
        try:
            out = mod(ws)
        finally:
            native.pools_product = real_pools_product
        flat = out.flatten() if kind == "equivariant" else out
        loss = (flat * torch.linspace(-1, 1, flat.numel()).reshape(flat.shape)).sum()
        results.append((flat, torch.autograd.grad(loss, list(mod.parameters()))))
    assert calls  # the first run went through the native product
    (out, grads), (want, want_grads) = results
    assert torch.allclose(out, want, atol=1e-4, rtol=1e-4)
    for g, e in zip(grads, want_grads):
        assert torch.allclose(g, e, atol=1e-4, rtol=1e-3)


def test_float64_and_odd_channel_counts_take_the_torch_path():
    x = torch.randn(2, 3, 3, 8, dtype=torch.float64)
    assert not _native_applies(x, torch.randn(8, 8, dtype=torch.float64), [(1,), (2,)])
    assert not _native_applies(torch.randn(2, 3, 3, 6), torch.randn(6, 8), [(1,), (2,)])
    assert not _native_applies(torch.randn(2, 3, 3, 8), torch.randn(8, 8), [(1, 2)])


def test_switched_off_by_the_environment(tmp_path):
    code = "from dws.nn import native; print('LOADED' if native.library() is not None else 'NONE')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "ZOO_CACHE_DIR": str(tmp_path), "ZOO_NATIVE": "0"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "NONE" and not list(tmp_path.glob("**/*.so"))
