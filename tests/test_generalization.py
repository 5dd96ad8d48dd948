"""Generalization prediction on classifier zoos: the weight-statistics baseline, Kendall's tau, the
networks left out for their status, ``--input-reduction`` and the ``zoo train`` path end to end."""

from __future__ import annotations

import csv
import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner

from cli import main
from generate_helpers import replace_networks_table
from dws.baselines.stats import STATISTICS, WeightStatistics, feature_names, quantiles, weight_statistics
from dws.stream import Normalizer, WeightStoreLoader
from dws.stream.batch import weightspace_from_arrays
from dws.tasks.models import build_model
from dws.tasks.objectives import get_task, kendall_tau
from dws.tasks.options import TrainOptions
from dws.tasks.run import train_run
from dws.tasks.rundir import evaluate_run
from dws.weightspace import random_group_element
from zoo.store import WeightStore

WIDTHS = (784, 128, 128, 128, 10)
DIVERGED = [20, 21, 28, 29, 38]  # two train runs' last checkpoints and one test checkpoint (test = 35..39)
QUICK = ["--task", "regress", "--target", "test_accuracy", "--input-reduction", "4", "--hidden-channels", "6",
         "--epochs", "1", "--lr", "1e-3", "--batch-size", "8", "--no-augment", "--precise-bn", "8"]


def marked_diverged(source, store, indices):
    """A copy of ``source`` whose networks ``indices`` are marked as the generator marks a diverged run's checkpoints."""
    shutil.copytree(source, store)
    table = pq.read_table(store / "networks.parquet")
    hit = pc.is_in(table.column("index"), value_set=pa.array(indices, pa.int64()))
    table = table.set_column(table.schema.get_field_index("status"), "status",
                             pc.if_else(hit, pa.scalar("diverged"), table.column("status")))
    table = table.set_column(table.schema.get_field_index("test_accuracy"), "test_accuracy",
                             pc.if_else(hit, pa.scalar(None, pa.float32()), table.column("test_accuracy")))
    replace_networks_table(store, table)
    return store


@pytest.fixture(scope="module")
def with_diverged(mnist_classifier_zoo, tmp_path_factory):
    return marked_diverged(mnist_classifier_zoo, tmp_path_factory.mktemp("diverged") / "store", DIVERGED)


def _networks(store, start, stop, step=1):
    arrays = WeightStore(store).read(start, stop)
    return weightspace_from_arrays({name: values[::step] for name, values in arrays.items()})


# --- the weight-statistics baseline --------------------------------------------------------------

def test_weight_statistics_are_those_of_each_tensor(mnist_classifier_zoo):
    ws = _networks(mnist_classifier_zoo, 4, 6)
    features = weight_statistics(ws)
    assert features.shape == (2, len(STATISTICS) * 8) and len(feature_names(4)) == features.shape[1]
    for column, tensor in ((0, ws.weights[0]), (len(STATISTICS) * 7, ws.biases[3])):
        values = tensor[1].double().flatten().numpy()
        expected = [values.mean(), values.var(), *np.quantile(values, [0, 0.25, 0.5, 0.75, 1])]
        np.testing.assert_allclose(features[1, column:column + len(STATISTICS)].double().numpy(), expected,
                                   rtol=1e-5, atol=1e-7)


def test_both_sorts_give_the_same_quantiles():
    values = torch.randn(3, 1001, generator=torch.Generator().manual_seed(0))
    expected = torch.quantile(values.double(), torch.tensor([0, 0.25, 0.5, 0.75, 1], dtype=torch.float64), dim=1).T
    torch.testing.assert_close(quantiles(values).double(), expected)  # numpy's sort (CPU, no gradient)
    torch.testing.assert_close(quantiles(values.requires_grad_()).double(), expected)  # torch.sort


def test_weight_statistics_are_invariant_to_hidden_permutations(mnist_classifier_zoo):
    """Random hidden-neuron permutations of real classifiers give the same features, and the model
    (which undoes the loaders' per-entry normalization first) the same outputs."""
    ws = _networks(mnist_classifier_zoo, 0, 40, 4)  # 10 networks of all runs, initializations and trained ones
    perms = random_group_element(ws.widths, batch_size=ws.batch_size, generator=torch.Generator().manual_seed(3))
    moved = ws.permute(perms)
    assert not torch.equal(moved.weights[1], ws.weights[1])  # the permutation moved entries
    features = weight_statistics(ws)
    torch.testing.assert_close(weight_statistics(moved), features, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(features[0], features[1])  # networks differ

    store = WeightStore(mnist_classifier_zoo)
    normalize = Normalizer.from_store(store).normalize
    model = WeightStatistics(WIDTHS, 1, hidden=16)
    model.prepare_store(store, mnist_classifier_zoo, log=lambda *_: None)
    model.train()
    model(normalize(ws))  # batch-norm statistics from the batch
    model.eval()
    torch.testing.assert_close(model(normalize(moved)), model(normalize(ws)), rtol=1e-4, atol=1e-5)
    # per-entry normalization alone is not invariant: the model's answer is undoing it
    assert not torch.allclose(weight_statistics(normalize(moved)), weight_statistics(normalize(ws)), rtol=1e-3)


# --- Kendall's tau -------------------------------------------------------------------------------

@pytest.mark.parametrize("x, y, tau", [
    ([1, 2, 3, 4, 5], [1, 3, 2, 5, 4], 0.6),  # 8 concordant, 2 discordant pairs of 10
    ([1, 2, 2, 3], [1, 2, 3, 3], 0.8),  # tau-b: 4 concordant / sqrt((6 - 1) * (6 - 1)), one tie on each side
    ([3, 2, 1], [1, 2, 3], -1.0),
])
def test_kendall_tau_on_known_cases(x, y, tau):
    from scipy.stats import kendalltau

    x, y = torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32)
    assert kendall_tau(x, y) == pytest.approx(tau)
    assert kendall_tau(x, y) == pytest.approx(kendalltau(x.numpy(), y.numpy()).statistic)
    metrics = get_task("regress", "test_accuracy").metrics(x.view(-1, 1), y, None)
    assert metrics["kendall_tau"] == pytest.approx(tau) and metrics["mse"] == pytest.approx(float(((x - y) ** 2).mean()))


def test_several_targets_get_no_kendall_tau():
    metrics = get_task("regress", "amplitude,frequency").metrics(torch.zeros(4, 2), torch.ones(4, 2), None)
    assert "kendall_tau" not in metrics and metrics["mse"] == 1.0


# --- networks that did not train normally --------------------------------------------------------

@pytest.mark.parametrize("in_memory", [True, False], ids=["in-memory", "streaming"])
def test_loaders_leave_out_networks_whose_status_is_not_ok(with_diverged, in_memory):
    with pytest.raises(ValueError, match="'test_accuracy' is missing"):  # the rows really have no accuracy
        WeightStoreLoader(with_diverged, "train", target="test_accuracy", only_ok=False)
    loader = WeightStoreLoader(with_diverged, "train", target="test_accuracy", batch_size=7, in_memory=in_memory)
    assert loader.num_networks == 26 and dict(loader.excluded) == {"diverged": 4} and len(loader) == 4
    batches = list(loader)
    seen = torch.cat([b.index for b in batches])
    assert sorted(seen.tolist()) == [i for i in range(30) if i not in DIVERGED]
    accuracy = WeightStore(with_diverged).networks.column("test_accuracy").to_numpy(zero_copy_only=False)
    assert torch.equal(torch.cat([b.target for b in batches]), torch.from_numpy(accuracy[seen.numpy()]))
    clean = loader.variant(shuffle=False)
    assert torch.equal(torch.cat([b.index for b in clean]), torch.tensor(sorted(seen.tolist())))
    raw = WeightStoreLoader(with_diverged, "train", target="test_accuracy", batch_size=7, in_memory=in_memory,
                            normalize=False, buffer_chunks=3)
    first = WeightStore(with_diverged).read(0, 30)["W1"]
    for batch in raw:  # each network's weights travel with its index through the left-out rows
        assert torch.equal(batch.ws.weights[0], torch.from_numpy(first[batch.index.numpy()]))


def test_training_and_evaluation_leave_them_out_and_say_so(with_diverged, tmp_path):
    lines = []
    metrics = train_run(TrainOptions(store=str(with_diverged), model="stats", task="regress", target="test_accuracy",
                                     epochs=1, lr=1e-3, batch_size=8, hidden_channels=6, input_reduction=4,
                                     augment=False, out=str(tmp_path / "run"), progress=False), log=lines.append)
    assert any("4 of 30 train networks left out (status: diverged 4)" in line for line in lines), lines
    assert any("1 of 5 test networks left out (status: diverged 1)" in line for line in lines), lines
    assert not any("val networks left out" in line for line in lines)
    with open(tmp_path / "run" / "test_predictions.csv") as f:
        assert [int(r["index"]) for r in csv.DictReader(f)] == [35, 36, 37, 39]
    assert np.isfinite(metrics["test"][0]["mse"])
    again = evaluate_run(tmp_path / "run", with_diverged)
    assert again["networks"] == 4 and again["excluded"] == {"diverged": 1}
    assert again["mse"] == pytest.approx(metrics["test"][0]["mse"], rel=1e-5)


def test_a_split_without_a_normal_network_is_refused_before_anything_is_written(mnist_classifier_zoo, tmp_path):
    store = marked_diverged(mnist_classifier_zoo, tmp_path / "store", list(range(30, 35)))  # the whole val split
    run = tmp_path / "runs" / "run"
    result = CliRunner().invoke(main, ["train", str(store), "--model", "stats", "--out", str(run), *QUICK])
    assert result.exit_code == 2, result.output
    assert "no network of split 'val' trained normally (status: {'diverged': 5})" in result.output
    assert not (tmp_path / "runs").exists()


# --- --input-reduction ----------------------------------------------------------------------------

def test_input_reduction_sets_the_dwsnet_and_the_size_of_the_baselines():
    dws, desc = build_model("dwsnet", WIDTHS, 1, hidden_channels=16, input_reduction=16)
    assert desc["params"] == 1_751_761 and dws.reduce.__class__.__name__ != "Identity"  # the paper's d0' = 16
    mlp, mlp_desc = build_model("mlp", WIDTHS, 1, hidden_channels=16, input_reduction=16)
    assert mlp_desc["sized_to"] == 1_751_761 and abs(mlp_desc["params"] / 1_751_761 - 1) < 0.15
    with pytest.raises(ValueError, match="pass --input-reduction N"):  # 998M parameters without it
        build_model("mlp", WIDTHS, 1, hidden_channels=16)


def test_a_bad_input_reduction_is_refused_before_anything_is_written(mnist_classifier_zoo, tmp_path):
    run = tmp_path / "run"
    result = CliRunner().invoke(main, ["train", str(mnist_classifier_zoo), "--out", str(run), "--input-reduction", "0"])
    assert result.exit_code == 2 and "--input-reduction must be at least 1" in result.output
    assert not run.exists()


# --- zoo train / zoo eval on a classifier store ---------------------------------------------------

@pytest.mark.parametrize("model", ["dwsnet", "stats", "mlp-perm", "mlp-align", "transformer"])
def test_zoo_train_regresses_test_accuracy_and_zoo_eval_agrees(mnist_classifier_zoo, tmp_path, model):
    run = tmp_path / model
    result = CliRunner().invoke(main, ["train", str(mnist_classifier_zoo), "--model", model, "--out", str(run), *QUICK])
    assert result.exit_code == 0, result.output
    metrics = json.loads((run / "metrics.json").read_text())
    test = metrics["test"][0]
    assert np.isfinite(test["mse"])
    assert -1 <= test["kendall_tau"] <= 1 or np.isnan(test["kendall_tau"])  # NaN: constant predictions
    assert (run / "predictions.png").read_bytes()[:4] == b"\x89PNG"
    with open(run / "test_predictions.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["index"]) for r in rows] == list(range(35, 40))
    predicted, actual = (np.array([float(r[k]) for r in rows]) for k in ("prediction", "target"))
    assert np.mean((predicted - actual) ** 2) == pytest.approx(test["mse"], rel=1e-4)
    evaluated = CliRunner().invoke(main, ["eval", str(run), str(mnist_classifier_zoo)])
    assert evaluated.exit_code == 0, evaluated.output
    assert json.loads(evaluated.output)["mse"] == pytest.approx(test["mse"], rel=1e-4)


# --- standardized targets --------------------------------------------------------------------------

def test_regression_models_predict_standardized_targets_in_the_targets_units(with_diverged, tmp_path):
    from dws.tasks.models import TargetScale
    from dws.tasks.rundir import load_run

    accuracy = WeightStore(with_diverged).networks.column("test_accuracy").to_numpy(zero_copy_only=False)[:30]
    learned = accuracy[~np.isnan(accuracy.astype(np.float64))].astype(np.float64)  # the diverged rows: none
    options = dict(store=str(with_diverged), model="mlp-align", task="regress", target="test_accuracy", epochs=1,
                   lr=1e-3, batch_size=8, hidden_channels=6, input_reduction=4, augment=False, progress=False)
    metrics = train_run(TrainOptions(**options, out=str(tmp_path / "std")), log=lambda *_: None)
    run = load_run(tmp_path / "std")
    (mean,), (std,) = run.config["model_kwargs"]["target_scale"]
    assert mean == pytest.approx(learned.mean()) and std == pytest.approx(learned.std())
    assert isinstance(run.model, TargetScale) and run.transform is not None  # mlp-align's hook passes through
    assert (tmp_path / "std" / "aligned-store").is_dir()
    ws = next(iter(run.loader(WeightStore(with_diverged), "test", 4))).ws
    torch.testing.assert_close(run.model(ws), mean + std * run.model.inner(ws))
    assert evaluate_run(tmp_path / "std", with_diverged)["mse"] == pytest.approx(metrics["test"][0]["mse"], rel=1e-5)

    train_run(TrainOptions(**options, out=str(tmp_path / "raw"), standardize_target=False), log=lambda *_: None)
    raw = load_run(tmp_path / "raw")
    assert "target_scale" not in raw.config["model_kwargs"] and not isinstance(raw.model, TargetScale)


def test_a_constant_target_keeps_a_unit_scale(mnist_classifier_zoo):
    store = WeightStore(mnist_classifier_zoo)
    (mean,), (std,) = get_task("regress", "lr").target_scale(store, 0, 30)  # one learning rate for every run
    assert std == 1.0 and mean == pytest.approx(5e-3)
    (_,), (std,) = get_task("regress", "test_accuracy").target_scale(store, 0, 1)  # one network: no spread
    assert std == 1.0
    means, stds = get_task("regress", "test_accuracy,step").target_scale(store, 0, 30)
    steps = store.networks.column("step").to_numpy()[:30].astype(np.float64)
    assert means[1] == pytest.approx(steps.mean()) and stds[1] == pytest.approx(steps.std())
