"""The neural graphs under ``zoo train --precision bf16`` (session 10, 2026-11-28): the faster bfloat16 step
(PNA's aggregation in float32, ``HeadDot``'s backward, contiguous per-layer queries, keys and values)
computes the same function: the attention bit for bit as before, the aggregation to float32's accuracy, and
both models' outputs and every parameter's gradient as float64's up to bfloat16's rounding, on random
architectures (2-4 layers, widths 1-6)."""

from __future__ import annotations

import copy

import pytest
import torch

from dws.ng import relational
from dws.ng.aggregation import aggregate
from dws.ng.models import NGGNN, NGTransformer, gnn_ratios, transformer_ratios
from dws.ng.relational import HeadDot
from dws.weightspace import WeightSpace
from test_ngt_speed import random_architecture

BF16 = dict(device_type="cpu", dtype=torch.bfloat16)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.detach().double() - want.detach()).norm() / want.detach().norm().clamp(min=1e-12))


@pytest.mark.parametrize("seed", range(4))
def test_head_dot_is_vecdot(seed):
    gen = torch.Generator().manual_seed(seed)
    shape = tuple(torch.randint(1, 5, (3,), generator=gen).tolist()) + (int(torch.randint(1, 9, (1,), generator=gen)),)
    a, b = (torch.randn(shape, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(2))
    assert torch.autograd.gradcheck(HeadDot.apply, (a, b))
    torch.testing.assert_close(HeadDot.apply(a, b), torch.linalg.vecdot(a, b))
    # bfloat16 (the expanded gradient): the products autograd's vecdot computes, bit for bit, for one input or both
    a16, b16 = a.detach().bfloat16().requires_grad_(), b.detach().bfloat16().requires_grad_()
    g = torch.randn(shape[:-1], generator=gen).bfloat16()
    for inputs in ((a16,), (a16, b16)):
        got = torch.autograd.grad(HeadDot.apply(a16, b16), inputs, g)
        want = torch.autograd.grad(torch.linalg.vecdot(a16, b16), inputs, g)
        assert all(x.dtype == torch.bfloat16 and torch.equal(x, y) for x, y in zip(got, want))


@pytest.mark.parametrize("seed", range(3))
def test_bf16_messages_are_aggregated_in_float32(seed):
    """bfloat16 messages (with ties, as bfloat16 values have) give float64's statistics and gradients to
    float32's rounding, which bfloat16's own aggregation (~4e-3) would not."""
    gen = torch.Generator().manual_seed(seed)
    messages = (torch.randn(3, 4, 7, 5, generator=gen) * 4).round().bfloat16().requires_grad_()  # many ties
    wide = messages.detach().double().requires_grad_()
    got, want = aggregate(messages, 1.3), aggregate(wide, 1.3)
    assert got.dtype == torch.float32
    assert relative_error(got, want) < 1e-6
    g = torch.randn(want.shape, generator=gen, dtype=torch.float64)
    (got_grad,), (want_grad,) = torch.autograd.grad(got, messages, g.float()), torch.autograd.grad(want, wide, g)
    assert got_grad.dtype == torch.bfloat16
    assert relative_error(got_grad, want_grad) < 4e-3  # float32 gradients rounded once to bfloat16 (2^-9)


def build(name: str, widths: tuple[int, ...]) -> torch.nn.Module:
    if name == "ng-gnn":
        return NGGNN(widths, 3, num_layers=3, **dict(gnn_ratios(6), fourier_features=16))
    return NGTransformer(widths, 3, num_layers=3, **dict(transformer_ratios(8), fourier_features=16))


def batch_of(widths: tuple[int, ...], gen: torch.Generator, count: int = 8) -> WeightSpace:
    n = sum(a * b for a, b in zip(widths[:-1], widths[1:])) + sum(widths[1:])
    return WeightSpace.unflatten(torch.randn(count, n, generator=gen) * 0.5, widths)


@pytest.mark.parametrize("seed", range(3))
def test_the_bf16_attention_is_autocasts_own(seed, monkeypatch):
    """ng-transformer's bfloat16 step with ``HeadDot`` and contiguous queries, keys and values is bit for bit
    the one of autograd's ``vecdot`` on the strided views (the same products of the same bfloat16 values)."""
    gen = torch.Generator().manual_seed(seed)
    widths, _ = random_architecture(gen)
    torch.manual_seed(seed)
    model = build("ng-transformer", widths)
    naive = copy.deepcopy(model)
    ws, g = batch_of(widths, gen), torch.randn(8, 3, generator=gen)
    with torch.autocast(**BF16):
        out = model(ws)
    monkeypatch.setattr(relational.HeadDot, "apply", torch.linalg.vecdot)
    with torch.autocast(**BF16):
        want = naive(ws)
    assert torch.equal(out, want)
    out.float().backward(g)
    want.float().backward(g)
    for (key, p), q in zip(model.named_parameters(), naive.parameters()):
        assert torch.equal(p.grad, q.grad), key


@pytest.mark.parametrize("name", ["ng-gnn", "ng-transformer"])
@pytest.mark.parametrize("seed", range(4))
def test_a_bf16_step_computes_the_float64_function(name, seed):
    """Outputs and gradients within bfloat16's error. A few ReLU, min and max inputs change side under bfloat16's
    rounding, each routing a gradient elsewhere, so the gradients' error is uneven: measured on 12 seeds (8
    networks): outputs <= 1.8%, the whole gradient <= 11.5% (most seeds ~1%), one parameter's error <= 8% of the
    whole gradient's norm. A wrong formula is off by ~100%."""
    gen = torch.Generator().manual_seed(seed)
    widths, _ = random_architecture(gen)
    torch.manual_seed(seed)
    model = build(name, widths)
    ws = batch_of(widths, gen)
    wide = copy.deepcopy(model).double()
    g = torch.randn(8, 3, generator=gen, dtype=torch.float64)
    with torch.autocast(**BF16):
        out = model(ws)
    want = wide(ws.to(torch.float64))
    assert relative_error(out, want) < 0.03
    out.float().backward(g.float())
    want.backward(g)
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())
    got, want = (torch.cat([p.grad.flatten() for p in m.parameters()]) for m in (model, wide))
    assert relative_error(got, want) < 0.2
    for (key, p), q in zip(model.named_parameters(), wide.parameters()):
        assert float((p.grad.double() - q.grad).norm() / want.norm()) < 0.15, key
