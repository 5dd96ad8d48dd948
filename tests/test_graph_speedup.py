"""The graph models' faster forms (issue 32) compute what the papers write: each rewritten layer
against a straightforward dense computation of the same formula from the module's own parameters,
on random architectures and sizes (float64)."""

from __future__ import annotations

import pytest
import torch

from dws.ng import LayeredGraph
from dws.ng.relational import RelationalAttention
from dws.scalegmn import ScaleGMNInvariant
from dws.scalegmn.mlp import MLP
from dws.scalegmn.symmetry import invariant_map
from test_nfn import random_space, random_widths


def random_graph(widths, batch, node_channels, edge_channels, gen) -> LayeredGraph:
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    pairs = list(zip(widths[:-1], widths[1:]))
    return LayeredGraph(tuple(rand(batch, d, node_channels) for d in widths),
                        tuple(rand(batch, o, i, edge_channels) for i, o in pairs),
                        tuple(rand(batch, o, i, edge_channels) for i, o in pairs))


def dense_attention(attention: RelationalAttention, graph: LayeredGraph, no_edge: torch.Tensor) -> torch.Tensor:
    """The relational attention over all ``N`` nodes with every pair's edge feature held densely
    (``[B, N, N, E]``): ``q_ij = W_q x_i + Q e_ij``, ``k_ij = W_k x_j + K e_ij``,
    ``v_ij = W_v x_j * M e_ij + V e_ij``, ``y_i = sum_j softmax_j(q_ij . k_ij / sqrt(d)) v_ij``."""
    x = torch.cat(graph.nodes, dim=1)
    B, N, _ = x.shape
    starts = [0]
    for d in graph.widths:
        starts.append(starts[-1] + d)
    e = no_edge.expand(B, N, N, -1).clone()
    for l, (fw, bw) in enumerate(zip(graph.forward, graph.backward)):
        lower, upper = slice(starts[l], starts[l + 1]), slice(starts[l + 1], starts[l + 2])
        e[:, lower, upper] = fw.transpose(1, 2)  # query i in layer l, key j in layer l + 1: W[j, i]'s forward edge
        e[:, upper, lower] = bw  # query in layer l + 1, key in layer l: the reverse edge
    H = attention.heads
    wq, wk, wv = attention.qkv_node.weight.unflatten(0, (H, 3, -1)).unbind(1)  # [H, h, C]
    eq, ek, ev, em = attention.qkv_edge.weight.unflatten(0, (H, 4, -1)).unbind(1)  # [H, h, E]
    node = lambda w: torch.einsum("bnc,hdc->bnhd", x, w)  # noqa: E731
    edge = lambda w: torch.einsum("bnme,hde->bnmhd", e, w)  # noqa: E731
    q = node(wq)[:, :, None] + edge(eq)
    k = node(wk)[:, None] + edge(ek)
    v = node(wv)[:, None] * edge(em) + edge(ev)
    a = torch.softmax((q * k).sum(-1) * attention.scale, dim=2)  # [B, N(query), N(key), H]
    y = torch.einsum("bnmh,bnmhd->bnhd", a, v)
    return attention.proj_out(y.flatten(-2))


@pytest.mark.parametrize("seed", range(6))
def test_relational_attention_equals_the_dense_formula(seed):
    gen = torch.Generator().manual_seed(900 + seed)
    widths = random_widths(gen)
    heads = int(torch.randint(1, 4, (1,), generator=gen))
    hidden = heads * int(torch.randint(1, 5, (1,), generator=gen))
    node_channels, edge_channels = (int(c) for c in torch.randint(2, 7, (2,), generator=gen))
    torch.manual_seed(seed)
    attention = RelationalAttention(node_channels, edge_channels, hidden, heads).double()
    graph = random_graph(widths, 3, node_channels, edge_channels, gen)
    no_edge = torch.randn(edge_channels, generator=gen, dtype=torch.float64)
    expected = dense_attention(attention, graph, no_edge).split(list(graph.widths), dim=1)
    for got, want in zip(attention(graph, no_edge), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("symmetry", ["sign", "scale"])
@pytest.mark.parametrize("seed", range(3))
def test_scalegmn_gate_through_the_invariant_map_equals_the_two_steps(symmetry, seed):
    """``MLP(x, extra, invariant=inv)`` (``inv``'s last linear map multiplied into the MLP's first) is
    ``MLP(inv(x), extra)``, the paper's gate of a hidden neuron."""
    gen = torch.Generator().manual_seed(950 + seed)
    d, hidden, d_out, d_extra = (int(c) for c in torch.randint(1, 9, (4,), generator=gen))
    torch.manual_seed(seed)
    inv = invariant_map(symmetry, d).double()
    mlp = MLP(d, hidden, d_out, d_extra).double()
    for p in (*inv.parameters(), *mlp.parameters()):  # away from the zero biases of a fresh init
        torch.nn.init.normal_(p, generator=gen)
    x = torch.randn(3, 5, 1, d, generator=gen, dtype=torch.float64)
    extra = torch.randn(1, 5, d_extra, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(mlp(x, extra, invariant=inv), mlp(inv(x), extra), rtol=1e-10, atol=1e-12)


def scalegmn_computing_everything(model: ScaleGMNInvariant, ws) -> torch.Tensor:
    """``ScaleGMNInvariant.forward`` with every layer computing all its outputs (no :class:`Read` plan)."""
    nodes, edges, backward = model.init(ws)
    embeddings = model.init.node_embedding.vectors()
    for i, layer in enumerate(model.layers):
        updated, edges, backward = layer(nodes, edges, backward, embeddings)
        if model.skips is not None:
            updated = [model.skips[i](x) + u for x, u in zip(nodes, updated)]
        nodes = updated
    outputs = nodes[-1].flatten(1)
    if not model.bidirectional:
        return model.readout(outputs)
    both = torch.cat([model.project_outputs(outputs), model.project_inputs(nodes[0].flatten(1))], dim=-1)
    return model.readout(both)


@pytest.mark.parametrize("variant", ["forward", "bidirectional"])
@pytest.mark.parametrize("symmetry", ["sign", "scale"])
@pytest.mark.parametrize("seed", range(2))
def test_scalegmn_skipping_what_nothing_reads_changes_nothing(variant, symmetry, seed):
    """The model computes only what the readout reads in the end (``reads()``); the output and the
    gradients equal those of computing every node and edge in every layer; and the last layer does skip
    every hidden neuron (so the plan is not trivially everything)."""
    gen = torch.Generator().manual_seed(1200 + seed)
    widths = random_widths(gen)
    torch.manual_seed(seed)
    model = ScaleGMNInvariant(widths, 3, symmetry, variant, hidden=5, num_layers=int(torch.randint(2, 5, (1,), generator=gen)))
    model = model.double()
    ws = random_space(widths, 2, 1, gen)
    got, want = model(ws), scalegmn_computing_everything(model, ws)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    params = [p for p in model.parameters()]
    g_got = torch.autograd.grad(got.square().sum(), params, allow_unused=True)
    g_want = torch.autograd.grad(want.square().sum(), params, allow_unused=True)
    for a, b in zip(g_got, g_want, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    last = len(widths) - 1
    assert model.reads()[-1].nodes == ({0, last} if variant == "bidirectional" else {last})
