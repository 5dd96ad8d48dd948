"""The native DWS kernels (dws/nn/fast/kernels.c) against the PyTorch path they replace: the hidden
weight's product + max pools node, batch norm + ReLU, and whole accelerated models, on random shapes."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
import torch.nn.utils.prune
import torch

from dws import DWSNetEquivariant, DWSNetInvariant, WeightSpace
from dws.nn import WSBatchNorm
from dws.nn.fast import accelerate, native
from dws.nn.fast.bn_relu import BatchNormReLUProduct, bn_relu_train, native_applies
from dws.nn.fast.identity import MatmulAndMaxPools
from dws.nn.fast.native_pools import applies as _native_applies
from dws.nn.fast.pending import PendingSum
from dws.nn.fast.stack import FusedStack
from dws_helpers import random_ws

needs_native = pytest.mark.skipif(native.library() is None, reason="native DWS kernels not buildable here")


@pytest.fixture
def torch_path(monkeypatch):
    """Call inside a test to switch the native kernels off (the accelerator's PyTorch path, as for
    tensors the kernels do not take) from then on."""
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
        outs = MatmulAndMaxPools.apply(x, weight, True, *dims)
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
        _, rows, cols = MatmulAndMaxPools.apply(x, weight, True, (2,), (1,))
        got.append((rows, cols, torch.autograd.grad(rows.sum() + 2 * cols.sum(), x)[0]))
    (rows, cols, grad), (want_rows, want_cols, want_grad) = got
    assert torch.isnan(rows[0, 1, 5]) and torch.isnan(cols[0, 2, 5])
    assert torch.equal(rows.nan_to_num(), want_rows.nan_to_num())
    assert torch.equal(cols.nan_to_num(), want_cols.nan_to_num())
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
    accelerate(module, "native")
    runs = {}
    for name, dtype, switch in (("native", torch.float32, lambda: None), ("torch", torch.float32, torch_path),
                                ("float64", torch.float64, lambda: None)):
        switch()
        mod = copy.deepcopy(module).to(dtype)
        outs, grads = [], []
        for step in range(2):
            y = (3 * torch.randn(n, c, generator=torch.Generator().manual_seed(step)) + 5).to(dtype).requires_grad_()
            assert native_applies(mod.weight_norms[0], y) == (name == "native")
            z = mod.normalize(mod.weight_norms[0], y)
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


def _counting(monkeypatch, names):
    """Count the calls of the native wrappers ``names`` (dict name -> count)."""
    calls = dict.fromkeys(names, 0)
    for name in names:
        real = getattr(native, name)

        def counted(*a, _real=real, _name=name, **k):
            calls[_name] += 1
            return _real(*a, **k)
        monkeypatch.setattr(native, name, counted)
    return calls


@needs_native
@pytest.mark.parametrize("blocks", ["all", "W2W+B2B", "W2W", "diagonal"])
@pytest.mark.parametrize("seed", range(6))
def test_whole_models_match_the_torch_path(seed, blocks, torch_path, monkeypatch):
    """Two training steps of float32 DWSNets (invariant and equivariant with batch norm) on random
    architectures with M = 3..5, channel counts multiples of 8, and the ablations: outputs, every
    parameter's gradient and the running statistics agree with the PyTorch path, and (with all
    blocks) every native kernel, the fused batch norm + next product among them, was used."""
    gen = torch.Generator().manual_seed(seed)
    depth = 3 + seed % 3
    widths = tuple(int(d) for d in torch.randint(1, 7, (depth + 1,), generator=gen))
    channels = [8 * int(c) for c in torch.randint(1, 3, (3,), generator=gen)]
    torch.manual_seed(seed)
    model = (DWSNetInvariant(widths, 4, hidden_channels=channels, num_layers=3, blocks=blocks) if seed % 2 == 0
             else DWSNetEquivariant(widths, hidden_channels=channels[:2], num_layers=3, bn=True, blocks=blocks))
    accelerate(model, "native")
    calls = _counting(monkeypatch, ["pools_product", "bn_relu", "bn_relu_product"] if blocks == "all" else [])
    results = []
    for switch in (lambda: None, torch_path):
        switch()
        mod = copy.deepcopy(model)
        outs, grads = [], []
        for step in range(2):
            ws = random_ws(widths, batch=3 + step, channels=1, dtype=torch.float32, seed=10 * seed + step)
            out = mod(ws)
            flat = out if isinstance(out, torch.Tensor) else out.flatten()
            loss = (flat * torch.linspace(-1, 1, flat.numel()).reshape(flat.shape)).sum()
            grads.append(torch.autograd.grad(loss, list(mod.parameters()), allow_unused=True))  # (ablations)
            outs.append(flat)
        results.append((outs, grads, mod.state_dict()))
        if switch is not torch_path:
            assert all(calls.values()), calls  # every native path ran in the first model
    (outs, grads, state), (want_outs, want_grads, want_state) = results
    for o, e in zip(outs, want_outs):
        assert torch.allclose(o, e, atol=1e-4, rtol=1e-4)
    for gs, es in zip(grads, want_grads):
        for g, e in zip(gs, es):
            assert (g is None) == (e is None)
            assert g is None or torch.allclose(g, e, atol=1e-4, rtol=1e-3)
    for key in state:
        assert torch.allclose(state[key].float(), want_state[key].float(), atol=1e-5, rtol=1e-4), key


@pytest.mark.parametrize("seed", range(4))
def test_pending_sum_splits_terms_into_row_and_column(seed):
    """Terms broadcasting over W (row), over H (column), over both or over the batch are summed
    into one row and one column term with the same total; other shapes are refused."""
    gen = torch.Generator().manual_seed(seed)
    B, H, W, C = (int(s) for s in torch.randint(2, 6, (4,), generator=gen))
    shapes = [(B, H, 1, C), (B, 1, W, C), (B, 1, 1, C), (1, 1, C), (1, H, 1, C), (1, 1, W, C)]
    terms = [torch.randn(shapes[k], generator=gen) for k in torch.randperm(6, generator=gen)[: 2 + seed]]
    full = torch.randn(B, H, W, C, generator=gen)
    pending = PendingSum(full.clone(), terms)
    row, col = pending.row_and_column()
    split = full + (0 if row is None else row[:, :, None]) + (0 if col is None else col[:, None])
    assert torch.allclose(split, pending.resolve(), atol=1e-6)
    assert all(t is None or t.is_contiguous() for t in (row, col))
    assert PendingSum(full, [torch.randn(B, H, W, C)]).row_and_column() is None  # a full-size term
    assert PendingSum(full, [torch.randn(2 * B, 1, 1, C)[:B].expand(B, H, 1, C)[:, :1]]).row_and_column() is not None
    assert PendingSum(full[0], [torch.randn(1, C)]).row_and_column() is None  # not [B, H, W, C]


@needs_native
@pytest.mark.parametrize("seed", range(4))
def test_batchnorm_relu_adds_broadcast_terms_on_the_fly(seed, torch_path):
    """``relu(bn(y + row + col))`` with the terms added in the kernel: values, gradients of y, of
    both terms and of the affine parameters, and running statistics, against adding them first."""
    gen = torch.Generator().manual_seed(seed)
    B, H, W = (int(s) for s in torch.randint(1, 9, (3,), generator=gen))
    C = 8 * int(torch.randint(1, 4, (1,), generator=gen))
    y = torch.randn(B, H, W, C, generator=gen).requires_grad_()
    row = None if seed == 1 else (torch.randn(B, H, C, generator=gen) + 2).requires_grad_()
    col = None if seed == 2 else torch.randn(B, W, C, generator=gen).requires_grad_()
    bn = torch.nn.BatchNorm1d(C)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 2, generator=gen)
        bn.bias.uniform_(-0.5, 0.5, generator=gen)
    cot = torch.randn(B, H, W, C, generator=gen)
    inputs = [t for t in (y, row, col) if t is not None]
    results = []
    for fused in (True, False):
        mod = copy.deepcopy(bn)
        if fused:
            assert native_applies(mod, y, row, col)
            z = bn_relu_train(mod, y, row, col)
        else:
            v = y + (0 if row is None else row[:, :, None]) + (0 if col is None else col[:, None])
            z = torch.relu(mod(v.reshape(-1, C))).reshape(v.shape)
        results.append((z, torch.autograd.grad((z * cot).sum(), inputs + list(mod.parameters())), mod.state_dict()))
    (z, grads, state), (want, want_grads, want_state) = results
    assert torch.allclose(z, want, atol=1e-5)
    for g, e in zip(grads, want_grads):
        assert torch.allclose(g, e, atol=1e-4, rtol=1e-4)
    for key in state:
        assert torch.allclose(state[key].float(), want_state[key].float(), atol=1e-6), key


@needs_native
@pytest.mark.parametrize("seed", range(6))
def test_batchnorm_relu_product_node_matches_its_parts(seed, torch_path):
    """The fused node (batch norm + ReLU, then the next layer's product and pools of the result,
    never materialized) against batch norm + ReLU followed by the PyTorch path's product-and-pools
    node: every output, every input's gradient (with some outputs unused), running statistics."""
    gen = torch.Generator().manual_seed(seed)
    B, H, W = (int(s) for s in torch.randint(1, 10, (3,), generator=gen))
    ci, co = (8 * int(s) for s in torch.randint(1, 4, (2,), generator=gen))
    dims = [[(1,), (2,)], [(2,), (1,)], [(1,)], [(2,)]][seed % 4]
    y = torch.randn(B, H, W, ci, generator=gen).requires_grad_()
    row = torch.randn(B, H, ci, generator=gen).requires_grad_()
    col = None if seed == 3 else torch.randn(B, W, ci, generator=gen).requires_grad_()
    weight = torch.randn(ci, co, generator=gen).requires_grad_()
    bn = torch.nn.BatchNorm1d(ci)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 2, generator=gen)
        bn.bias.uniform_(-0.5, 0.5, generator=gen)
    used = [[0, 1, 2], [1, 2], [0], [0, 1]][seed % 4][: 1 + len(dims)]
    inputs = [t for t in (y, row, col, weight) if t is not None]
    results = []
    for fused in (True, False):
        mod = copy.deepcopy(bn)
        if fused:
            outs = BatchNormReLUProduct.apply(y, row, col, mod.weight, mod.bias, weight, mod.eps,
                                              (mod.running_mean, mod.running_var, 0.1), *dims)
        else:
            torch_path()
            v = y + row[:, :, None] + (0 if col is None else col[:, None])
            z = torch.relu(mod(v.reshape(-1, ci))).reshape(v.shape)
            outs = MatmulAndMaxPools.apply(z, weight, True, *dims)
        cots = [torch.randn(o.shape, generator=torch.Generator().manual_seed(k)) if k in used else None
                for k, o in enumerate(outs)]
        grads = _grads(outs, cots, inputs + [mod.weight, mod.bias])
        results.append((outs, grads, (mod.running_mean, mod.running_var)))
    (outs, grads, running), (want_outs, want_grads, want_running) = results
    for o, e in zip(outs, want_outs):
        assert torch.allclose(o, e, atol=1e-4, rtol=1e-4)
    for g, e in zip(grads, want_grads):
        assert (g is None) == (e is None)
        if g is not None:
            assert torch.allclose(g, e, atol=1e-3, rtol=1e-3)
    for r, e in zip(running, want_running):
        assert torch.allclose(r, e, atol=1e-6)


@needs_native
def test_equivariant_stack_keeps_the_sequential_state_dict():
    """Checkpoints of plain models (an ``nn.Sequential``) load into the fused stack."""
    model = accelerate(DWSNetInvariant((2, 4, 4, 1), 3, hidden_channels=8, num_layers=2), "native")
    assert isinstance(model.encoder, FusedStack)
    plain = torch.nn.Sequential(*model.encoder)
    assert list(plain.state_dict()) == list(model.encoder.state_dict())
    model.encoder.load_state_dict(plain.state_dict())


def test_float64_and_odd_channel_counts_take_the_torch_path():
    x = torch.randn(2, 3, 3, 8, dtype=torch.float64)
    assert not _native_applies(x, torch.randn(8, 8, dtype=torch.float64), [(1,), (2,)])
    assert not _native_applies(torch.randn(2, 3, 3, 6), torch.randn(6, 8), [(1,), (2,)])
    assert not _native_applies(torch.randn(2, 3, 3, 8), torch.randn(8, 8), [(1, 2)])


def test_switched_off_by_the_environment(tmp_path):
    code = "from dws.nn.fast import native; print('LOADED' if native.library() is not None else 'NONE')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "ZOO_CACHE_DIR": str(tmp_path), "ZOO_NATIVE": "0"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "NONE" and not list(tmp_path.glob("**/*.so"))


@needs_native
def test_double_backward_is_refused_clearly():
    """The kernels' gradients are not themselves differentiable: asking for a second derivative
    raises instead of silently returning one without the kernels' part."""
    x = torch.randn(2, 3, 4, 8, requires_grad=True)
    _, rows, cols = MatmulAndMaxPools.apply(x, torch.randn(8, 8), True, (2,), (1,))
    with pytest.raises(RuntimeError, match="ZOO_NATIVE=0"):
        torch.autograd.grad((rows ** 2).sum() + cols.sum(), x, create_graph=True)
    y = torch.randn(6, 8, requires_grad=True)
    (grad,) = torch.autograd.grad(bn_relu_train(torch.nn.BatchNorm1d(8), y).pow(2).sum(), y, create_graph=True)
    with pytest.raises(RuntimeError):
        grad.sum().backward()


@needs_native
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_and_inf_propagate_as_in_pytorch(bad, torch_path):
    """A non-finite entry makes batch norm's outputs and running statistics of its channel NaN, as
    PyTorch's do (instead of a ReLU quietly turning it into zeros), through the plain node, the
    fused node and a whole model."""
    x = torch.randn(6, 8)
    x[0, 0] = bad
    bn = torch.nn.BatchNorm1d(8)
    out = bn_relu_train(bn, x.clone().requires_grad_())
    assert out[:, 0].isnan().all() and out[:, 1:].isfinite().all()
    assert bn.running_mean[0].isnan() and bn.running_var[0].isnan()
    widths = (2, 8, 8, 1)
    ws = WeightSpace.unflatten(torch.randn(3, 2 * 8 + 8 * 8 + 8 + 8 + 8 + 1), widths)
    ws.weights[1][1, 2, 3] = bad
    results = []
    for switch in (lambda: None, torch_path):
        switch()
        torch.manual_seed(0)
        out = accelerate(DWSNetInvariant(widths, 3, hidden_channels=16, num_layers=2), "native")(ws)
        results.append(out.isnan())
    assert results[0].all() and torch.equal(results[0], results[1])


@needs_native
def test_hooked_or_subclassed_modules_are_called(monkeypatch):
    """Forward hooks, pre-hooks (pruning's) and subclasses of the modules a fused path would bypass
    make it call them instead, as an ``nn.Sequential`` would."""
    widths = (2, 8, 8, 1)
    ws = WeightSpace.unflatten(torch.randn(4, 2 * 8 + 8 * 8 + 8 + 8 + 8 + 1), widths)
    torch.manual_seed(0)
    model = accelerate(DWSNetInvariant(widths, 3, hidden_channels=16, num_layers=3), "native")
    calls = []
    for module in (model.encoder[0], model.encoder[1], model.encoder[1].weight_norms[1]):
        module.register_forward_hook(lambda *args: calls.append(1))
    model(ws)
    assert len(calls) == 3  # each hooked module ran exactly once
    pruned = copy.deepcopy(model)
    torch.nn.utils.prune.l1_unstructured(pruned.encoder[3].weight_norms[1], "weight", amount=0.5)
    opt = torch.optim.SGD(pruned.parameters(), lr=0.1)
    for _ in range(2):  # the pre-hook recomputes the pruned weight every call
        opt.zero_grad()
        pruned(ws).square().sum().backward()
        opt.step()

    class ScaledBatchNorm(torch.nn.BatchNorm1d):
        def forward(self, x):
            return 2 * super().forward(x)

    scaled = copy.deepcopy(model)
    scaled.encoder[1].weight_norms[1] = ScaledBatchNorm(16)
    reference = copy.deepcopy(scaled)
    got = scaled(ws)
    monkeypatch.setattr(native, "usable", lambda *tensors, channels: False)
    assert torch.allclose(got, reference(ws), atol=1e-4, rtol=1e-4)  # the subclass's forward ran
