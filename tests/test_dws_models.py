"""Invariance/equivariance of whole DWSNets (plain and accelerated), their configurations, and the
pointwise helpers."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from dws import DWSNetEquivariant, DWSNetInvariant, WeightSpace, dwsnet_mnist_inr_config, random_group_element
from dws.nn import FreeAxisLinear, WSBatchNorm, WSDropout
from dws.nn.fast import accelerate
from dws.nn.reference import with_reference_layers
from dws_helpers import adam_losses, max_abs_diff, random_widths, random_ws

SEEDS = range(6)
BLOCKS = ("all", "W2W", "B2B", "W2W+B2B", "diagonal")


def count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def perms_for(widths, batch, seed):
    return random_group_element(widths, batch_size=batch, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("backend", ("plain", "auto"))
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("pool", ("max", "mean"))
def test_invariant_model_is_invariant(seed, pool, backend):
    rng = random.Random(seed)
    widths = random_widths(seed)
    model = DWSNetInvariant(widths, 3, hidden_channels=rng.randint(2, 5), num_layers=rng.randint(1, 4), pool=pool,
                            blocks=rng.choice(BLOCKS), head_hidden=rng.choice([None, 8])).double()
    accelerate(model, backend)
    ws = random_ws(widths, batch=6, seed=seed)  # train-mode BN: statistics are invariant too
    out = model(ws)
    assert out.shape == (6, 3) and torch.isfinite(out).all()
    assert torch.allclose(model(ws.permute(perms_for(widths, 6, seed))), out, atol=1e-10)
    model.eval()
    assert torch.allclose(model(ws.permute(perms_for(widths, 6, seed + 1))), model(ws), atol=1e-10)


@pytest.mark.parametrize("backend", ("plain", "auto"))
@pytest.mark.parametrize("seed", SEEDS)
def test_equivariant_model_is_equivariant(seed, backend):
    rng = random.Random(seed)
    widths = random_widths(seed)
    model = DWSNetEquivariant(widths, hidden_channels=rng.randint(2, 5), num_layers=rng.randint(1, 4),
                              bn=rng.random() < 0.5, blocks=rng.choice(BLOCKS), output_init_scale=1.0).double()
    accelerate(model, backend)
    ws = random_ws(widths, batch=4, seed=seed)
    perms = perms_for(widths, 4, seed)
    out = model(ws)
    assert not out.has_channels and out.widths == widths
    assert all(a.shape == b.shape for a, b in zip(out.weights + out.biases, ws.weights + ws.biases))
    assert max_abs_diff(model(ws.permute(perms)), out.permute(perms)) < 1e-10


def test_equivariant_model_output_starts_small():
    widths = (2, 16, 16, 1)
    ws = random_ws(widths, batch=8, dtype=torch.float32)
    small = DWSNetEquivariant(widths, hidden_channels=8)(ws).flatten().abs().max()
    big = DWSNetEquivariant(widths, hidden_channels=8, output_init_scale=1.0)(ws).flatten().abs().max()
    assert small < 1e-2 * big


@pytest.mark.parametrize("reduction", [3, (3, 2), (None, 2)])
def test_input_reduction_keeps_symmetry_and_saves_parameters(reduction):
    widths = (9, 4, 5, 6)
    ws = random_ws(widths, batch=3, seed=1)
    perms = perms_for(widths, 3, 1)
    inv = DWSNetInvariant(widths, 2, hidden_channels=3, input_reduction=reduction).double()
    assert torch.allclose(inv(ws.permute(perms)), inv(ws), atol=1e-10)
    assert count(inv) < count(DWSNetInvariant(widths, 2, hidden_channels=3))
    eq = DWSNetEquivariant(widths, hidden_channels=3, input_reduction=reduction, output_init_scale=1.0).double()
    out = eq(ws)
    assert out.widths == widths
    assert max_abs_diff(eq(ws.permute(perms)), out.permute(perms)) < 1e-10


def test_free_axis_linear_maps_only_free_axes():
    lin = FreeAxisLinear((6, 3, 4), (2, 3, 1)).double()
    out = lin(random_ws((6, 3, 4), batch=2, channels=2))
    assert out.widths == (2, 3, 1) and out.weights[0].shape == (2, 3, 2, 2)
    with pytest.raises(ValueError, match="only d_0 and d_M"):
        FreeAxisLinear((6, 3, 4), (6, 2, 4))


def test_mnist_inr_configuration_has_about_550k_parameters():
    cfg = dwsnet_mnist_inr_config()
    model = DWSNetInvariant(**cfg)
    assert cfg["widths"] == (2, 32, 32, 1) and cfg["num_layers"] == 4 and cfg["pool"] == "max"
    assert abs(count(model) - 550_000) < 0.05 * 550_000
    ws = random_ws(cfg["widths"], batch=4, dtype=torch.float32)
    assert model(ws).shape == (4, 10)


def test_ablations_are_ordered_by_size_like_the_paper():
    cfg = dwsnet_mnist_inr_config()
    sizes = {b: count(DWSNetInvariant(**cfg, blocks=b)) for b in BLOCKS}
    assert sizes["B2B"] < sizes["W2W"] < sizes["W2W+B2B"] < sizes["all"]
    assert sizes["diagonal"] < sizes["all"]


def test_models_accept_inputs_with_or_without_channel_axis():
    widths = (2, 4, 3, 1)
    model = DWSNetInvariant(widths, 2, hidden_channels=3).double().eval()
    ws = random_ws(widths, batch=3)
    assert torch.allclose(model(ws), model(ws.with_channels()))
    with pytest.raises(ValueError, match="widths"):
        model(random_ws((2, 4, 4, 1), batch=3))


@pytest.mark.parametrize("backend", ("plain", "auto"))
def test_reference_model_computes_the_same_function(backend):
    cfg = dwsnet_mnist_inr_config()
    cfg.update(hidden_channels=6, head_hidden=8)
    model = DWSNetInvariant(**cfg).double()
    ref = with_reference_layers(copy.deepcopy(model))
    accelerate(model, backend)
    ws = random_ws(cfg["widths"], batch=5)
    assert torch.allclose(model(ws), ref(ws), atol=1e-10)


def test_batchnorm_normalizes_each_tensor_and_dropout_respects_mode():
    widths = (2, 4, 3, 1)
    ws = random_ws(widths, batch=16, channels=3).map(lambda t: 5 * t + 2)
    out = WSBatchNorm(3, 3).double()(ws)
    for t in out.weights + out.biases:
        flat = t.reshape(-1, 3)
        assert torch.allclose(flat.mean(0), torch.zeros(3, dtype=torch.float64), atol=1e-8)
        assert torch.allclose(flat.std(0, unbiased=False), torch.ones(3, dtype=torch.float64), atol=1e-3)
    drop = WSDropout(0.5)
    dropped = drop(ws)
    assert (dropped.flatten() == 0).float().mean() > 0.3
    drop.eval()
    assert drop(ws) is ws


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
def test_batchnorm_relu_in_place_matches_torch(dtype, tol):
    widths = (2, 5, 4, 1)
    ws = random_ws(widths, batch=7, channels=3, dtype=dtype).map(lambda t: (3 * t + 1).requires_grad_())
    fused = WSBatchNorm(3, 3, relu=True).to(dtype)
    plain = copy.deepcopy(fused)
    plain.relu = False
    with torch.no_grad():
        for bn in list(fused.weight_norms) + list(fused.bias_norms):
            bn.weight.uniform_(0.5, 2)
            bn.bias.uniform_(-1, 1)
    plain.load_state_dict(fused.state_dict())
    out_f, out_p = fused(ws), plain(ws).map(torch.relu)
    assert max_abs_diff(out_f, out_p) < tol
    grads = []
    for out, mod in [(out_f, fused), (out_p, plain)]:
        loss = (out.flatten() * torch.linspace(-1, 1, out.flatten().shape[1], dtype=dtype)[:, None]).sum()
        inputs = list(ws.weights + ws.biases) + list(mod.parameters())
        grads.append(torch.autograd.grad(loss, inputs))
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=tol, rtol=tol)
    for a, b in zip(fused.state_dict().values(), plain.state_dict().values()):
        assert torch.allclose(a.to(dtype), b.to(dtype), atol=tol)  # running statistics


def test_batchnorm_trains_on_a_single_network():
    """A last training batch of one network leaves one value per channel in ``b_M``: no error."""
    model = DWSNetInvariant((2, 4, 3, 1), 3, hidden_channels=4, num_layers=2)
    out = model(random_ws((2, 4, 3, 1), batch=1, channels=1, dtype=torch.float32))
    out.sum().backward()
    assert torch.isfinite(out).all()


def test_training_step_reduces_loss():
    torch.manual_seed(0)
    widths = (2, 8, 8, 1)
    model = DWSNetInvariant(widths, 2, hidden_channels=8, head_hidden=16)
    ws = random_ws(widths, batch=32, dtype=torch.float32, seed=2)
    y = (ws.weights[1].sum((1, 2)) > 0).long()
    losses = adam_losses(model, ws, y, steps=30, lr=1e-2)
    assert losses[-1] < 0.5 * losses[0]
