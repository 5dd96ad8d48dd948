"""dws/ops/linear.py: the linear map of feature tensors as a 1x1 convolution equals ``F.linear`` (values
and gradients of input, weight and bias) on random shapes, in float64 (the convolution's formula, at
float64 rounding) and float32 (the route the models take, oneDNN's kernel); the route is taken exactly
where the module says; ``Linear`` is an ``nn.Linear``; ``torch.compile`` traces it in one graph."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

import dws.ops.linear
from dws.ops.linear import NODE_CONVOLUTION, Linear, as_convolution, by_convolution, linear, node_convolution

ONEDNN = torch.backends.mkldnn.is_available()


def convolved(y: torch.Tensor) -> bool:
    """Whether ``y`` came from a convolution (its autograd node, or one of the views taken of it)."""
    node = y.grad_fn
    while node is not None and "Convolution" not in type(node).__name__:
        node = node.next_functions[0][0] if node.next_functions else None
    return node is not None


def random_case(seed: int, dtype: torch.dtype, bias: bool):
    """A random ``[B, n_out, n_in, d]`` or ``[B, n, d]`` input (sometimes a transposed view, as the
    relational attention reads forward edges), weight ``[d_out, d]``, bias and output cotangent."""
    gen = torch.Generator().manual_seed(seed)
    dims = 3 + seed % 2
    shape = [int(s) for s in torch.randint(1, 9, (dims,), generator=gen)]
    d_out = int(torch.randint(1, 20, (1,), generator=gen))
    x = torch.randn(shape, dtype=dtype, generator=gen)
    if dims == 4 and seed % 4 == 1:
        x = x.transpose(1, 2)
    weight = torch.randn(d_out, shape[-1], dtype=dtype, generator=gen)
    b = torch.randn(d_out, dtype=dtype, generator=gen) if bias else None
    cot = torch.randn(*x.shape[:-1], d_out, dtype=dtype, generator=gen)
    return [t.requires_grad_() if t is not None else None for t in (x, weight, b)], cot


def assert_equals_f_linear(f, seed, dtype, bias, tol):
    (x, weight, b), cot = random_case(seed, dtype, bias)
    assert_same_map(f, x, weight, b, cot, tol)


def assert_same_map(f, x, weight, b, cot, tol):
    """``f(x, weight, b)`` and ``F.linear``: the same values, and gradients of ``cot`` w.r.t. every input."""
    got, want = f(x, weight, b), F.linear(x, weight, b)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    inputs = [t for t in (x, weight, b) if t is not None]
    for g, r in zip(torch.autograd.grad(got, inputs, cot), torch.autograd.grad(want, inputs, cot), strict=True):
        torch.testing.assert_close(g, r, rtol=tol, atol=tol)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("seed", range(8))
def test_the_convolution_is_f_linear_in_float64(seed, bias):
    assert_equals_f_linear(by_convolution, seed, torch.float64, bias, tol=1e-12)


@pytest.mark.skipif(not ONEDNN, reason="no oneDNN in this PyTorch")
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("seed", range(8))
def test_the_float32_route_is_f_linear(seed, bias, monkeypatch):
    monkeypatch.setattr(dws.ops.linear, "MIN_ROWS", 1)  # every random shape takes the convolution
    monkeypatch.setattr(dws.ops.linear, "NODE_CONVOLUTION", True)  # node features too, on any CPU
    (x, _, _), _ = random_case(seed, torch.float32, bias)
    assert as_convolution(x)
    assert convolved(linear(x, torch.randn(3, x.shape[-1])))
    assert_equals_f_linear(linear, seed, torch.float32, bias, tol=1e-5)


@pytest.mark.parametrize("shape, dtype, expected", [
    ((64, 32, 32, 8), torch.float32, True),  # a layer pair's edges
    ((64, 32, 8), torch.float32, "nodes"),  # a layer's nodes, 2,048 rows: on a CPU with AVX-512
    ((4, 16, 8), torch.float32, False),  # 64 rows: F.linear
    ((64, 32, 32, 8), torch.float64, False),  # float64: F.linear
    ((2048, 8), torch.float32, False),  # 2 axes: F.linear
    ((2, 32, 32, 32, 8), torch.float32, False),  # 5 axes: F.linear
])
def test_the_route_is_taken_where_the_module_says(shape, dtype, expected):
    expected = NODE_CONVOLUTION if expected == "nodes" else expected
    x = torch.zeros(shape, dtype=dtype)
    assert as_convolution(x) == (expected and ONEDNN)
    y = linear(x.requires_grad_(), torch.ones(3, shape[-1], dtype=dtype))
    assert convolved(y) == (expected and ONEDNN)
    assert y.shape == (*shape[:-1], 3)


def test_node_features_are_convolved_on_a_cpu_with_avx512_only(monkeypatch):
    """On an AVX2 CPU node features take F.linear (their convolution was 0.56x it there), edges still the
    convolution; with AVX-512, or flags unknown, both take it."""
    assert node_convolution({"avx2", "fma", "avx512f", "avx512bw"}) and node_convolution(set())
    assert not node_convolution({"avx2", "fma"})
    monkeypatch.setattr(dws.ops.linear, "NODE_CONVOLUTION", False)
    nodes, edges = torch.zeros(64, 32, 8), torch.zeros(64, 32, 32, 8)
    assert not as_convolution(nodes) and as_convolution(edges) == ONEDNN
    assert not convolved(linear(nodes.requires_grad_(), torch.ones(3, 8)))
    monkeypatch.setattr(dws.ops.linear, "NODE_CONVOLUTION", True)
    assert as_convolution(nodes) == ONEDNN


def test_linear_is_an_nn_linear_with_its_parameters_and_state_dict():
    torch.manual_seed(0)
    a = torch.nn.Linear(6, 4)
    torch.manual_seed(0)
    b = Linear(6, 4)
    assert isinstance(b, torch.nn.Linear) and a.state_dict().keys() == b.state_dict().keys()
    for k in a.state_dict():
        assert torch.equal(a.state_dict()[k], b.state_dict()[k])
    x = torch.randn(64, 20, 6)
    torch.testing.assert_close(b(x), a(x), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.skipif(not ONEDNN, reason="no oneDNN in this PyTorch")
@pytest.mark.parametrize("batch", [64, 4])  # 4: folded (the thread count is not read while tracing)
def test_torch_compile_traces_the_route_without_a_graph_break(batch):
    lin = Linear(8, 5)
    x = torch.randn(batch, 32, 32, 8)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(lin)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


def slow_kernel_calls(f) -> int:
    """How many times PyTorch's reference convolution kernel (``slow_conv2d``, not oneDNN's) ran in ``f()``."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        f()
    return sum(e.count for e in prof.key_averages() if "slow_conv2d" in e.key)


@pytest.mark.skipif(not ONEDNN, reason="no oneDNN in this PyTorch")
@pytest.mark.parametrize("batch", [1, 4, 15])
def test_a_small_batch_of_edges_reaches_onednn_on_one_thread(batch, monkeypatch):
    """Edges of fewer than 16 networks on one thread: PyTorch's own choice is its reference kernel (the
    control, with the fold off); folded, the convolution and its backward run in oneDNN, values unchanged."""
    x = torch.randn(batch, 32, 40, 8, requires_grad=True)
    weight = torch.randn(6, 8, requires_grad=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert as_convolution(x)
        with monkeypatch.context() as off:
            off.setattr(dws.ops.linear, "FEW_IMAGES", 0)
            if slow_kernel_calls(lambda: linear(x, weight).sum().backward()) == 0:
                pytest.skip("this PyTorch gives a few images to oneDNN itself")
        assert slow_kernel_calls(lambda: linear(x, weight).sum().backward()) == 0
        assert_equals_f_linear_on(x.detach(), weight.detach(), tol=1e-4)  # sums over ~19,000 rows in float32
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(3, 8, 5, 4), (1, 16, 5, 4), (1, 15, 5, 4), (2, 40, 7, 3), (16, 2, 5, 4)])
def test_folding_the_batch_is_f_linear(shape, threads):
    """The folded route (and the unfolded one, at two threads or enough images) in float64: F.linear's
    values and gradients; a transposed view too."""
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, dtype=torch.float64, generator=gen)
    weight = torch.randn(5, shape[-1], dtype=torch.float64, generator=gen)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert dws.ops.linear.few_images(x) == (threads == 1 and shape[0] < 16 <= shape[0] * shape[1])
        assert_equals_f_linear_on(x, weight, tol=1e-12)
        assert_equals_f_linear_on(x.transpose(1, 2), weight, tol=1e-12)
    finally:
        torch.set_num_threads(before)


def assert_equals_f_linear_on(x, weight, tol):
    """``by_convolution`` of ``x`` (any layout) is ``F.linear``, with a random bias and cotangent."""
    x, weight = x.clone().requires_grad_(), weight.clone().requires_grad_()
    bias = torch.randn(weight.shape[0], dtype=x.dtype, requires_grad=True)
    assert_same_map(by_convolution, x, weight, bias, torch.randn(*x.shape[:-1], weight.shape[0], dtype=x.dtype), tol)
