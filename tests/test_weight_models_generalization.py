"""The generalization column of issue 32's table on 784-input classifier zoos: the graph models and nfn-np
train on batches whose activations fit zoo train's default --max-memory, and a cell zoo train refuses (as
nfn-hnp was before --input-reduction reached it) is shown as "not run: REASON" in the column and the
summary."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pipelines import weight_models
from pipelines.weight_models import (COLUMNS, GENERALIZATION_BATCH_SIZES, MODELS, SCALES, cell_options, table_row,
                                     train_command)

CLASSIFIER_WIDTHS = (784, 128, 128, 128, 10)  # the Fashion-MNIST zoo's networks (the smoke zoo's MNIST ones too)
GRAPH_MODELS = ("ng-gnn", "scalegmn", "ng-transformer", "scalegmn-b")


def generalization_options(scale: str, model: str, lr=None):
    protocol = COLUMNS["generalization"].scales[scale]
    return cell_options(protocol, Path(f"/s/{scale}-fmnist-classifiers"), Path("/o"), model, lr, "regress")


@pytest.mark.parametrize("scale", ["smoke", "ci", "full"])
def test_graph_models_train_on_their_own_batch_and_the_others_on_the_pipelines(scale):
    pipeline_batch = COLUMNS["generalization"].scales[scale].train["batch_size"]
    for model in MODELS:
        opts = generalization_options(scale, model, None if scale != "full" else 1e-3)
        want = GENERALIZATION_BATCH_SIZES[scale].get(model, pipeline_batch)
        assert opts.batch_size == want
        assert f"--batch-size {want}" in train_command(opts)  # the cell's command says it
    if scale != "smoke":
        assert all(generalization_options(scale, m).batch_size < pipeline_batch for m in GRAPH_MODELS)
    # full keeps ci's batches, so ci's lr carries over
    assert GENERALIZATION_BATCH_SIZES["full"] == GENERALIZATION_BATCH_SIZES["ci"]


def test_every_cell_trains_on_batches_of_several_networks():
    """zoo train skips a batch of one network where batch norm would normalize it (and refuses such a
    --batch-size); with --input-reduction no cell of the column needs one (before it, ng-transformer and
    scalegmn-b trained on batches of one)."""
    for scale, sizes in GENERALIZATION_BATCH_SIZES.items():
        assert all(b >= 2 for b in sizes.values()), (scale, sizes)
        assert COLUMNS["generalization"].scales[scale].train["batch_size"] >= 2


def test_other_columns_keep_every_models_batch():
    for model in GRAPH_MODELS:
        assert cell_options(SCALES["ci"], Path("/s/ci-mnist-inr"), Path("/o"), model, None).batch_size is None
        sine = COLUMNS["sine"].scales["ci"]
        assert cell_options(sine, Path("/s/ci-sine"), Path("/o"), model, None, "regress").batch_size == \
            sine.train["batch_size"]


def refused_cell(model: str, reason: str) -> dict:
    return {"model": model, "status": "refused", "refused": reason, "lr": None, "lr_from": "val", "params": None,
            "normalize": "orbit", "batch_size": 32, "epochs_done": 0, "epochs_planned": 60, "wall_seconds": 1.0,
            "zoo_train": "zoo train S --model nfn-hnp"}


def test_a_refused_cell_reads_not_run_with_its_reason_in_the_column_and_the_summary(tmp_path):
    reason = "closest size has 5106684 parameters (channels=1), 3736% away from the target 133133 (allowed 15%)"
    spec = COLUMNS["generalization"]
    row = table_row(refused_cell("nfn-hnp", reason), spec.metrics)
    assert row[5:7] == [f"not run: {reason}", "—"]  # the first metric's place says why; the other is empty
    for metric in spec.metrics:
        assert weight_models.summary_cell("generalization", refused_cell("nfn-hnp", reason), "nfn-hnp", metric) == \
            f"not run: {reason}"
    # the same in the written summary, from a results file of the earlier format (status "refused")
    out = tmp_path / "full"
    out.mkdir()
    (out / "results-generalization.json").write_text(json.dumps({"cells": {"nfn-hnp": refused_cell("nfn-hnp",
                                                                                                     reason)}}))
    text = weight_models.write_summary(tmp_path).read_text()
    line = next(line for line in text.splitlines() if line.startswith("| `nfn-hnp`"))
    assert line.count(f"not run: {reason}") == 2


@pytest.mark.slow
@pytest.mark.parametrize("scale", ["smoke", "ci"])
def test_each_graph_models_batch_is_the_largest_power_of_two_whose_activations_fit_the_default_budget(scale):
    """The batch's activations, as zoo train plans them (the probe x the model's peak factor), fit beside
    the runtime and the model in the default --max-memory, and twice a batch the column sets would not."""
    from dws.stream.memory import TRAINING_MODEL_COPIES, activation_bytes, model_bytes
    from dws.tasks.models import build_model
    from dws.tasks.options import ACTIVATION_PEAK, DEFAULTS
    from zoo.options import RUNTIME_BYTES

    train = COLUMNS["generalization"].scales[scale].train
    for model_name in (*GRAPH_MODELS, "nfn-np"):
        batch = generalization_options(scale, model_name).batch_size
        model, _ = build_model(model_name, CLASSIFIER_WIDTHS, 1, hidden_channels=train["hidden_channels"],
                               input_reduction=train["input_reduction"], activation="relu", backend="plain")
        fixed = RUNTIME_BYTES + TRAINING_MODEL_COPIES * model_bytes(model)
        per_batch = activation_bytes(model, CLASSIFIER_WIDTHS, batch, ACTIVATION_PEAK[model_name][0])
        assert fixed + per_batch < DEFAULTS["max_memory"], (model_name, batch)
        if model_name in GENERALIZATION_BATCH_SIZES[scale]:
            assert fixed + 2 * per_batch > DEFAULTS["max_memory"], (model_name, batch)


def test_a_refused_cell_is_said_in_one_line_the_others_train_and_other_models_cells_are_kept(tmp_path, monkeypatch):
    """A run of some models (``--models``) leaves the column's other cells of the same zoo as they were (a later
    scale finds their lrs there); a cell zoo train refuses is logged in one line and the next one trains."""
    zoo = tmp_path / "stores" / "smoke" / "stores" / "smoke-mnist-classifiers"
    spec = COLUMNS["generalization"]
    monkeypatch.setitem(weight_models.COLUMNS, "generalization", replace(spec, make_store=lambda *args: zoo))
    trained = []

    def train_run(opts, log):
        if opts.model == "ng-transformer":
            raise ValueError("--max-memory 4.0 GiB is too small: ...\nsecond line")
        trained.append((opts.model, opts.batch_size))

    monkeypatch.setattr(weight_models, "train_run", train_run)
    out, earlier = tmp_path / "out" / "smoke", refused_cell("nfn-hnp", "closest size has ...")
    results = out / "results-generalization.json"
    out.mkdir(parents=True)
    results.write_text(json.dumps({"store": str(zoo), "cells": {"nfn-hnp": earlier}}))
    lines = []
    weight_models.run("smoke", out, 1, ["ng-transformer", "scalegmn-b"], log=lines.append, column="generalization",
                      stores=tmp_path / "stores")
    assert "ng-transformer: not run: --max-memory 4.0 GiB is too small: ..." in lines
    assert trained == [("scalegmn-b", 8)]  # the next cell trained
    found = json.loads(results.read_text())["cells"]
    assert list(found) == ["ng-transformer", "scalegmn-b", "nfn-hnp"] and found["nfn-hnp"] == earlier
    assert found["ng-transformer"]["status"] == "refused" and found["ng-transformer"]["batch_size"] == 8
    text = (out / "report-generalization.md").read_text()
    assert "| not run: --max-memory 4.0 GiB is too small: ... | — |" in text
    assert "| not run: closest size has ... | — |" in text and "| `nfn-hnp` |" in text

    # the cells of another zoo's results are not kept
    results.write_text(json.dumps({"store": str(tmp_path / "another-zoo"), "cells": {"nfn-hnp": earlier}}))
    weight_models.run("smoke", out, 1, ["scalegmn-b"], log=lines.append, column="generalization",
                      stores=tmp_path / "stores")
    assert list(json.loads(results.read_text())["cells"]) == ["scalegmn-b"]
