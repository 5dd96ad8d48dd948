"""The accelerator (dws/nn/fast): applying it, what it leaves unchanged (parameters, state dict,
function), its PyTorch autograd nodes, its capability checks, and that plain ``dws.nn`` never
reaches it. The native kernels against the PyTorch path: ``test_dws_native.py``."""

from __future__ import annotations

import ast
import copy
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dws import DWSLayer, DWSNetEquivariant, DWSNetInvariant
from dws.nn import DWSInvariantLayer, WSBatchNorm, fast
from dws.nn.fast import batchnorm as fast_batchnorm
from dws.nn.fast import guard, matmul, native
from dws.nn.fast.batchnorm import FusedBatchNorm
from dws.nn.fast.identity import MatmulAndMaxPools
from dws.nn.fast.layer import FusedDWSLayer, LayerPlan
from dws.nn.fast.pools import MaxOverDims
from dws.nn.fast.stack import FusedStack
from dws_helpers import random_widths, random_ws

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = ("all", "W2W", "B2B", "W2W+B2B", "diagonal")
needs_native = pytest.mark.skipif(native.library() is None, reason="native DWS kernels not buildable here")


def _model(seed: int, kind: str, bn: bool, blocks: str, channels: list[int], dtype=torch.float32):
    widths = random_widths(seed, min_layers=2, max_layers=5, max_width=5)
    torch.manual_seed(seed)
    if kind == "invariant":
        model = DWSNetInvariant(widths, 3, hidden_channels=channels, num_layers=len(channels), bn=bn, blocks=blocks,
                                dropout=0.0)
    else:
        model = DWSNetEquivariant(widths, hidden_channels=channels[:-1], num_layers=len(channels), bn=bn,
                                  blocks=blocks, output_init_scale=1.0)
    return model.to(dtype), widths


def _two_steps(model, widths, dtype, seed: int):
    """Outputs, every parameter's gradient (None where unused) and the state dict after two
    training-mode forward+backward passes."""
    outs, grads = [], []
    for step in range(2):
        ws = random_ws(widths, batch=3 + step, channels=1, dtype=dtype, seed=10 * seed + step)
        out = model(ws)
        flat = out if isinstance(out, torch.Tensor) else out.flatten()
        loss = (flat * torch.linspace(-1, 1, flat.numel(), dtype=dtype).reshape(flat.shape)).sum()
        grads.append(torch.autograd.grad(loss, list(model.parameters()), allow_unused=True))
        outs.append(flat.detach())
    return outs, grads, model.state_dict()


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("bn", [True, False])
@pytest.mark.parametrize("blocks", BLOCKS)
@pytest.mark.parametrize("seed", range(4))
def test_accelerated_models_compute_the_plain_function(seed, blocks, bn, mode):
    """Random architectures (M = 2..5), every ablation, with and without batch norm, training and
    eval mode, invariant and equivariant: the accelerated model (native kernels in float32 where
    they apply, the PyTorch path in float64) gives the plain model's outputs, gradients and running
    statistics."""
    kind = "invariant" if seed % 2 == 0 else "equivariant"
    for dtype, backend, tol in ((torch.float32, "auto", 1e-4), (torch.float64, "auto", 1e-9),
                                (torch.float32, "pytorch", 1e-4)):
        channels = [8 * random.Random(seed + c).randint(1, 2) for c in range(3)]
        model, widths = _model(seed, kind, bn, blocks, channels, dtype)
        model.train(mode == "train")
        plain = copy.deepcopy(model)
        fast.accelerate(model, backend)
        assert isinstance(model.encoder if kind == "invariant" else model.layers, torch.nn.Sequential)
        got, want = _two_steps(model, widths, dtype, seed), _two_steps(plain, widths, dtype, seed)
        for o, e in zip(got[0], want[0]):
            assert torch.allclose(o, e, atol=tol, rtol=tol)
        for gs, es in zip(got[1], want[1]):
            for g, e in zip(gs, es):
                assert (g is None) == (e is None)
                assert g is None or torch.allclose(g, e, atol=tol, rtol=10 * tol)
        for key in want[2]:
            assert torch.allclose(got[2][key].double(), want[2][key].double(), atol=tol, rtol=tol), key


def test_accelerate_keeps_parameters_state_dict_and_module_objects():
    """The same parameter objects in the same order (an optimizer built before keeps working), the
    same state dict keys and tensors, the same module objects; restore gives the plain classes back."""
    torch.manual_seed(0)
    model = DWSNetInvariant((2, 8, 8, 1), 3, hidden_channels=8, num_layers=2)
    params, modules, keys = list(model.parameters()), list(model.modules()), list(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fast.accelerate(model, "pytorch")
    assert type(model.encoder[0]) is FusedDWSLayer and type(model.encoder) is torch.nn.Sequential  # (pytorch)
    assert [id(p) for p in model.parameters()] == [id(p) for p in params]
    assert [id(m) for m in model.modules()] == [id(m) for m in modules]
    assert list(model.state_dict()) == keys
    before = [p.detach().clone() for p in params]
    model(random_ws((2, 8, 8, 1), batch=4, channels=1, dtype=torch.float32)).square().sum().backward()
    opt.step()
    assert all(not torch.equal(a, p) for a, p in zip(before, params) if p.grad is not None and p.grad.abs().sum() > 0)
    fast.accelerate(model, "auto")  # again, another backend: restored first
    fast.restore(model)
    assert {type(m) for m in model.modules()} == {type(m) for m in modules}
    assert not any(hasattr(m, "use_native") or hasattr(m, "plan") for m in model.modules())


def test_checkpoints_of_the_previous_layout_load():
    """State dict names and shapes as written by the code before the accelerator existed (the model
    was then built with a fusing ``nn.Sequential`` subclass), plain and accelerated."""
    old = [("reduce.inputs.weight", (1, 2)), ("reduce.inputs.bias", (1,)), ("encoder.0.group_weights.0", (4, 8)),
           ("encoder.0.group_weights.1", (3, 6)), ("encoder.0.slot_bias.W1", (1, 1, 2)),
           ("encoder.0.slot_bias.W2", (1, 1, 2)), ("encoder.0.slot_bias.b1", (1, 2)),
           ("encoder.0.slot_bias.b2", (1, 2))]
    old += [(f"encoder.1.{norms}.{k}.{name}", () if name == "num_batches_tracked" else (2,))
            for norms in ("weight_norms", "bias_norms") for k in (0, 1)
            for name in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")]
    old += [("invariant.linear.weight", (4, 8)), ("invariant.linear.bias", (4,)), ("head.1.weight", (3, 4)),
            ("head.1.bias", (3,))]
    for backend in ("plain", "auto"):
        model = fast.accelerate(DWSNetInvariant((2, 3, 1), 3, hidden_channels=2, num_layers=1, input_reduction=1,
                                                head_hidden=4), backend)
        assert [(k, tuple(v.shape)) for k, v in model.state_dict().items()] == old
        checkpoint = {k: torch.randn(shape) if "num_batches" not in k else torch.tensor(3) for k, shape in old}
        model.load_state_dict(checkpoint)
        assert torch.equal(model.encoder[0].group_weights[1], checkpoint["encoder.0.group_weights.1"])


@needs_native
def test_native_backend_swaps_the_stack_and_batch_norm_and_declines_subclasses():
    class MyLayer(DWSLayer):
        pass

    model = DWSNetInvariant((2, 8, 8, 1), 3, hidden_channels=8, num_layers=2)
    model.encoder[2] = MyLayer((2, 8, 8, 1), 8, 8)
    fast.accelerate(model, "native")
    kinds = fast.describe(model)
    assert kinds["encoder"] == "FusedStack (native)" and kinds["encoder.1"] == "FusedBatchNorm (native)"
    assert kinds["encoder.0"] == "FusedDWSLayer (native)" and kinds["invariant"] == "FusedInvariantLayer (native)"
    assert "encoder.2" not in kinds and type(model.encoder[2]) is MyLayer  # a subclass: left alone
    assert type(model.head) is torch.nn.Sequential  # no DWS layer in it
    assert isinstance(model.encoder, FusedStack) and isinstance(model.encoder[1], FusedBatchNorm)


def test_backend_choice_errors_and_the_environment_switch(monkeypatch):
    model = DWSNetInvariant((2, 8, 8, 1), 3, hidden_channels=8, num_layers=2)
    with pytest.raises(ValueError, match="backend"):
        fast.accelerate(model, "cuda")
    monkeypatch.setattr(native, "library", lambda: None)  # what ZOO_NATIVE=0 or no compiler gives
    with pytest.raises(RuntimeError, match="ZOO_NATIVE=0"):
        fast.accelerate(model, "native")
    assert set(fast.describe(fast.accelerate(model, "auto")).values()) == {"FusedDWSLayer (pytorch)",
                                                                          "FusedInvariantLayer (pytorch)"}
    assert fast.describe(fast.accelerate(model, "plain")) == {}


def test_suspended_runs_the_plain_modules_and_reaccelerates():
    model = fast.accelerate(DWSNetInvariant((2, 8, 8, 1), 3, hidden_channels=8, num_layers=2))
    kinds = fast.describe(model)
    with fast.suspended(model) as plain:
        assert plain is model and fast.describe(model) == {}
        assert type(model.encoder[0]) is DWSLayer and type(model.invariant) is DWSInvariantLayer
    assert fast.describe(model) == kinds


def test_second_derivatives_on_the_pytorch_backend():
    """The PyTorch backend's nodes are differentiable twice (gradient penalties), like the plain path."""
    torch.manual_seed(0)
    layer = DWSLayer((2, 3, 4, 1), 2, 2).double()
    ws = random_ws((2, 3, 4, 1), batch=2, channels=2, seed=1).map(lambda t: t.requires_grad_())
    results = []
    for backend in ("pytorch", "plain"):
        fast.accelerate(layer, backend)
        (g,) = torch.autograd.grad(layer(ws).weights[1].square().sum(), ws.weights[1], create_graph=True)
        results.append(torch.autograd.grad(g.square().sum(), list(layer.parameters()), allow_unused=True))
    assert sum(a is not None for a in results[0]) >= 2
    for a, b in zip(*results):
        assert (a is None) == (b is None) and (a is None or torch.allclose(a, b, atol=1e-9))


def test_import_of_dws_nn_loads_no_accelerator_until_applied(tmp_path):
    """``import dws.nn`` (and a plain model's or the block-by-block reference's training step) imports
    nothing of ``dws.nn.fast``, builds and loads no kernels; ``accelerate`` does (where the kernels
    can be built here)."""
    code = """
import sys
import torch
import dws, dws.nn
from dws.nn import DWSNetInvariant
from dws.weightspace import WeightSpace
model = DWSNetInvariant((2, 8, 8, 1), 3, hidden_channels=8, num_layers=2)
ws = WeightSpace.unflatten(torch.randn(4, 16 + 64 + 8 + 8 + 8 + 1), (2, 8, 8, 1))
model(ws).sum().backward()
from dws.nn.reference import with_reference_layers  # the block-by-block reference: plain operators
with_reference_layers(DWSNetInvariant((2, 8, 8, 1), 3, hidden_channels=8, num_layers=2))(ws).sum().backward()
def loaded():
    return sorted(m for m in sys.modules if m.startswith("dws.nn.fast")), "kernels-" in open("/proc/self/maps").read()
print(loaded())
from dws.nn.fast import accelerate, native
accelerate(model)
model(ws).sum().backward()
print((native.library() is not None, loaded()[1]))
"""
    env = {**os.environ, "ZOO_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    before, after = done.stdout.strip().splitlines()
    assert before == "([], False)"
    built = list(tmp_path.glob("native/kernels-*.so"))
    assert after in ("(True, True)", "(False, False)") and bool(built) == (after == "(True, True)")
    if native.library() is not None:  # buildable in this process: the subprocess must have built them
        assert after == "(True, True)"


def _dws_nn_modules() -> dict[str, Path]:
    """``{module name: file}`` for every module of ``dws.nn`` (packages by their own name)."""
    files = (ROOT / "dws" / "nn").rglob("*.py")
    return {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p for p in files}


def _imports(path: Path, modules) -> set[str]:
    """The ``dws.nn`` modules that ``path`` imports: ``from X import Y`` counts ``X.Y`` where that
    is a module, else ``X``."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.update(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                         for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return {n for n in names if n in modules}


def test_plain_modules_never_import_the_accelerator_and_no_import_cycles():
    modules = _dws_nn_modules()
    graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
    plain = [name for name in modules if not name.startswith("dws.nn.fast")]
    assert len(plain) > 10 and len(modules) - len(plain) > 10
    for name in plain:
        assert not any(m.startswith("dws.nn.fast") for m in graph[name]), name
    assert "dws.nn.layer" in graph["dws.nn.fast.layer"]  # (the parse sees imports: the accelerator's of plain rooms)
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        for dep in graph[name]:
            assert dep not in path, f"import cycle: {' -> '.join(path + [dep])}"
            if dep not in done:
                visit(dep, path + [dep])
        done.add(name)

    for name in modules:
        visit(name, [name])


def test_hooks_not_visible_means_nothing_is_fused(monkeypatch):
    """The capability check's fallback: where this PyTorch's hooks cannot be seen, every module is
    called (no fused batch norm or stack fusions) and the function stays the plain one."""
    assert guard.HOOKS_VISIBLE  # this PyTorch: the check passes
    monkeypatch.setattr(guard, "HOOKS_VISIBLE", False)
    torch.manual_seed(0)
    model = DWSNetInvariant((2, 8, 8, 1), 3, hidden_channels=8, num_layers=2)
    plain = copy.deepcopy(model)
    calls = []
    for name in ("bn_relu_train", "bn_relu_product_train"):  # the native batch norm nodes, counted
        real = getattr(fast_batchnorm, name)
        monkeypatch.setattr(fast_batchnorm, name, lambda *a, _real=real, **k: calls.append(1) or _real(*a, **k))
    fast.accelerate(model)
    ws = random_ws((2, 8, 8, 1), batch=4, channels=1, dtype=torch.float32)
    assert torch.allclose(model(ws), plain(ws), atol=1e-5) and not calls
    monkeypatch.setattr(guard, "HOOKS_VISIBLE", True)
    model(ws)
    assert bool(calls) == (native.library() is not None)  # (the same model fuses where hooks are seen)


def test_onednn_capability_check_and_fallback(monkeypatch):
    """A PyTorch without the private oneDNN op, or whose op misbehaves, gets ``torch.matmul``."""
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert matmul._onednn_linear_op() is None
    monkeypatch.undo()

    def wrong(x, w, *args):
        return x @ w.t() + 1

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", wrong, raising=False)
    assert matmul._onednn_linear_op() is None
    monkeypatch.undo()
    monkeypatch.setattr(matmul, "_LINEAR", None)
    x, w = torch.randn(3, 4, 5, requires_grad=True), torch.randn(5, 6)
    y = matmul.mix_channels(x, w, min_rows=0)
    assert "OneDNN" not in type(y.grad_fn).__name__ and torch.allclose(y, x @ w)


@pytest.mark.parametrize("seed", range(6))
def test_shared_max_pool_node_matches_amax(seed):
    """Several single-axis max pools of one tensor in one node: values and input gradient equal
    ``amax``'s (random float64 input, so no ties), for random shapes and axes."""
    gen = torch.Generator().manual_seed(seed)
    shape = [int(s) for s in torch.randint(1, 7, (int(torch.randint(2, 5, (1,), generator=gen)),), generator=gen)]
    x = torch.randn(*shape, dtype=torch.float64, generator=gen, requires_grad=True)
    dims = [(d,) for d in range(1, len(shape)) if torch.rand(1, generator=gen) < 0.7] or [(1,)]
    outs = MaxOverDims.apply(x, True, *dims)
    outs = outs if isinstance(outs, tuple) else (outs,)
    cots = [torch.randn(o.shape, dtype=torch.float64, generator=gen) for o in outs]
    (grad,) = torch.autograd.grad(sum((o * c).sum() for o, c in zip(outs, cots)), x)
    x_ref = x.detach().clone().requires_grad_()
    refs = [x_ref.amax(dim=d) for d in dims]
    (grad_ref,) = torch.autograd.grad(sum((r * c).sum() for r, c in zip(refs, cots)), x_ref)
    for o, r in zip(outs, refs):
        assert torch.equal(o, r)
    assert torch.allclose(grad, grad_ref, atol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_onednn_channel_mix_matches_matmul(seed):
    """The oneDNN route of the channel-mixing matmul (float32 CPU) gives torch.matmul's values and
    gradients for random shapes (forced on by a zero row threshold)."""
    gen = torch.Generator().manual_seed(seed)
    lead = [int(s) for s in torch.randint(1, 9, (int(torch.randint(1, 4, (1,), generator=gen)),), generator=gen)]
    f_in, f_out = (int(s) for s in torch.randint(1, 40, (2,), generator=gen))
    x = torch.randn(*lead, f_in, generator=gen).requires_grad_()
    w = torch.randn(f_in, f_out, generator=gen).requires_grad_()
    cot = torch.randn(*lead, f_out, generator=gen)
    y = matmul.mix_channels(x, w, min_rows=0)
    y_ref = torch.matmul(x, w)
    if matmul._LINEAR is not None:  # PyTorch built with oneDNN (the CPU wheels are)
        assert "OneDNN" in type(y.grad_fn).__name__
    # a fresh tensor, not a view: the DWS layer adds its broadcast terms into it in place
    assert not y._is_view()
    assert torch.allclose(y, y_ref, atol=1e-5, rtol=1e-5)
    grads = torch.autograd.grad((y * cot).sum(), (x, w))
    grads_ref = torch.autograd.grad((y_ref * cot).sum(), (x, w))
    for g, r in zip(grads, grads_ref):
        assert torch.allclose(g, r, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("onednn", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_identity_product_and_max_pools_in_one_node(seed, onednn, monkeypatch):
    """The hidden weight's identity product and its max pools from one autograd node give the
    values and input/weight gradients of a separate matmul and ``amax``es, for random shapes; also
    when only the pools, or only the product, are used (the other gradients are None)."""
    if onednn:
        if matmul._LINEAR is None:
            pytest.skip("PyTorch built without oneDNN")
        monkeypatch.setattr(matmul, "ONEDNN_MIN_ROWS", 0)
    dtype, tol = (torch.float32, 1e-4) if onednn else (torch.float64, 1e-12)
    gen = torch.Generator().manual_seed(seed)
    b, r, c, f_in, f_out = (int(s) for s in torch.randint(1, 9, (5,), generator=gen))
    x = torch.randn(b, r, c, f_in, dtype=dtype, generator=gen, requires_grad=True)
    w = torch.randn(f_in, f_out, dtype=dtype, generator=gen, requires_grad=True)
    dims = [(1,), (2,)]
    outs = MatmulAndMaxPools.apply(x, w, False, *dims)  # (the PyTorch path; native: test_dws_native.py)
    refs = [torch.matmul(x, w)] + [x.amax(dim=d) for d in dims]
    assert not outs[0]._is_view()  # the layer adds its broadcast terms into it in place
    for used in ([0, 1, 2], [1, 2], [0]):
        cots = [torch.randn(refs[k].shape, dtype=dtype, generator=gen) for k in used]
        got = torch.autograd.grad(sum((outs[k] * ct).sum() for k, ct in zip(used, cots)), (x, w),
                                  retain_graph=True, allow_unused=True)
        want = torch.autograd.grad(sum((refs[k] * ct).sum() for k, ct in zip(used, cots)), (x, w),
                                   retain_graph=True, allow_unused=True)
        for g, r_ in zip(got, want):
            assert (g is None) == (r_ is None)
            if g is not None:
                assert torch.allclose(g, r_, atol=tol, rtol=tol)
    for o, r_ in zip(outs, refs):
        assert torch.allclose(o, r_, atol=tol, rtol=tol)


@pytest.mark.parametrize("depth", [3, 4, 5])
def test_hidden_weights_share_one_node_for_product_and_pools(depth):
    """For every weight between two hidden layers, the layer takes the identity product and the
    row and column max pools from one node, so their gradients meet in one buffer (and with mean
    pooling, which has no argmax to scatter, it does not)."""
    widths = (2,) + (4,) * (depth - 1) + (1,)
    for pool, expected in (("max", depth - 2), ("mean", 0)):
        plan = LayerPlan.of(DWSLayer(widths, 3, 5, pool=pool))
        assert len(plan.identity) == expected
        assert all(s.kind == "weight" and len(s.set_axes) == 2 for s in plan.identity.values())


def test_batchnorm_module_is_not_swapped_without_the_native_kernels():
    """On the PyTorch backend the plain batch norm already is PyTorch's kernel + an in-place ReLU."""
    bn = WSBatchNorm(3, 8, relu=True)
    assert type(fast.accelerate(bn, "pytorch")) is WSBatchNorm
