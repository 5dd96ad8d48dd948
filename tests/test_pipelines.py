"""Every pipeline runs end to end at its tiny ``smoke`` scale and writes its report."""

import json
from pathlib import Path

import pytest

from pipelines import inr_classification, sine_regression

QUIET = dict(log=lambda *_: None)


def test_inr_classification_pipeline(tmp_path):
    report = inr_classification.run("smoke", tmp_path, workers=1, **QUIET)
    text = report.read_text()
    assert "85.71 ± 0.57" in text and "DWSNets" in text and "MLP" in text
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results) == {"mlp", "dwsnet"}
    assert all(0 <= r["accuracy"]["mean"] <= 1 for r in results.values())


FASHION = Path(__file__).resolve().parents[1].parent / "shared/data/fashion-mnist"


@pytest.mark.skipif(not (FASHION / "t10k-labels-idx1-ubyte.gz").is_file(), reason=f"{FASHION} not here")
def test_inr_classification_pipeline_makes_the_fashion_mnist_column(tmp_path):
    """``--dataset fmnist``: INRs of the official Fashion-MNIST files, the paper's F-MNIST column, its own
    report beside MNIST's; the MNIST-only ``xl`` scale is refused with the scales it has."""
    from zoo.store import WeightStore

    report = inr_classification.run("smoke", tmp_path, workers=1, models=["dwsnet"], dataset="fmnist", **QUIET)
    assert report.name == "report-fmnist.md" and not (tmp_path / "report.md").exists()
    text = report.read_text()
    assert "Fashion-MNIST INRs" in text and "67.06 ± 0.29" in text and "85.71" not in text
    assert 0 <= json.loads((tmp_path / "results-fmnist.json").read_text())["dwsnet"]["accuracy"]["mean"] <= 1
    assert WeightStore(tmp_path / "stores" / "smoke-fmnist-inr").manifest["kind"] == "fmnist-inr"
    with pytest.raises(ValueError, match="no xl scale for --dataset fmnist.*smoke, ci, full"):
        inr_classification.run("xl", tmp_path, workers=1, dataset="fmnist", **QUIET)


def test_a_pipeline_run_again_reuses_finished_models_and_retrains_changed_ones(tmp_path, monkeypatch):
    """What a multi-session full-scale run relies on: the rerun reuses each finished model trained
    with the same store and settings; --epochs / --seeds / --lr given on the command line change
    the settings, so those models train again (and the report records them)."""
    import sys

    from pipelines import common

    inr_classification.run("smoke", tmp_path, workers=1, **QUIET)
    first = json.loads((tmp_path / "results.json").read_text())
    trained = []
    real_train_run = common.train_run
    monkeypatch.setattr(common, "train_run", lambda opts, log: trained.append(opts.model) or real_train_run(opts, log))
    lines = []
    inr_classification.run("smoke", tmp_path, workers=1, log=lines.append)
    assert trained == [] and sum("reusing the finished run" in line for line in lines) == 2
    assert json.loads((tmp_path / "results.json").read_text()) == first

    scales = dict(inr_classification.SCALES)
    for bad in (["--epochs", "0"], ["--lr", "nan"], ["--seeds", "-1"]):  # refused before anything is made
        monkeypatch.setattr(sys, "argv", ["x", "--scale", "smoke", *bad])
        with pytest.raises(SystemExit):
            common.parse_args("", "out", scales)
        assert scales == inr_classification.SCALES
    monkeypatch.setattr(sys, "argv", ["x", "--scale", "smoke", "--epochs", "1", "--lr", "5e-3"])
    common.parse_args("", "out", scales)
    assert scales["smoke"].train == {**inr_classification.SCALES["smoke"].train, "epochs": 1, "lr": 5e-3}
    monkeypatch.setattr(inr_classification, "SCALES", scales)
    report = inr_classification.run("smoke", tmp_path, workers=1, models=["dwsnet"], **QUIET)
    assert trained == ["dwsnet"] and "'epochs': 1" in report.read_text()
    store = tmp_path / "stores" / "smoke-mnist-inr"
    moved = store.parent / "moved"
    store.rename(moved)  # another store (path) is another run, even with the same settings
    from dws.tasks.options import TrainOptions
    from dws.tasks.rundir import finished_run

    run_dir = tmp_path / "runs" / "smoke-mnist-inr-dwsnet-classify"
    options = dict(model="dwsnet", task="classify", out=str(run_dir), normalize=common.RECORDED_NORMALIZATION,
                   **scales["smoke"].train)
    assert finished_run(TrainOptions(store=str(moved), **options)) is None
    moved.rename(store)
    assert finished_run(TrainOptions(store=str(store), **options))["run_dir"] == str(run_dir)
    assert finished_run(TrainOptions(store=str(store), **{**options, "seed": 1})) is None
    # a run written before a speed-only option existed (--compile, 2026-11-27) is still this run; one
    # written before an option that changes results existed is not (its default may have moved)
    config_file = run_dir / "config.json"
    written = config_file.read_text()
    for dropped, same in (("compile", True), ("loader_workers", True), ("precise_bn", False)):
        config = json.loads(written)
        del config["options"][dropped]
        config_file.write_text(json.dumps(config))
        found = finished_run(TrainOptions(store=str(store), **options))
        assert (found is not None) == same, dropped
    config_file.write_text(written)


def test_sine_regression_pipeline(tmp_path):
    report = sine_regression.run("smoke", tmp_path, workers=1, **QUIET)
    assert (tmp_path / "mse_vs_train_size.png").stat().st_size > 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["dwsnet"]) == {"4", "16"}
    assert all(v["mean"] >= 0 for r in results.values() for v in r.values())
    assert "| 16 |" in report.read_text()


def test_ssl_pipeline(tmp_path):
    from pipelines import ssl_dense

    report = ssl_dense.run("smoke", tmp_path, workers=1, **QUIET)
    assert "1.39 ± 0.06" in report.read_text()
    for model in ("dwsnet", "mlp"):
        assert (tmp_path / f"tsne-{model}.png").stat().st_size > 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert all(r["probe_mse"]["mean"] > 0 for r in results.values())


@pytest.mark.parametrize("name", ["ablation", "bn_augmentation", "multiview"])
def test_dwsnet_variant_pipelines(tmp_path, name):
    import importlib

    module = importlib.import_module(f"pipelines.{name}")
    text = module.run("smoke", tmp_path, workers=1, **QUIET).read_text()
    for paper_value in list(module.PAPER.values())[:2]:
        assert paper_value in text
    assert text.count("\n|") >= 3  # header, rule, at least one result row
    if name == "multiview":  # one store of the most views; row K trains on the first K views of each image
        assert [p.name for p in (tmp_path / "stores").iterdir()] == ["smoke-views2"]
        for k in module.VIEWS["smoke"]:
            (config,) = (tmp_path / f"train-views{k}" / "runs").glob("*/config.json")
            assert json.loads(config.read_text())["options"]["train_views"] == k


def test_domain_adaptation_pipeline(tmp_path):
    from clf_helpers import write_cifar_like
    from pipelines import domain_adaptation

    images = write_cifar_like(tmp_path / "images")
    text = domain_adaptation.run("smoke", tmp_path / "out", workers=1, data_root=str(images), **QUIET).read_text()
    assert "71.36 ± 0.38" in text and "No adaptation" in text and "DWSNets" in text
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert set(results["models"]) == {"dwsnet", "mlp"} and 0 <= results["no_adaptation"] <= 1
    assert all(len(r["seeds"]) == 2 for r in results["models"].values())
    assert (tmp_path / "out" / "before_after.png").stat().st_size > 0
    assert results["adapted_store"]["test"]["corrupted_accuracy_before"] == pytest.approx(results["no_adaptation"])
def test_generalization_pipeline(tmp_path):
    from pipelines import generalization

    text = generalization.run("smoke", tmp_path, workers=1, **QUIET).read_text()
    assert "figure only" in text and "Kendall τ" in text and "train-split mean (a constant)" in text
    assert (tmp_path / "predicted_vs_actual.png").read_bytes()[:4] == b"\x89PNG"
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["models"]) == {"stats", "mlp", "dwsnet", "dwsnet-no-bn"}
    variant = json.loads((tmp_path / "dwsnet-no-bn" / "runs" / "smoke-mnist-classifiers-dwsnet-regress" /
                          "config.json").read_text())
    assert variant["options"]["bn"] is False and "DWSNets without BN" in text
    assert all(r["mse"]["mean"] >= 0 and r["params"] > 0 for r in results["models"].values())
    assert 0 < results["constant"]["mse"] < 1  # accuracies lie in [0, 1]


def test_full_scales_read_the_shared_official_files_unless_told_otherwise(tmp_path, monkeypatch):
    """``--data-root`` wins; without it the copy beside the checkout; without that a clear error."""
    from pipelines import common
    from zoo.sources import DataError

    assert common.shared_data("/my/data", "mnist-full") == "/my/data"
    assert common.shared_data(None, None) is None and common.shared_data("/my/data", None) == "/my/data"
    (tmp_path / "shared/data/mnist-full").mkdir(parents=True)
    monkeypatch.setattr(common, "REPO_ROOT", tmp_path / "checkout")
    assert common.shared_data(None, "mnist-full") == str(tmp_path / "shared/data/mnist-full")
    with pytest.raises(DataError, match="fashion-mnist.*--data-root"):
        common.shared_data(None, "fashion-mnist")


def test_inr_init_pipeline_fits_the_same_images_from_each_init(tmp_path):
    """One store per ``--init`` of the same images with the same seed and schedule (only the init
    differs), the same models trained on each, a row per init with its fitting summary."""
    from pipelines import inr_init
    from zoo.store import WeightStore

    text = inr_init.run("smoke", tmp_path, workers=1, models=["dwsnet"], **QUIET).read_text()
    stores = {init: WeightStore(tmp_path / "stores" / f"smoke-mnist-{init}") for init in inr_init.INITS["smoke"]}
    assert len(stores) == 2
    tables = [s.networks for s in stores.values()]
    for column in ("split", "source_item", "label", "seed"):
        assert tables[0].column(column).equals(tables[1].column(column))
    generations = [dict(s.manifest["generation"]) for s in stores.values()]
    assert [g.pop("init") for g in generations] == list(stores) and generations[0] == generations[1]
    assert stores["reference"].manifest["architecture"]["init_ranges"] != \
        stores["reference-siren-first"].manifest["architecture"]["init_ranges"]
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results) == set(stores)
    for init, row in results.items():
        assert f"`{init}`" in text and 0 <= row["dwsnet"]["accuracy"]["mean"] <= 1
        assert row["fitting"]["steps_mean"] == 20 and row["fitting"]["psnr_median"] > 0
    assert "train 31 / val 3 / test 6" in text and "MLP + Alignment" not in text.split("\n")[2]
