"""ScaleGMN (dws/scalegmn): invariance to hidden-neuron permutations and to the activation's scaling
(sign flips for sine/tanh, positive scalings for ReLU) on random architectures, with a group action
written here on the raw tensors; controls that the model is not trivially invariant; a training step;
the activation read from the store; `zoo train --model scalegmn` through the CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dws.scalegmn import ScaleGMNInvariant
from dws.scalegmn.equivariant import EquivariantMap
from dws.scalegmn.symmetry import SignSymmetrization
from dws.weightspace import WeightSpace, mlp_forward
from dws_helpers import adam_losses, derange, random_widths, random_ws

VARIANTS = ("forward", "bidirectional")
SYMMETRIES = ("sign", "scale")


def act(ws: WeightSpace, perms, factors) -> WeightSpace:
    """Neuron ``i`` of layer ``l`` becomes old neuron ``perms[l][i]`` times ``factors[l][i]`` (``[B, n_l]``):
    ``W_l'[i, j] = q_l[i] W_l[p_l[i], p_{l-1}[j]] / q_{l-1}[j]``, ``b_l'[i] = q_l[i] b_l[p_l[i]]``."""
    weights = tuple(w[:, perms[l + 1]][:, :, perms[l]] * factors[l + 1][:, :, None] / factors[l][:, None, :]
                    for l, w in enumerate(ws.weights))
    biases = tuple(b[:, perms[l + 1]] * factors[l + 1] for l, b in enumerate(ws.biases))
    return WeightSpace(weights, biases)


def hidden_element(widths, batch, gen, kind):
    """Random hidden permutations and per-network factors: ``kind`` "sign" (+-1), "scale" (log-uniform
    in [0.1, 10]) or None (1); input and output neurons stay where they are, unscaled."""
    last = len(widths) - 1
    perms = [torch.arange(d) if l in (0, last) else torch.randperm(d, generator=gen) for l, d in enumerate(widths)]
    factors = []
    for l, d in enumerate(widths):
        q = torch.ones(batch, d, dtype=torch.float64)
        if 0 < l < last and kind == "sign":
            q = torch.randint(0, 2, (batch, d), generator=gen).double() * 2 - 1
        elif 0 < l < last and kind == "scale":
            q = torch.exp(torch.empty(batch, d, dtype=torch.float64).uniform_(math.log(0.1), math.log(10), generator=gen))
        factors.append(q)
    return perms, factors


def identity(widths, batch):
    return [torch.arange(d) for d in widths], [torch.ones(batch, d, dtype=torch.float64) for d in widths]


def small_model(widths, symmetry, variant, seed, hidden=6):
    torch.manual_seed(seed)
    return ScaleGMNInvariant(widths, 3, symmetry, variant, hidden=hidden, num_layers=3).double().eval()


@pytest.mark.parametrize("activation,kind", [(torch.sin, "sign"), (torch.tanh, "sign"), (torch.relu, "scale")])
def test_the_group_action_of_the_test_keeps_each_network_s_function(activation, kind):
    gen = torch.Generator().manual_seed(1)
    widths = (3, 5, 4, 2)
    x = random_ws(widths, 2, seed=1)
    inputs = torch.randn(7, 3, generator=gen, dtype=torch.float64)
    moved = act(x, *hidden_element(widths, 2, gen, kind))
    torch.testing.assert_close(mlp_forward(moved, inputs, activation), mlp_forward(x, inputs, activation))
    if kind == "scale":  # ...and a sign flip changes a ReLU network's function
        flipped = act(x, *hidden_element(widths, 2, gen, "sign"))
        assert not torch.allclose(mlp_forward(flipped, inputs, torch.relu), mlp_forward(x, inputs, torch.relu))


@pytest.mark.parametrize("symmetry", SYMMETRIES)
def test_the_equivariant_map_scales_with_hidden_features(symmetry):
    gen = torch.Generator().manual_seed(2)
    torch.manual_seed(0)
    f = EquivariantMap(5, 4, symmetry, hidden=7, d_extra=3).double()
    x, extra = torch.randn(6, 5, generator=gen, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    q = (torch.randint(0, 2, (6, 1), generator=gen).double() * 2 - 1 if symmetry == "sign"
         else torch.rand(6, 1, generator=gen, dtype=torch.float64) * 10 + 0.1)
    torch.testing.assert_close(f(q * x, extra, hidden=True), q * f(x, extra, hidden=True))
    assert not torch.allclose(f(q * x, extra, hidden=False), q * f(x, extra, hidden=False))  # I/O: no claim


def test_sign_symmetrization_is_rho_of_x_plus_rho_of_minus_x():
    torch.manual_seed(0)
    s = SignSymmetrization(5).double()
    rho = torch.nn.Sequential(s.first, s.norm, torch.nn.SiLU(), s.last)
    x = torch.randn(4, 5, dtype=torch.float64)
    torch.testing.assert_close(s(x), rho(x) + rho(-x))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("symmetry", SYMMETRIES)
@pytest.mark.parametrize("seed", range(3))
def test_the_model_is_invariant_to_hidden_permutations_and_its_scalings(variant, symmetry, seed):
    gen = torch.Generator().manual_seed(100 + seed)
    widths = random_widths(100 + seed, max_layers=4, max_width=6)
    model = small_model(widths, symmetry, variant, seed)
    x = random_ws(widths, 4, seed=seed)
    y = model(x)
    assert y.shape == (4, 3)
    torch.testing.assert_close(model(act(x, *hidden_element(widths, 4, gen, None))), y, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(model(act(x, *hidden_element(widths, 4, gen, symmetry))), y, rtol=1e-8, atol=1e-9)
    # controls: another input changes the output; so do the scalings the model does not claim
    assert not torch.allclose(model(random_ws(widths, 4, seed=seed + 50)), y)
    other = "scale" if symmetry == "sign" else "sign"
    assert not torch.allclose(model(act(x, *hidden_element(widths, 4, gen, other))), y, atol=1e-6), \
        f"a {symmetry} model must not be invariant to {other} changes"


@pytest.mark.parametrize("variant", VARIANTS)
def test_permuting_input_or_output_neurons_changes_the_output(variant):
    """Input and output neurons have their own positional embeddings: no invariance claimed there. (At
    initialization the forward variant hears its inputs faintly at the outputs, ~1e-6 here; the bound is
    1000x the invariance tests' tolerance.)"""
    gen = torch.Generator().manual_seed(7)
    widths = (4, 5, 3)
    model = small_model(widths, "sign", variant, 0)
    x = random_ws(widths, 3, seed=7)
    y = model(x)
    for end in (0, -1):
        perms, factors = identity(widths, 3)
        perms[end] = derange(widths[end], gen)
        assert not torch.allclose(model(act(x, perms, factors)), y, rtol=0, atol=1e-7), f"neurons of layer {end} permuted"


def test_a_relu_model_is_not_invariant_to_a_single_sign_flip():
    widths = (3, 6, 5, 2)
    x = random_ws(widths, 2, seed=8)
    perms, factors = identity(widths, 2)
    factors[2][:, 2] = -1  # flip neuron 2 of the last hidden layer in both networks: a ReLU network's function changes
    for variant in VARIANTS:
        model = small_model(widths, "scale", variant, 1)
        assert not torch.allclose(model(act(x, perms, factors)), model(x), rtol=0, atol=1e-7), variant


def test_a_training_step_lowers_the_loss():
    gen = torch.Generator().manual_seed(9)
    widths = (2, 8, 8, 1)
    x = random_ws(widths, 16, seed=9, dtype=torch.float32)
    labels = torch.randint(0, 3, (16,), generator=gen)
    torch.manual_seed(0)
    model = ScaleGMNInvariant(widths, 3, "sign", "bidirectional", hidden=8, num_layers=2)
    losses = adam_losses(model, x, labels, steps=8, lr=1e-2)
    assert losses[-1] < losses[0] - 0.02, losses


def check_784_inputs_at_batch_8(name, hidden_channels, width, input_reduction):
    from dws.tasks.models import build_model

    model, desc = build_model(name, (784, 32, 32, 10), 1, hidden_channels=hidden_channels,
                              input_reduction=input_reduction, activation="relu")
    assert desc["symmetry"] == "scale" and desc["width"] == width, desc
    x = random_ws((784, 32, 32, 10), 8, dtype=torch.float32).map(lambda t: 0.1 * t)
    y = model(x)
    y.square().mean().backward()
    assert y.shape == (8, 1) and torch.isfinite(y).all()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert all(torch.isfinite(g).all() for g in grads)
    inner = model if input_reduction is None else model.model  # behind the bias-free LIN(784, 16)
    assert inner.init.edge_proj.weight.grad.abs().sum() > 0  # the loss reaches the input weights
    if input_reduction is not None:
        assert model.reduce.inputs.weight.shape == (input_reduction, 784) and model.reduce.inputs.bias is None
        assert model.reduce.inputs.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("input_reduction", [None, 16])
@pytest.mark.parametrize("name", ["scalegmn", "scalegmn-b"])
def test_a_classifier_zoo_of_784_inputs_runs_at_batch_8(name, input_reduction):
    """Hundreds of input neurons: dense per layer pair (here d = 11, --hidden-channels 4); or the
    generalization column's 16, through --input-reduction."""
    check_784_inputs_at_batch_8(name, 4, 11, input_reduction)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["scalegmn", "scalegmn-b"])
def test_a_classifier_zoo_of_784_inputs_runs_at_batch_8_at_the_default_size(name):
    """The classifier zoo's defaults (16 DWSNet channels, --input-reduction 16: the generalization column's
    cells) give d = 43."""
    check_784_inputs_at_batch_8(name, 16, 43, 16)


@pytest.mark.parametrize("name", ["scalegmn", "scalegmn-b"])
def test_at_the_default_size_784_unreduced_inputs_are_refused_in_one_line(name):
    """Unreduced, the DWSNet a ScaleGMN is sized to would have ~1e9 parameters at 16 channels: refused before
    anything is built, with the way out (counted on the meta device, so this runs in the fast suite)."""
    from dws.tasks.models import build_model

    with pytest.raises(ValueError) as refused:
        build_model(name, (784, 32, 32, 10), 1, hidden_channels=16, activation="relu")
    message = str(refused.value)
    assert "would have 995,923,873 parameters (more than 200,000,000); pass --input-reduction N" in message
    assert "\n" not in message


def test_build_model_follows_the_activation_and_refuses_unknown_ones():
    from dws.tasks.models import build_model

    for activation, symmetry in (("sine", "sign"), ("tanh", "sign"), ("relu", "scale")):
        model, desc = build_model("scalegmn", (2, 32, 32, 1), 10, activation=activation)
        assert model.symmetry == symmetry and desc["width"] == 128 and desc["params"] > 0, desc
    for activation in (None, "gelu", "per network: column activation"):
        with pytest.raises(ValueError, match="scaling symmetry"):
            build_model("scalegmn-b", (2, 32, 32, 1), 10, activation=activation)


def test_adapt_is_refused_in_one_line(tiny_store):
    from dws.tasks.options import TrainOptions, check_options

    with pytest.raises(ValueError, match="outputs a vector"):
        check_options(TrainOptions(store=str(tiny_store), model="scalegmn", task="adapt"))


def test_zoo_train_runs_scalegmn_and_reevaluates_it(tiny_store, tmp_path):
    from click.testing import CliRunner

    from cli import main
    from dws.tasks.rundir import evaluate_run

    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["train", str(tiny_store), "--model", "scalegmn", "--epochs", "2", "--lr", "1e-3",
                                       "--batch-size", "16", "--hidden-channels", "2", "--precise-bn", "0",
                                       "--out", str(out)])
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["model"] == "scalegmn" and config["model"]["symmetry"] == "sign"
    assert len(json.loads((out / "metrics.json").read_text())["history"][0]) == 2
    metrics = json.loads((out / "metrics.json").read_text())
    again = evaluate_run(out, tiny_store)
    assert again["accuracy"] == pytest.approx(metrics["test"][0]["accuracy"], abs=1e-6)
