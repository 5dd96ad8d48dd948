"""The Fourier scale of the NFNs and neural graphs (dws.tasks.models): the NFN reference's scale acts on
raw weights, so on standardized inputs it is multiplied by the std the loader divided by; the neural
graphs' reference scales act on standardized weights and stay. The run records that std, so `zoo eval`
rebuilds the same model."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dws.nfn import FourierFeatures
from dws.nfn.encoding import NFN_REFERENCE_SCALE as S
from dws.tasks.models import build_model, nfn_fourier_scale, weight_spread

WIDTHS = (2, 5, 4, 3)


def fourier_scales(model: torch.nn.Module) -> list[float]:
    return [m.scale for m in model.modules() if isinstance(m, FourierFeatures)]


@pytest.mark.parametrize("name", ["nfn-np", "nfn-hnp"])
def test_nfn_scale_is_the_reference_times_the_weight_std(name):
    gen = torch.Generator().manual_seed(7)
    weight_std = float(torch.empty(1).uniform_(0.01, 0.2, generator=gen))
    model, desc = build_model(name, WIDTHS, 10, hidden_channels=8, num_layers=2, weight_std=weight_std)
    assert fourier_scales(model) == [pytest.approx(S * weight_std)]
    assert desc["fourier_scale"] == pytest.approx(S * weight_std)
    # raw weights (no std given): the reference's scale as is
    assert fourier_scales(build_model(name, WIDTHS, 10, hidden_channels=8, num_layers=2)[0]) == [S]


@pytest.mark.parametrize(("name", "reference"), [("ng-gnn", 3.0), ("ng-transformer", 1.0)])
def test_neural_graph_scales_stay_the_references(name, reference):
    """Their reference standardizes each layer inside the model before its Fourier map, as our loader does."""
    model, _ = build_model(name, WIDTHS, 10, hidden_channels=8, weight_std=0.03)
    assert fourier_scales(model) == [reference, reference]  # weights and biases


@pytest.mark.parametrize("bad", [0.0, -0.1, math.nan, math.inf])
def test_a_weight_std_that_is_no_std_is_refused(bad):
    with pytest.raises(ValueError, match="weight_std must be a positive number"):
        nfn_fourier_scale(bad)


def test_the_matched_scale_sees_the_references_frequencies():
    """FourierFeatures at scale ``S * s`` of ``(w - m) / s`` is the map at ``S`` of ``w - m``, draw for draw."""
    gen = torch.Generator().manual_seed(3)
    w = 0.03 * torch.randn(64, 1, generator=gen, dtype=torch.float64) + 0.01
    m, s = 0.01, float(w.std())
    torch.manual_seed(0)
    reference = FourierFeatures(1, 16, S).double()
    torch.manual_seed(0)
    ours = FourierFeatures(1, 16, nfn_fourier_scale(s)).double()
    # (the projections are drawn in float32: equal up to its rounding)
    torch.testing.assert_close(ours.encode((w - m) / s), reference.encode(w - m), rtol=0, atol=1e-5)
    # the reference scale on standardized weights is another function (the mismatch this fixes)
    assert not torch.allclose(reference.encode((w - m) / s), reference.encode(w - m), atol=1e-3)


def test_weight_spread_is_the_root_mean_square_std():
    stats = {"W1": (torch.zeros(3, 2), torch.full((3, 2), 2.0)), "b1": (torch.ones(3), torch.full((3,), 1.0)),
             "W2": (torch.zeros(1, 3), torch.tensor([[4.0, 0.5, 0.5]])), "b2": (torch.zeros(1), torch.tensor([1.0]))}
    expected = math.sqrt((6 * 4.0 + 3 * 1.0 + 16.0 + 0.25 + 0.25 + 1.0) / 13)
    assert weight_spread(stats) == pytest.approx(expected)


def test_the_run_records_the_scale_and_eval_rebuilds_it(tiny_store, tmp_path):
    from dws.tasks.options import TrainOptions
    from dws.tasks.prepare import prepare_run
    from dws.tasks.run import train_run
    from dws.tasks.rundir import evaluate_run, load_run
    from zoo.store import WeightStore

    out = tmp_path / "hnp"
    opts = TrainOptions(store=str(tiny_store), model="nfn-hnp", epochs=1, lr=1e-3, batch_size=16, hidden_channels=4,
                        out=str(out), progress=False)
    weight_std = weight_spread(WeightStore(tiny_store).stats())
    assert 0 < weight_std < 1  # a store's raw weights, not standardized ones
    assert prepare_run(opts, log=lambda *_: None).model_kwargs["weight_std"] == pytest.approx(weight_std)
    metrics = train_run(opts, log=lambda *_: None)
    config = json.loads((out / "config.json").read_text())
    assert config["model_kwargs"]["weight_std"] == pytest.approx(weight_std)
    assert config["model"]["fourier_scale"] == pytest.approx(S * weight_std)
    assert fourier_scales(load_run(out).model) == [pytest.approx(S * weight_std)]
    again = evaluate_run(out, tiny_store)
    assert again["accuracy"] == pytest.approx(metrics["test"][0]["accuracy"], abs=1e-6)
    assert again["loss"] == pytest.approx(metrics["test"][0]["loss"], rel=1e-5)

