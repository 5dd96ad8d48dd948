"""The neural graphs' faster forms (issue 32) compute what the straightforward formulation computes:
the same outputs and the same gradients (float64, random architectures and batches), against
reference forms written here as the papers write them: PNA's aggregators with autograd's own
backwards, the graph construction with one linear map per direction, a PNA layer with per-edge
messages, and the relational attention's dense formula."""

from __future__ import annotations

import math

import pytest
import torch

from dws.ng import LayeredGraph, NGGNN, NGTransformer
from dws.ng.aggregation import SCALERS, aggregate
from dws.ng.construct import GraphConstructor
from dws.ng.pna import PNAConv
from dws.ng.relational import RelationalAttention
import dws.ops.linear
from benchmark_helpers import load_benchmark
from test_graph_speedup import dense_attention, random_graph
from test_nfn import random_space, random_widths


def reference_aggregate(messages: torch.Tensor, delta: float, scalers=("identity", "amplification")) -> torch.Tensor:
    """PNA's aggregation as PyG writes it: mean, min, max, std of the neighbours, times each scaler; the
    extrema as ``torch.min``/``torch.max`` over the axis, whose gradient goes to the returned index (the
    first of tied neighbours), as torch-scatter's ``scatter_min``/``scatter_max`` route it."""
    k = messages.shape[2]
    mean = messages.mean(dim=2)
    std = ((messages * messages).mean(dim=2) - mean * mean).clamp(min=1e-5).sqrt()
    stats = torch.cat([mean, messages.min(dim=2).values, messages.max(dim=2).values, std], dim=-1)
    return torch.cat([stats * (math.log(k + 1) / delta) ** SCALERS[s] for s in scalers], dim=-1)


def grads_of(outputs, inputs, gen):
    """The gradients of a random linear function of ``outputs`` with respect to ``inputs``."""
    outputs = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)
    loss = sum((o * torch.randn(o.shape, generator=gen, dtype=o.dtype)).sum() for o in outputs)
    return torch.autograd.grad(loss, inputs)


def assert_same(got, want):
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_the_aggregation_equals_pygs_formula(seed):
    """Random sizes, a transposed view as input (as the reverse messages are before their concatenation)
    or a contiguous one, ties at the extrema: the same aggregates and gradients as autograd's own."""
    gen = torch.Generator().manual_seed(1200 + seed)
    B, n, k, C = (int(v) for v in torch.randint(1, 6, (4,), generator=gen))
    leaf = torch.randn(B, k, n, C, generator=gen, dtype=torch.float64)
    leaf[:, -1] = leaf[:, 0]  # a tie in every column (k = 1: the neighbour itself)
    leaf.requires_grad_()
    messages = leaf.transpose(1, 2) if seed % 2 else leaf.transpose(1, 2).contiguous()
    delta = float(torch.rand(1, generator=gen)) + 0.5
    got, want = aggregate(messages, delta), reference_aggregate(messages, delta)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert_same(grads_of(got, [leaf], torch.Generator().manual_seed(seed)),
                grads_of(want, [leaf], torch.Generator().manual_seed(seed)))


def test_a_tie_gives_the_whole_gradient_to_its_first_neighbour():
    """As torch-scatter's ``scatter_min`` (PyG's PNA on a GPU): one subgradient, nothing lost or doubled."""
    x = torch.tensor([[[[3.0], [1.0], [1.0], [2.0], [3.0]]]], dtype=torch.float64, requires_grad=True)  # [1, 1, 5, 1]
    stats = aggregate(x, 1.0, scalers=("identity",))
    (low_grad,) = torch.autograd.grad(stats[..., 1].sum(), x, retain_graph=True)  # the min aggregator's channel
    (high_grad,) = torch.autograd.grad(stats[..., 2].sum(), x)  # the max's
    assert low_grad.flatten().tolist() == [0.0, 1.0, 0.0, 0.0, 0.0]
    assert high_grad.flatten().tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("seed", range(4))
def test_blocks_are_aggregated_as_their_concatenation(seed):
    """Blocks of different sizes, one a transposed view, bfloat16 or float32 (with ties), an empty one: the
    statistics and each block's gradient (in its own dtype) are those of the concatenated, widened messages."""
    gen = torch.Generator().manual_seed(1250 + seed)
    B, n, C = (int(v) for v in torch.randint(1, 5, (3,), generator=gen))
    sizes = [int(v) for v in torch.randint(1, 6, (2,), generator=gen)]
    dtype = torch.bfloat16 if seed % 2 else torch.float32
    first = (torch.randn(B, n, sizes[0], C, generator=gen) * 3).round().to(dtype).requires_grad_()
    second_leaf = (torch.randn(B, sizes[1], n, C, generator=gen) * 3).round().to(dtype).requires_grad_()
    second = second_leaf.transpose(1, 2)
    empty = first.new_zeros(B, n, 0, C)
    got = aggregate([first, empty, second], 1.3)
    whole = torch.cat([first, second], dim=2).float()
    want = reference_aggregate(whole, 1.3)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    g = torch.randn(got.shape, generator=gen)
    got_grads = torch.autograd.grad(got, [first, second_leaf], g)
    want_grads = torch.autograd.grad(want, [first, second_leaf], g)
    for a, b in zip(got_grads, want_grads, strict=True):
        assert a.dtype == dtype  # float32: the moments' two products in one addcmul round differently (~1 ulp)
        torch.testing.assert_close(a, b, **({"rtol": 0, "atol": 0} if dtype == torch.bfloat16 else {}))


def test_blocks_of_mixed_dtypes_are_aggregated_in_the_widest():
    gen = torch.Generator().manual_seed(7)
    wide = torch.randn(2, 3, 4, 5, generator=gen, dtype=torch.float64) * 1e-9 + 1.0  # below float32's resolution
    narrow = torch.randn(2, 3, 2, 5, generator=gen).bfloat16()
    got = aggregate([narrow, wide], 1.0, scalers=("identity",))
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, reference_aggregate(torch.cat([narrow.double(), wide], dim=2), 1.0, ("identity",)),
                               rtol=1e-12, atol=1e-14)


def test_aggregating_no_blocks_is_an_error_and_no_neighbours_are_zeros():
    with pytest.raises(ValueError, match="at least one block"):
        aggregate([], 1.0)
    empty = torch.zeros(2, 3, 0, 4, dtype=torch.bfloat16)
    zeros = aggregate([empty, empty], 1.0)
    assert zeros.shape == (2, 3, 4 * 4 * 2) and zeros.dtype == torch.float32 and not zeros.any()


def reference_graph(constructor: GraphConstructor, ws) -> LayeredGraph:
    """The construction with one linear map of the Fourier features per direction."""
    ws = ws.with_channels()
    no_bias = ws.weights[0].new_zeros(ws.weights[0].shape[0], ws.widths[0], ws.weights[0].shape[3])
    nodes = [constructor.node(constructor.bias_features.encode(b)) + p
             for b, p in zip((no_bias, *ws.biases), constructor.positions())]
    lifted = [constructor.weight_features.encode(w) for w in ws.weights]
    backward = tuple(constructor.backward_edge(f) for f in lifted) if constructor.bidirectional else None
    return LayeredGraph(tuple(nodes), tuple(constructor.forward_edge(f) for f in lifted), backward)


def graph_tensors(graph: LayeredGraph) -> list[torch.Tensor]:
    return [*graph.nodes, *graph.forward, *(graph.backward or ())]


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_the_construction_maps_both_directions_as_one(seed, bidirectional):
    gen = torch.Generator().manual_seed(1300 + seed)
    widths = random_widths(gen)
    torch.manual_seed(seed)
    constructor = GraphConstructor(widths, 5, 3, fourier_features=4, bidirectional=bidirectional).double()
    ws = random_space(widths, 3, 1, gen)
    got, want = graph_tensors(constructor(ws)), graph_tensors(reference_graph(constructor, ws))
    assert_same(got, want)
    params = list(constructor.parameters())
    assert_same(grads_of(got, params, torch.Generator().manual_seed(seed)),
                grads_of(want, params, torch.Generator().manual_seed(seed)))


def reference_messages(conv: PNAConv, lower, upper, edges, reverse: bool) -> torch.Tensor:
    """``scale(e) * (pre_target(x_target) + pre_source(x_source)) + shift(e)`` edge by edge, ``[B, o, i, C]``."""
    scale, shift = conv.edge_encoder(edges).chunk(2, dim=-1)
    lo = lower[:, None].expand(-1, upper.shape[1], -1, -1)  # lower neuron i at [o, i]
    up = upper[:, :, None].expand(-1, -1, lower.shape[1], -1)  # upper neuron o at [o, i]
    source, target = (up, lo) if reverse else (lo, up)
    return scale * (conv.pre_target(target) + conv.pre_source(source)) + shift


def reference_conv(conv: PNAConv, graph: LayeredGraph) -> list[torch.Tensor]:
    """A PNA layer as the module docstring writes it: each node's messages concatenated, then aggregated."""
    x, L = graph.nodes, len(graph.nodes) - 1
    incoming = [[] for _ in x]
    for l in range(L):
        incoming[l + 1].append(reference_messages(conv, x[l], x[l + 1], graph.forward[l], reverse=False))
        if graph.backward is not None:
            incoming[l].append(reference_messages(conv, x[l], x[l + 1], graph.backward[l], reverse=True).transpose(1, 2))
    out = []
    for x_l, blocks in zip(x, incoming):
        messages = torch.cat(blocks, dim=2) if blocks else x_l.new_zeros(*x_l.shape[:2], 0, x_l.shape[-1])
        aggregated = reference_aggregate(messages, conv.delta, conv.scalers) if blocks else \
            x_l.new_zeros(*x_l.shape[:2], conv.post.in_features - x_l.shape[-1])
        out.append(conv.lin(conv.post(torch.cat([x_l, aggregated], dim=-1))))
    return out


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_a_pna_layer_equals_the_concatenating_one(seed, bidirectional):
    gen = torch.Generator().manual_seed(1400 + seed)
    widths = random_widths(gen)
    C, E = (int(c) for c in torch.randint(2, 6, (2,), generator=gen))
    torch.manual_seed(seed)
    conv = PNAConv(C, E, delta=1.3).double()
    graph = random_graph(widths, 3, C, E, gen)
    if not bidirectional:
        graph = LayeredGraph(graph.nodes, graph.forward, None)
    leaves = graph_tensors(graph)
    leaves = [t.requires_grad_() for t in leaves]
    got, want = conv(graph), reference_conv(conv, graph)
    assert_same(got, want)
    inputs = leaves + list(conv.parameters())
    assert_same(grads_of(got, inputs, torch.Generator().manual_seed(seed)),
                grads_of(want, inputs, torch.Generator().manual_seed(seed)))


@pytest.mark.parametrize("seed", range(4))
def test_relational_attention_gradients_equal_the_dense_formulas(seed):
    """test_graph_speedup checks the attention's values; here its gradients, with ``Q``, ``K`` and ``M``
    applied to the edges as three products."""
    gen = torch.Generator().manual_seed(1500 + seed)
    widths = random_widths(gen)
    heads, head_width, nodes, edges = (int(v) for v in torch.randint(1, 5, (4,), generator=gen))
    torch.manual_seed(seed)
    attention = RelationalAttention(nodes + 1, edges + 1, heads * head_width, heads).double()
    graph = random_graph(widths, 3, nodes + 1, edges + 1, gen)
    leaves = [t.requires_grad_() for t in graph_tensors(graph)]
    no_edge = torch.randn(edges + 1, generator=gen, dtype=torch.float64, requires_grad=True)
    got = attention(graph, no_edge)
    want = dense_attention(attention, graph, no_edge).split(list(graph.widths), dim=1)
    assert_same(got, want)
    inputs = [*leaves, no_edge, *attention.parameters()]
    assert_same(grads_of(got, inputs, torch.Generator().manual_seed(seed)),
                grads_of(want, inputs, torch.Generator().manual_seed(seed)))


@pytest.mark.parametrize("model", [NGGNN, NGTransformer])
def test_saved_runs_still_load(model):
    """The faster forms kept every parameter and its name: the state dict's keys and shapes are the
    same as the modules' parameters as the papers' layers name them."""
    keys = model((2, 4, 1), 1).state_dict().keys()
    names = {"construct.forward_edge.weight", "construct.backward_edge.weight", "construct.forward_edge.bias"}
    names |= ({"backbone.convs.0.edge_encoder.weight", "backbone.edge_updates.0.lin_e.weight"} if model is NGGNN
              else {"layers.0.attention.qkv_edge.weight", "layers.0.attention.qkv_node.weight",
                    "layers.0.edge_update.lin_e.weight"})
    assert names <= set(keys)


ONEDNN = torch.backends.mkldnn.is_available()


def small_model(model, widths):
    if model is NGGNN:
        return NGGNN(widths, 3, channels=8, num_layers=3, fourier_features=8)
    return NGTransformer(widths, 3, edge_channels=8, node_channels=8, attention_hidden=16, node_hidden=8,
                         edge_hidden=8, head_hidden=8, heads=2, num_layers=2, fourier_features=8)


def input_shapes(monkeypatch) -> dict[str, list[tuple[int, ...]]]:
    """The input shapes that ``F.linear`` and ``F.conv2d`` receive from now on."""
    seen = {"linear": [], "conv2d": []}
    for name in seen:
        def spy(x, *args, _name=name, _original=getattr(torch.nn.functional, name), **kwargs):
            seen[_name].append(tuple(x.shape))
            return _original(x, *args, **kwargs)

        monkeypatch.setattr(torch.nn.functional, name, spy)
    return seen


@pytest.mark.skipif(not ONEDNN, reason="no oneDNN in this PyTorch")
@pytest.mark.parametrize("model", [NGGNN, NGTransformer])
@pytest.mark.parametrize("seed", range(2))
def test_edge_maps_go_through_the_shared_convolution_and_compute_the_same(model, seed, monkeypatch):
    """float32, every shape large enough (``MIN_ROWS = 1``): every map of per-edge features
    (``[B, d_{l+1}, d_l, E]``) is :mod:`dws.ops.linear`'s convolution, none an ``F.linear``; per-node maps
    stay ``F.linear`` (as convolutions they were slower at 2 threads, docs/dws.md); outputs and every
    parameter's gradient equal the same model's with every product an ``F.linear``."""
    gen = torch.Generator().manual_seed(1300 + seed)
    widths = random_widths(gen)
    torch.manual_seed(seed)
    net = small_model(model, widths)
    ws = random_space(widths, 3, 1, gen).map(lambda t: t.float())
    params = list(net.parameters())
    monkeypatch.setattr(dws.ops.linear, "MIN_ROWS", 10**12)
    want = net(ws)
    want_grads = grads_of(want, params, torch.Generator().manual_seed(seed))
    monkeypatch.setattr(dws.ops.linear, "MIN_ROWS", 1)
    seen = input_shapes(monkeypatch)
    got = net(ws)
    assert not [s for s in seen["linear"] if len(s) == 4]
    pairs = len(widths) - 1
    assert len(seen["conv2d"]) >= pairs * (1 + 2 * (3 if model is NGGNN else 2))  # construction + each layer's
    assert [s for s in seen["linear"] if len(s) == 3]  # the nodes' maps
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for g, w in zip(grads_of(got, params, torch.Generator().manual_seed(seed)), want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.skipif(not ONEDNN, reason="no oneDNN in this PyTorch")
@pytest.mark.parametrize("model", [NGGNN, NGTransformer])
def test_torch_compile_traces_the_edge_convolutions_without_a_graph_break(model, monkeypatch):
    """The convolution route adds no graph break to ``torch.compile``'s trace of the model (``zoo train
    --compile``): as many graphs and breaks as with every product an ``F.linear``."""
    gen = torch.Generator().manual_seed(1310)
    widths = (2, 5, 4, 1)
    net = small_model(model, widths)
    ws = random_space(widths, 3, 1, gen).map(lambda t: t.float())
    counts = {}
    for min_rows in (10**12, 1):
        monkeypatch.setattr(dws.ops.linear, "MIN_ROWS", min_rows)
        torch._dynamo.reset()
        explanation = torch._dynamo.explain(net)(ws)
        counts[min_rows] = (explanation.graph_count, explanation.graph_break_count)
    assert counts[1] == counts[10**12]


@pytest.mark.parametrize("compiles", [True, False])
def test_the_benchmark_times_the_compiled_step_and_keeps_the_eager_row(compiles, monkeypatch, capsys):
    """``--compile`` goes through ``zoo train --compile``'s wrapper, its steps alternated with eager ones (the
    table's eager column); a model whose step does not compile keeps its eager time and the table says why
    (torch.compile stubbed: no inductor here)."""
    import argparse

    bench = load_benchmark()
    wrapped = []

    def fake_compile(model, *args, **kwargs):
        if not compiles:
            raise RuntimeError("lowering failed\nfor this op")
        wrapped.append(model)
        return model

    monkeypatch.setattr(torch, "compile", fake_compile)
    args = argparse.Namespace(model="ng-gnn", widths=[2, 3, 1], hidden_channels=4, input_reduction=0,
                              activation="sine", batch=4, iters=1, threads=1, device="cpu", compile=True,
                              bf16=False)
    row = bench.measure(args)
    assert row["step_s"] > 0
    assert (len(wrapped) == 1 and row["compiled_s"] > 0) if compiles else \
        row["compile_error"] == "RuntimeError: lowering failed for this op"
    base = {"model": "dwsnet", "step_s": 2 * row["step_s"], "compile_error": "AssertionError: x"}
    bench.print_compiled([base, row], base)
    out = capsys.readouterr().out
    assert "dwsnet: torch.compile failed: AssertionError: x" in out
    ng_line = next(line for line in out.splitlines() if line.startswith("ng-gnn"))
    assert ("eager_alternated_s" in row) == compiles  # the eager steps timed between the compiled ones
    eager = row.get("eager_alternated_s", row["step_s"])
    assert float(ng_line.split()[1]) == pytest.approx(eager, abs=5e-4)
    assert float(ng_line.split()[5]) == pytest.approx(eager / base["step_s"], abs=0.05)  # over DWSNet's eager
    if compiles:
        assert float(ng_line.split()[6]) == pytest.approx(row["compiled_s"] / base["step_s"], abs=0.05)
