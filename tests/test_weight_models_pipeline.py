"""Issue 32's table pipeline at its smoke scale: every cell tabulated with its command, a finished
cell never retrained, an interrupted one resumed, full scale refused without ci's learning rates."""

import json
import shlex
from dataclasses import replace
from pathlib import Path

import pytest

from dws.tasks.checkpoint import Checkpoint
from dws.tasks.options import TrainOptions, with_task_defaults
from dws.tasks.protocol import PAPER_LRS
from pipelines import weight_models
from pipelines.inr_classification import inr_store
from pipelines.weight_models import Protocol, cost_order, parse_lrs

QUIET = lambda *_: None  # noqa: E731
MODELS = ["mlp", "dwsnet"]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """inr_classification's smoke zoo, made once, under a folder that --stores would name."""
    root = tmp_path_factory.mktemp("stores")
    inr_store("smoke", root / "smoke", 1, "mnist", log=QUIET)
    return root


def one_epoch() -> Protocol:
    smoke = weight_models.SCALES["smoke"]
    return replace(smoke, train={**smoke.train, "epochs": 1})


def file_times(folder: Path) -> dict:
    return {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


def cells(out: Path) -> dict:
    return json.loads((out / "results-mnist.json").read_text())["cells"]


def test_the_table_has_every_cell_and_a_rerun_retrains_none(stores, tmp_path, monkeypatch):
    out = tmp_path / "smoke"
    text = weight_models.run("smoke", out, 1, MODELS, log=QUIET, stores=stores).read_text()
    found = cells(out)
    assert list(found) == MODELS
    for model, cell in found.items():
        assert cell["status"] == "done" and cell["lr"] in PAPER_LRS and set(cell["lr_search"]) == set(map(str, PAPER_LRS))
        assert cell["params"] > 0 and cell["epochs_done"] == cell["epochs_planned"] == 2 * len(PAPER_LRS)
        assert 0 <= cell["test_accuracy"] <= 1 and cell["wall_seconds"] > 0
        assert f"| `{model}` | {cell['params']:,} | {cell['lr']:g} (val, this scale) |" in text
        assert f"--models {model} " in cell["command"] and f"--stores {stores}" in cell["command"]
        # the recorded zoo train command, parsed by zoo's own command line, trains this very cell
        from cli import main as zoo

        argv = shlex.split(cell["zoo_train"])
        assert argv[:2] == ["zoo", "train"]
        params = zoo.commands["train"].make_context("train", argv[2:]).params
        trained = json.loads((Path(cell["run_dir"]) / "config.json").read_text())["options"]  # resolved
        assert with_task_defaults(TrainOptions(**{**params, "progress": False})) == TrainOptions(**trained)
    assert [found[m]["normalize"] for m in MODELS] == ["entry", "orbit"]  # zoo train's per-model default

    before = file_times(out / "runs")
    monkeypatch.setattr(weight_models, "train_run", lambda *a, **k: pytest.fail("a finished cell was retrained"))
    lines = []
    weight_models.run("smoke", out, 1, MODELS, log=lines.append, stores=stores)
    assert sum("reusing the finished run" in line for line in lines) == 2
    assert file_times(out / "runs") == before
    assert cells(out) == found

    # other settings for a finished cell: refused (zoo train would train over it), nothing touched
    monkeypatch.setitem(weight_models.SCALES, "smoke", one_epoch())
    with pytest.raises(ValueError, match="smoke-mnist-inr-mlp-classify holds a finished run with other --epochs; "):
        weight_models.run("smoke", out, 1, MODELS, log=QUIET, stores=stores)
    assert file_times(out / "runs") == before


def test_the_full_protocol_takes_each_lr_from_the_search_and_refuses_without_one(stores, tmp_path, monkeypatch):
    """A scale with ``lr_from`` (as full from ci) trains each model at the lr its search chose, cheapest
    first; a model the search has not finished is refused, before any zoo is made, naming the command."""
    protocol = Protocol("smoke", dict(epochs=1, seeds=1, batch_size=8, hidden_channels=4), lr_from="smoke",
                        progress=False)
    monkeypatch.setitem(weight_models.SCALES, "smoke-full", protocol)
    with pytest.raises(ValueError, match=r"no learning rate chosen at smoke scale for mlp, dwsnet: run `python -m "
                                         r"pipelines.weight_models --scale smoke --dataset mnist --models mlp,dwsnet"):
        weight_models.run("smoke-full", tmp_path / "smoke-full", 1, MODELS, log=QUIET, stores=stores)

    monkeypatch.setitem(weight_models.SCALES, "smoke", one_epoch())
    weight_models.run("smoke", tmp_path / "smoke", 1, MODELS, log=QUIET, stores=stores)
    search = cells(tmp_path / "smoke")
    with pytest.raises(ValueError, match="for nfn-np: run .*--models nfn-np .*or pass --lr MODEL=LR"):
        weight_models.run("smoke-full", tmp_path / "smoke-full", 1, ["mlp", "nfn-np"], log=QUIET, stores=stores)
    text = weight_models.run("smoke-full", tmp_path / "smoke-full", 1, MODELS, log=QUIET, stores=stores).read_text()
    full = cells(tmp_path / "smoke-full")
    assert list(full) == cost_order(MODELS, search)
    for model in MODELS:
        assert full[model]["lr"] == search[model]["lr"] and full[model]["lr_from"] == "val at smoke"
        assert full[model]["epochs_done"] == full[model]["epochs_planned"] == 1
        assert f"--lr {search[model]['lr']:g} " in full[model]["zoo_train"] and "(val at smoke)" in text

    # the real full scale: refused in one line before its (45-minute) zoo is made
    with pytest.raises(SystemExit) as refused:
        weight_models.main(["--scale", "full", "--models", "dwsnet", "--out", str(tmp_path / "x"),
                            "--stores", str(tmp_path / "x")])
    message = str(refused.value.code)
    assert message.startswith("error: no learning rate chosen at ci scale for dwsnet: run `python -m "
                              "pipelines.weight_models --scale ci") and "\n" not in message
    assert not (tmp_path / "x").exists()


def test_an_interrupted_cell_is_tabulated_unfinished_and_resumes(stores, tmp_path, monkeypatch):
    out = tmp_path / "smoke"
    real_save, seen = Checkpoint.save, []

    def save_then_interrupt(self, objects, values):
        real_save(self, objects, values)
        seen.append((out / "report-mnist.md").read_text())
        raise KeyboardInterrupt

    monkeypatch.setattr(Checkpoint, "save", save_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        weight_models.run("smoke", out, 1, ["mlp"], log=QUIET, stores=stores, lrs={"mlp": 1e-3})
    assert "| running | 0 / 2 |" in seen[0]  # the report said so while it trained
    cell = cells(out)["mlp"]
    assert (cell["status"], cell["epochs_done"], cell["epochs_planned"], cell["lr_from"]) == ("unfinished", 1, 2, "--lr")
    assert "| unfinished | 1 / 2 |" in (out / "report-mnist.md").read_text()
    assert "--lr mlp=0.001" in cell["command"] and "--lr 0.001 " in cell["zoo_train"]

    monkeypatch.setattr(Checkpoint, "save", real_save)
    lines = []
    weight_models.run("smoke", out, 1, ["mlp"], log=lines.append, stores=stores, lrs={"mlp": 1e-3})
    assert any("resuming lr 0.001, seed 0 after epoch 1 of 2" in line for line in lines)
    cell = cells(out)["mlp"]
    assert (cell["status"], cell["epochs_done"], cell["lr"]) == ("done", 2, 1e-3)
    metrics = json.loads((Path(cell["run_dir"]) / "metrics.json").read_text())
    assert [h["epoch"] for h in metrics["history"][0]] == [0, 1]


def test_lr_overrides_parse_and_bad_ones_are_refused_in_one_line():
    assert parse_lrs(["dwsnet=1e-3,mlp=5e-4", "nfn-np=0.01"]) == {"dwsnet": 1e-3, "mlp": 5e-4, "nfn-np": 0.01}
    assert parse_lrs(None) == {}
    for bad, says in [("dwsnet", "takes MODEL=LR"), ("dwsnet=", "takes MODEL=LR"), ("=1e-3", "takes MODEL=LR"),
                      ("resnet=1e-3", "'resnet' is not one of dwsnet"), ("dwsnet=abc", "'abc' is not a number"),
                      ("dwsnet=-1", "must be positive"), ("dwsnet=nan", "must be positive")]:
        with pytest.raises(ValueError, match=says) as refused:
            parse_lrs([bad])
        assert "\n" not in str(refused.value)
    with pytest.raises(SystemExit) as refused:
        weight_models.main(["--scale", "smoke", "--lr", "dwsnet=abc"])
    assert refused.value.code == "error: --lr dwsnet=abc: 'abc' is not a number"
    with pytest.raises(SystemExit, match="--models 'mlp,resnet': resnet; choose from"):
        weight_models.main(["--scale", "smoke", "--models", "mlp,resnet"])


def test_cells_run_cheapest_first_by_their_searchs_time_per_epoch():
    done = lambda seconds, epochs: {"status": "done", "wall_seconds": seconds, "epochs_planned": epochs}  # noqa: E731
    search = {"scalegmn": done(4000.0, 40), "dwsnet": done(800.0, 160), "mlp": done(90.0, 160),
              "ng-gnn": {"status": "unfinished", "wall_seconds": 10.0, "epochs_planned": 40}}
    assert cost_order(["scalegmn", "ng-gnn", "nfn-np", "dwsnet", "mlp"], search) == \
        ["mlp", "dwsnet", "scalegmn", "ng-gnn", "nfn-np"]
