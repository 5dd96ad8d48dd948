"""ng-transformer's faster attention (session 9, 2026-11-28) computes what dws/ng/relational.py's
docstring writes: the attention, the edge update and the whole model against straightforward
formulations written here (every pair's edge held densely, ``lin_e`` of the concatenation), outputs
and every parameter's gradient, on random architectures (2-4 layers, widths 1-6) and batches."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dws.ng.models import NGTransformer
from dws.ng.relational import EdgeUpdate, RelationalAttention, per_head_sum
from dws.weightspace import WeightSpace
from test_graph_speedup import dense_attention, random_graph

F = nn.functional


def random_architecture(gen: torch.Generator) -> tuple[tuple[int, ...], int]:
    """2-4 layers of widths 1-6, and a batch of 1-4 networks."""
    depth = int(torch.randint(2, 5, (1,), generator=gen))
    return tuple(torch.randint(1, 7, (depth + 1,), generator=gen).tolist()), int(torch.randint(1, 5, (1,), generator=gen))


def reference_edge(update: EdgeUpdate, e, e_rev, source, target):
    """The docstring's edge update of one direction: ``source`` and ``target`` node features already
    broadcast to the edges' ``[B, d_{l+1}, d_l, C]`` layout."""
    h = F.linear(torch.cat([e, e_rev], dim=-1), update.lin_e.weight, update.lin_e.bias)
    h = h + F.linear(source, update.lin_s.weight, update.lin_s.bias) + F.linear(target, update.lin_t.weight, update.lin_t.bias)
    e = update.norm0(e + F.linear(F.gelu(h), update.lin1.weight, update.lin1.bias))
    first, _, second, _ = update.mlp
    return update.norm1(e + F.linear(F.gelu(F.linear(e, first.weight)), second.weight, second.bias))


def reference_edge_update(update: EdgeUpdate, graph):
    forward, backward = [], []
    for l, (f, b) in enumerate(zip(graph.forward, graph.backward)):
        lower = graph.nodes[l][:, None].expand(-1, f.shape[1], -1, -1)  # x_i at [o, i]
        upper = graph.nodes[l + 1][:, :, None].expand(-1, -1, f.shape[2], -1)  # x_o at [o, i]
        forward.append(reference_edge(update, f, b, lower, upper))  # i -> o
        backward.append(reference_edge(update, b, f, upper, lower))  # o -> i
    return graph.with_edges(forward, backward)


def reference_model(model: NGTransformer, ws: WeightSpace) -> torch.Tensor:
    """``NGTransformer.forward`` with each ``RTLayer`` written out: dense attention, node updates, edge update."""
    graph = model.construct(ws)
    no_edge = model.construct.zero_weight_edge(graph.nodes[0])
    for layer in model.layers:
        attended = dense_attention(layer.attention, graph, no_edge).split(list(graph.widths), dim=1)
        nodes = [layer.norm0(x + layer.lin0(a)) for x, a in zip(graph.nodes, attended)]
        graph = graph.with_nodes([layer.norm1(x + layer.mlp(x)) for x in nodes])
        if layer.edge_update is not None:
            graph = reference_edge_update(layer.edge_update, graph)
    return model.head(graph.nodes[-1])


def gradients(outputs, inputs, seed: int) -> list[torch.Tensor]:
    """The gradient of a fixed random linear function of ``outputs``."""
    gen = torch.Generator().manual_seed(seed)
    outputs = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)
    loss = sum((o * torch.randn(o.shape, generator=gen, dtype=o.dtype)).sum() for o in outputs)
    return list(torch.autograd.grad(loss, inputs, allow_unused=False))


def assert_same(got, want, **tolerance):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **tolerance)


@pytest.mark.parametrize("seed", range(4))
def test_per_head_sum_is_the_per_head_weighted_sum(seed):
    gen = torch.Generator().manual_seed(3100 + seed)
    batch, n, heads, m, width = (int(v) for v in torch.randint(1, 6, (5,), generator=gen))
    a = torch.randn(batch, n, heads, m, generator=gen, dtype=torch.float64, requires_grad=True)
    values = torch.randn(batch, n, m, heads, width, generator=gen, dtype=torch.float64, requires_grad=True)
    got = per_head_sum(a, values)
    want = torch.stack([a[:, :, h, :, None].mul(values[:, :, :, h]).sum(2) for h in range(heads)], dim=2)
    assert got.shape == (batch, n, heads, width)
    assert_same([got, *gradients(got, [a, values], seed)], [want, *gradients(want, [a, values], seed)])


@pytest.mark.parametrize("seed", range(5))
def test_attention_and_edge_update_equal_the_docstring(seed):
    gen = torch.Generator().manual_seed(3200 + seed)
    widths, batch = random_architecture(gen)
    heads, head_width, nodes, edges = (int(v) for v in torch.randint(1, 5, (4,), generator=gen))
    torch.manual_seed(seed)
    attention = RelationalAttention(nodes, edges, heads * head_width, heads).double()
    update = EdgeUpdate(nodes, edges, int(torch.randint(1, 7, (1,), generator=gen))).double()
    for p in update.parameters():  # away from LayerNorm's unit weights and the zero biases of a fresh init
        nn.init.normal_(p, generator=gen)
    graph = random_graph(widths, batch, nodes, edges, gen)
    no_edge = torch.randn(edges, generator=gen, dtype=torch.float64)
    parameters = [*attention.parameters(), *update.parameters()]
    got = [*attention(graph, no_edge), *update(graph).forward, *update(graph).backward]
    expected_edges = reference_edge_update(update, graph)
    want = [*dense_attention(attention, graph, no_edge).split(list(graph.widths), dim=1),
            *expected_edges.forward, *expected_edges.backward]
    assert_same(got, want, rtol=1e-10, atol=1e-12)
    assert_same(gradients(got, parameters, seed), gradients(want, parameters, seed), rtol=1e-9, atol=1e-11)


def random_model(gen: torch.Generator, widths, dtype) -> NGTransformer:
    heads = int(torch.randint(1, 4, (1,), generator=gen))
    model = NGTransformer(widths, 3, edge_channels=int(torch.randint(2, 6, (1,), generator=gen)), node_channels=5,
                          attention_hidden=heads * int(torch.randint(1, 4, (1,), generator=gen)), node_hidden=6,
                          edge_hidden=4, head_hidden=6, heads=heads, num_layers=int(torch.randint(2, 4, (1,), generator=gen)),
                          fourier_features=4)
    return model.to(dtype)


def random_weights(widths, batch, gen, dtype) -> WeightSpace:
    count = sum(i * o + o for i, o in zip(widths[:-1], widths[1:]))
    return WeightSpace.unflatten(torch.randn(batch, count, generator=gen, dtype=dtype), widths)


@pytest.mark.parametrize("seed", range(4))
def test_the_whole_model_equals_the_written_out_layers(seed):
    gen = torch.Generator().manual_seed(3300 + seed)
    widths, batch = random_architecture(gen)
    torch.manual_seed(seed)
    model = random_model(gen, widths, torch.float64)
    ws = random_weights(widths, batch, gen, torch.float64)
    parameters = list(model.parameters())
    got, want = model(ws), reference_model(model, ws)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert_same(gradients(got, parameters, seed), gradients(want, parameters, seed), rtol=1e-9, atol=1e-11)


def test_float32_at_a_size_that_takes_the_convolution_route():
    """Blocks of >= 1,024 edges go through dws.ops.linear's 1x1 convolutions, which float64 never takes."""
    gen = torch.Generator().manual_seed(3400)
    widths = (3, 24, 16, 2)
    torch.manual_seed(0)
    model = random_model(gen, widths, torch.float32)
    ws = random_weights(widths, 4, gen, torch.float32)
    parameters = list(model.parameters())
    got, want = model(ws), reference_model(model, ws)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert_same(gradients(got, parameters, 0), gradients(want, parameters, 0), rtol=1e-3, atol=1e-4)


def test_parameter_names_and_shapes_are_unchanged():
    """Saved runs load with ``strict=True``: an RT layer's state dict is exactly what it was before session 9."""
    model = NGTransformer((2, 4, 1), 1, edge_channels=4, node_channels=6, attention_hidden=8, node_hidden=10,
                          edge_hidden=12, head_hidden=5, heads=2, num_layers=2, fourier_features=4)
    layer = {k[len("layers.0."):]: tuple(v.shape) for k, v in model.state_dict().items() if k.startswith("layers.0.")}
    assert layer == {
        "attention.qkv_node.weight": (24, 6), "attention.qkv_edge.weight": (32, 4),
        "attention.proj_out.weight": (6, 8), "attention.proj_out.bias": (6,),
        "lin0.weight": (6, 6), "lin0.bias": (6,), "mlp.0.weight": (10, 6), "mlp.2.weight": (6, 10), "mlp.2.bias": (6,),
        "norm0.weight": (6,), "norm0.bias": (6,), "norm1.weight": (6,), "norm1.bias": (6,),
        "edge_update.lin_e.weight": (12, 8), "edge_update.lin_e.bias": (12,),
        "edge_update.lin_s.weight": (12, 6), "edge_update.lin_s.bias": (12,),
        "edge_update.lin_t.weight": (12, 6), "edge_update.lin_t.bias": (12,),
        "edge_update.lin1.weight": (4, 12), "edge_update.lin1.bias": (4,),
        "edge_update.mlp.0.weight": (12, 4), "edge_update.mlp.2.weight": (4, 12), "edge_update.mlp.2.bias": (4,),
        "edge_update.norm0.weight": (4,), "edge_update.norm0.bias": (4,),
        "edge_update.norm1.weight": (4,), "edge_update.norm1.bias": (4,),
    }
