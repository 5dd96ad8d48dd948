"""ScaleGMN's faster computation (dws/scalegmn/linear.py, dws/ops/linear.py and the layers' use of them)
computes the paper's function: the model against a straightforward reference written here from the
module docstrings' equations (dense per-edge features, concatenated MLP inputs, ``rho(x) + rho(-x)`` as
two calls, every layer computing everything), outputs and every parameter's gradient, in float64 on random
architectures, both variants and both symmetries; the 1x1-convolution route against ``F.linear`` in
float32; scaled edges against their dense features."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from dws.scalegmn import ScaleGMNInvariant
from dws.scalegmn.graph import neuron_values, reciprocal
import dws.ops.linear
from dws.ops.linear import as_convolution
from dws.scalegmn.linear import Linear, ScaledEdges, linear
from dws.scalegmn.symmetry import ScaleNormalization
from dws_helpers import random_widths, random_ws


# --- the reference: the equations, plainly ---------------------------------------------------------

def affine(lin: torch.nn.Linear, x):
    return x @ lin.weight.T + (0 if lin.bias is None else lin.bias)


def mlp(m, x):
    """``Linear -> LayerNorm -> SiLU -> Linear`` of ``x`` (the concatenation of all inputs)."""
    first = m.first.weight if m.first_extra is None else torch.cat([m.first.weight, m.first_extra.weight], dim=1)
    h = x @ first.T + m.first.bias
    return affine(m.last, F.silu(F.layer_norm(h, h.shape[-1:], m.norm.weight, m.norm.bias, m.norm.eps)))


def invariant(inv, x):
    if isinstance(inv, ScaleNormalization):
        return x / (x.norm(dim=-1, keepdim=True) + inv.eps)
    def rho(y):
        h = F.layer_norm(affine(inv.first, y), y.shape[-1:], inv.norm.weight, inv.norm.bias, inv.norm.eps)
        return affine(inv.last, F.silu(h))

    return rho(x) + rho(-x)


def with_extra(x, extra):
    return x if extra is None else torch.cat([x, extra.expand(*x.shape[:-1], extra.shape[-1])], dim=-1)


def equivariant(f, x, extra, hidden):
    """``W x * MLP([inv(x), extra])`` (hidden neurons), ``W x * MLP'([x, extra])`` (input, output)."""
    if hidden:
        gate = mlp(f.gate_hidden, with_extra(invariant(f.invariant, x), extra))
    else:
        gate = mlp(f.gate_io, with_extra(x, extra))
    return affine(f.linear, x) * gate


def edge_update(f, e, x_source, x_target):
    """``W e_ij * MLP([inv(x_j), inv(x_i)])``, every edge's input concatenated."""
    shape = e.shape[:-1]
    both = torch.cat([invariant(f.invariant, x_source).expand(*shape, -1),
                      invariant(f.invariant, x_target).expand(*shape, -1)], -1)
    return affine(f.linear, e) * mlp(f.gate, both)


def graph(init, ws):
    ws = ws.with_channels()
    values = neuron_values(ws)
    last = len(values) - 1
    vectors = init.node_embedding.vectors()
    nodes = [affine(init.node_proj, v) + p if l in (0, last) else affine(init.node_proj, v) * p
             for l, (v, p) in enumerate(zip(values, vectors))]
    edges = [affine(init.edge_proj, w) for w in ws.weights]
    if init.edge_embedding is not None:
        emb = init.edge_embedding
        types = [emb.inputs, *emb.hidden][: len(edges) - 1] + [emb.outputs]
        edges = [e * p for e, p in zip(edges, types)]
    backward = None
    if init.backward_proj is not None:
        backward = [affine(init.backward_proj, w if init.symmetry == "sign" else reciprocal(w)) for w in ws.weights]
    return nodes, edges, backward


def layer(lay, nodes, edges, backward, embeddings):
    last = len(nodes) - 1

    def messages(msg, edge_list, backward_direction):
        received = [torch.zeros_like(x) for x in nodes]
        for l, e in enumerate(edge_list):
            if backward_direction:
                receiver, sent, extra, axis = l, nodes[l + 1][:, :, None], embeddings[l + 1][:, None], 1
            else:
                receiver, sent, extra, axis = l + 1, nodes[l][:, None], embeddings[l], 2
            x = affine(msg.edge_linear, e) * affine(msg.node_linear, sent)
            m = equivariant(msg.message, x, extra if msg.with_extra else None, 0 < receiver < last)
            received[receiver] = m.sum(axis)
        return received

    parts = [nodes, messages(lay.forward_messages, edges, False)]
    if lay.backward_messages is not None:
        parts.append(messages(lay.backward_messages, backward, True))
    new_nodes = [equivariant(lay.update, torch.cat(p, -1), embeddings[l] if lay.extras_in_updates else None,
                             0 < l < last) for l, p in enumerate(zip(*parts))]
    if lay.edge_update is not None:
        edges = [edge_update(lay.edge_update, e, nodes[l][:, None], nodes[l + 1][:, :, None])
                 for l, e in enumerate(edges)]
    if lay.backward_edge_update is not None:
        backward = [edge_update(lay.backward_edge_update, e, nodes[l + 1][:, :, None], nodes[l][:, None])
                    for l, e in enumerate(backward)]
    return new_nodes, edges, backward


def reference(model: ScaleGMNInvariant, ws):
    nodes, edges, backward = graph(model.init, ws)
    embeddings = model.init.node_embedding.vectors()
    for i, lay in enumerate(model.layers):
        updated, edges, backward = layer(lay, nodes, edges, backward, embeddings)
        nodes = updated if model.skips is None else [affine(model.skips[i], x) + u for x, u in zip(nodes, updated)]
    outputs = nodes[-1].flatten(1)
    if not model.bidirectional:
        return mlp(model.readout, outputs)
    both = torch.cat([affine(model.project_outputs, outputs), affine(model.project_inputs, nodes[0].flatten(1))], -1)
    return mlp(model.readout, both)


# --- the tests -------------------------------------------------------------------------------------

def check_against_reference(model, ws, rtol, atol):
    got, want = model(ws), reference(model, ws)
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
    params = list(model.parameters())
    g_got = torch.autograd.grad(got.square().sum(), params, allow_unused=True)
    g_want = torch.autograd.grad(want.square().sum(), params, allow_unused=True)
    for (name, _), a, b in zip(model.named_parameters(), g_got, g_want, strict=True):
        a = torch.zeros_like(b) if a is None and b is not None else a  # parameters the readout never hears
        b = torch.zeros_like(a) if b is None and a is not None else b
        if a is not None:
            torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f"gradient of {name}: {m}")


@pytest.mark.parametrize("variant", ["forward", "bidirectional"])
@pytest.mark.parametrize("symmetry", ["sign", "scale"])
@pytest.mark.parametrize("seed", range(3))
def test_the_model_equals_the_reference_formulation(variant, symmetry, seed):
    widths = random_widths(300 + seed, max_layers=4, max_width=5)
    torch.manual_seed(seed)
    model = ScaleGMNInvariant(widths, 3, symmetry, variant, hidden=6, num_layers=2 + seed % 3).double()
    with torch.no_grad():  # nonzero norm weights and biases, so that every term of the gradient is exercised
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5), m.bias.normal_()
    check_against_reference(model, random_ws(widths, 3, seed=seed), rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("variant", ["forward", "bidirectional"])
@pytest.mark.parametrize("symmetry", ["sign", "scale"])
def test_weights_of_two_channels_take_the_dense_path_and_equal_the_reference(variant, symmetry):
    """Initial edges stay :class:`ScaledEdges` for one channel only; two channels are projected densely."""
    widths = random_widths(400, max_layers=3, max_width=4)
    torch.manual_seed(4)
    model = ScaleGMNInvariant(widths, 2, symmetry, variant, hidden=5, num_layers=3, in_channels=2).double()
    check_against_reference(model, random_ws(widths, 2, channels=2, seed=4), rtol=1e-9, atol=1e-11)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this PyTorch")
@pytest.mark.parametrize("variant", ["forward", "bidirectional"])
def test_the_float32_model_with_convolutions_equals_the_reference(variant, monkeypatch):
    """The 1x1-convolution route (float32 only) inside the model, against the reference in float32 (every
    product of edge or node features a convolution here)."""
    monkeypatch.setattr(dws.ops.linear, "MIN_ROWS", 1)
    monkeypatch.setattr(dws.ops.linear, "NODE_CONVOLUTION", True)  # node features convolved too, on any CPU
    widths = (2, 7, 6, 1)
    torch.manual_seed(5)
    model = ScaleGMNInvariant(widths, 3, "sign", variant, hidden=16, num_layers=3)
    ws = random_ws(widths, 4, seed=5, dtype=torch.float32)
    assert as_convolution(torch.zeros(4, 6, 7, 16)) and as_convolution(torch.zeros(4, 6, 16))
    check_against_reference(model, ws, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("shape", [(3, 5, 4, 8), (2, 1, 6, 8), (2, 5, 1, 8), (3, 4, 8), (1, 1, 8), (4, 8)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("min_rows", [1, 1024])
def test_linear_equals_f_linear_with_gradients(shape, bias, min_rows, monkeypatch):
    monkeypatch.setattr(dws.ops.linear, "MIN_ROWS", min_rows)
    monkeypatch.setattr(dws.ops.linear, "NODE_CONVOLUTION", True)  # node features convolved too, on any CPU
    torch.manual_seed(1)
    x = torch.randn(shape, requires_grad=True)
    lin = Linear(8, 5, bias=bias)
    assert as_convolution(x) == (len(shape) in (3, 4) and min_rows == 1 and torch.backends.mkldnn.is_available())
    got, want = lin(x), F.linear(x, lin.weight, lin.bias)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    g = torch.randn(want.shape)
    params = [x, lin.weight] + ([lin.bias] if bias else [])
    for a, b in zip(torch.autograd.grad(got, params, g), torch.autograd.grad(want, params, g)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_linear_keeps_nn_linear_s_parameters_and_state_dict():
    torch.manual_seed(0)
    a = torch.nn.Linear(4, 3)
    torch.manual_seed(0)
    b = Linear(4, 3)
    assert a.state_dict().keys() == b.state_dict().keys()
    for k in a.state_dict():
        assert torch.equal(a.state_dict()[k], b.state_dict()[k])


@pytest.mark.parametrize("vector_shape", [(6,), (4, 6), (3, 1, 6), (2, 1, 4, 6), (2, 3, 1, 6)])
def test_scaled_edges_map_and_norm_as_their_dense_features(vector_shape):
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(2, 3, 4, 1, generator=gen, dtype=torch.float64)
    e = ScaledEdges(w, torch.randn(vector_shape, generator=gen, dtype=torch.float64))
    dense = e.dense()
    assert dense.shape == (2, 3, 4, 6)
    weight = torch.randn(5, 6, generator=gen, dtype=torch.float64)
    bias = torch.randn(5, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(linear(e, weight, bias), F.linear(dense, weight, bias))
    torch.testing.assert_close(linear(e, weight), F.linear(dense, weight))
    torch.testing.assert_close(e.norm(), dense.norm(dim=-1, keepdim=True))
    torch.testing.assert_close(e.per_vector(lambda v: 3 * v).dense(), 3 * dense)
    normalized = ScaleNormalization()(e)
    assert isinstance(normalized, ScaledEdges)
    torch.testing.assert_close(normalized.dense(), ScaleNormalization()(dense))
