"""``--input-reduction`` for the newer models (:class:`dws.nn.reduction.InputReduced`): the bias-free
``LIN(d_0, d_0')`` in front of the NFNs, the neural graphs and ScaleGMN keeps each model's claimed
symmetry, on random architectures of wide inputs, with test_scalegmn's group action written on the raw
tensors; controls that the reduced models are not trivially invariant (another input, permuted input
neurons, a scaling not claimed all change the output); sizes and refusals."""

from __future__ import annotations

import random

import pytest
import torch

from dws.baselines import count_params
from dws.tasks.models import build_model
from dws_helpers import derange, random_ws
from test_scalegmn import act, hidden_element, identity

NEWER = ("nfn-np", "nfn-hnp", "ng-gnn", "ng-transformer", "scalegmn", "scalegmn-b")
REDUCED_TO = 3


def wide_widths(seed: int) -> tuple[int, ...]:
    """``d_0`` of 8-12 inputs (to be reduced to 3), 1-3 hidden layers of 2-5 neurons, 1-3 outputs."""
    rng = random.Random(seed)
    return (rng.randint(8, 12), *(rng.randint(2, 5) for _ in range(rng.randint(1, 3))), rng.randint(1, 3))


def reduced_model(name: str, widths, activation: str, seed: int):
    torch.manual_seed(seed)
    model, desc = build_model(name, widths, 3, hidden_channels=8, input_reduction=REDUCED_TO, activation=activation)
    return model.double().eval(), desc


def claimed_scaling(name: str, activation: str) -> str | None:
    """The scaling a model claims besides hidden permutations: ScaleGMN's follows the activation."""
    return ("sign" if activation == "sine" else "scale") if name.startswith("scalegmn") else None


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("activation", ["sine", "relu"])
@pytest.mark.parametrize("name", NEWER)
def test_a_reduced_model_keeps_the_symmetry_it_claims(name, activation, seed):
    gen = torch.Generator().manual_seed(300 + seed)
    widths = wide_widths(300 + seed)
    model, _ = reduced_model(name, widths, activation, seed)
    x = random_ws(widths, 4, seed=seed)
    y = model(x)
    assert y.shape == (4, 3)
    torch.testing.assert_close(model(act(x, *hidden_element(widths, 4, gen, None))), y, rtol=1e-8, atol=1e-9)
    claim = claimed_scaling(name, activation)
    if claim is not None:
        torch.testing.assert_close(model(act(x, *hidden_element(widths, 4, gen, claim))), y, rtol=1e-7, atol=1e-8)
    # controls (float64: the invariances above hold to ~1e-13, these changes are 4e-6 or more): another
    # input changes the output, and so does a scaling of hidden neurons that the model does not claim
    assert not torch.allclose(model(random_ws(widths, 4, seed=seed + 50)), y, rtol=0, atol=1e-7)
    other = "scale" if claim == "sign" else "sign"
    assert not torch.allclose(model(act(x, *hidden_element(widths, 4, gen, other))), y, rtol=0, atol=1e-7), \
        f"{name} must not be invariant to {other} changes of hidden neurons"


@pytest.mark.parametrize("widths", [(10, 5, 3), (9, 4, 2)])
@pytest.mark.parametrize("name", NEWER)
def test_permuting_the_input_neurons_changes_a_reduced_model_s_output(name, widths):
    """The learned map mixes the input neurons, so a reduced model is not invariant to their permutation
    (one hidden layer, where ScaleGMN's forward variant hears its inputs at the outputs clearly enough)."""
    gen = torch.Generator().manual_seed(5)
    model, _ = reduced_model(name, widths, "sine", 0)
    x = random_ws(widths, 4, seed=5)
    perms, factors = identity(widths, 4)
    perms[0] = derange(widths[0], gen)
    assert not torch.allclose(model(act(x, perms, factors)), model(x), rtol=0, atol=1e-7)


@pytest.mark.parametrize("name", NEWER)
def test_the_reduction_is_bias_free_and_the_model_behind_it_sees_the_reduced_inputs(name):
    widths = (20, 6, 5, 2)
    model, desc = reduced_model(name, widths, "relu", 0)
    assert model.reduce.inputs.weight.shape == (REDUCED_TO, 20) and model.reduce.inputs.bias is None
    assert model.reduce.outputs is None  # the output neurons stay as they are
    seen = []
    model.model.register_forward_pre_hook(lambda _, args: seen.append(args[0].widths))
    model(random_ws(widths, 2))
    assert tuple(seen[0]) == (REDUCED_TO, 6, 5, 2)
    assert desc["params"] == count_params(model)
    if name.startswith("nfn"):  # sized, with the reduction, to the DWSNet that reduces the same way
        assert abs(desc["params"] - desc["sized_to"]) <= 0.15 * desc["sized_to"], desc


@pytest.mark.parametrize("name", NEWER + ("dwsnet", "mlp", "mlp-align"))
def test_a_reduction_that_does_not_reduce_is_refused_in_one_line(name):
    """The DWSNet's own LIN(d_0, d_0') too (and the baselines sized to it): a map to as many inputs or more
    would add parameters, not save them; before, the DWSNet took --input-reduction 16 on 2-input INRs."""
    for reduced_to in (4, 9, 0):
        with pytest.raises(ValueError, match=f"--input-reduction {reduced_to} must be between 1 and the networks' 4"):
            build_model(name, (4, 5, 2), 3, hidden_channels=4, input_reduction=reduced_to, activation="relu")
    assert build_model(name, (4, 5, 2), 3, hidden_channels=4, input_reduction=3, activation="relu")[1]["params"] > 0


def test_zoo_train_reduces_a_classifier_zoo_s_inputs_for_scalegmn_and_reevaluates_the_run(mnist_classifier_zoo,
                                                                                          tmp_path):
    """The generalization column's cell in small: ScaleGMN on ReLU classifiers (positive scaling) behind
    LIN(784, 8); the run's checkpoint holds the map, and zoo eval of the run gives its test metrics again."""
    import json

    from click.testing import CliRunner

    from cli import main
    from dws.tasks.rundir import evaluate_run

    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["train", str(mnist_classifier_zoo), "--model", "scalegmn", "--task", "regress",
                                       "--target", "test_accuracy", "--epochs", "1", "--lr", "1e-3",
                                       "--batch-size", "8", "--hidden-channels", "2", "--input-reduction", "8",
                                       "--precise-bn", "0", "--out", str(out)])
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["symmetry"] == "scale"
    state = torch.load(out / "best.pt", map_location="cpu", weights_only=False)
    weights = state["state_dict"]  # (the model inside the regression's TargetScale: "inner.")
    assert tuple(weights["inner.reduce.inputs.weight"].shape) == (8, 784)
    assert not any(k.startswith("inner.reduce.") and k.endswith("bias") for k in weights)
    test = json.loads((out / "metrics.json").read_text())["test"][0]
    again = evaluate_run(out, mnist_classifier_zoo)
    assert again["mse"] == pytest.approx(test["mse"], rel=1e-6)
