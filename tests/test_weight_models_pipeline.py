"""Issue 32's table pipeline at its smoke scale: every cell tabulated with its command, a finished
cell never retrained, an interrupted one resumed, full scale refused without ci's learning rates;
the sine, generalization and adaptation columns end to end, and the summary of every column."""

import json
import re
import shlex
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from dws.tasks.checkpoint import CHECKPOINTS, Checkpoint
from dws.tasks.models import build_model
from dws.tasks.objectives import TASKS
from dws.tasks.options import ADAPT_MODELS, TrainOptions, with_task_defaults
from dws.tasks.protocol import PAPER_LRS
from pipelines import carried, weight_models
from pipelines.inr_classification import inr_store
from pipelines.weight_models import Protocol, cost_order, parse_lrs

QUIET = lambda *_: None  # noqa: E731
MODELS = ["mlp", "dwsnet"]


@pytest.fixture(autouse=True)
def no_committed_records(tmp_path, monkeypatch):
    """The command line's default --recorded: an empty folder, not this checkout's committed cells."""
    monkeypatch.setattr(weight_models, "RECORDED", tmp_path / "no-records")


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


def cells(out: Path, column: str = "mnist") -> dict:
    return json.loads((out / f"results-{column}.json").read_text())["cells"]


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

    # zoo train's own clock counts every training (lr search included) and outlives a session killed
    # mid-cell, whose time the pipeline's clock lost: the table shows the longer of the two
    metrics = json.loads((Path(found["dwsnet"]["run_dir"]) / "metrics.json").read_text())
    assert metrics["training_seconds"] > sum(metrics["seconds"]) > 0  # 4 lr-search trainings, one kept
    results = out / "results-mnist.json"
    saved = json.loads(results.read_text())
    saved["cells"]["dwsnet"]["wall_seconds"] = 1e-3
    results.write_text(json.dumps(saved))
    weight_models.run("smoke", out, 1, MODELS, log=QUIET, stores=stores)
    assert cells(out)["dwsnet"]["wall_seconds"] == metrics["training_seconds"]
    assert cells(out)["mlp"] == found["mlp"]

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


def interrupt_at_first_save(monkeypatch, when_saved=lambda: None):
    """Training stops right after its first checkpoint (epoch 1), as a session that ends would; returns
    the real ``Checkpoint.save``. ``when_saved``: called between the save and the interruption."""
    real_save = Checkpoint.save

    def save_then_interrupt(self, objects, values):
        real_save(self, objects, values)
        when_saved()
        raise KeyboardInterrupt

    monkeypatch.setattr(Checkpoint, "save", save_then_interrupt)
    return real_save


def test_an_interrupted_cell_is_tabulated_unfinished_and_resumes(stores, tmp_path, monkeypatch):
    out, seen = tmp_path / "smoke", []
    real_save = interrupt_at_first_save(monkeypatch, lambda: seen.append((out / "report-mnist.md").read_text()))
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


def test_a_cell_whose_lr_diverges_says_so_and_trains_anew_at_another(stores, tmp_path):
    """A cell's fixed lr (a full cell's, from ci or --lr) whose training diverges: the tables say where and
    how to go on, the other cells still train, a rerun does not train it again, and --lr with another lr
    moves the diverged run aside (kept) and trains the cell anew."""
    out, lines = tmp_path / "smoke", []
    weight_models.run("smoke", out, 1, MODELS, log=lines.append, stores=stores, lrs={"mlp": 1e12, "dwsnet": 1e-3})
    found = cells(out)
    assert found["dwsnet"]["status"] == "done"
    mlp = found["mlp"]
    assert (mlp["status"], mlp["epochs_done"]) == ("diverged", 0)
    assert mlp["diverged"].startswith("epoch 1: training loss is ")
    assert any(line.startswith("mlp: diverged at lr 1e+12: epoch 1: training loss is ") for line in lines)
    shown = weight_models.summary_cell("mnist", mlp, "mlp", weight_models.ACCURACY)
    assert shown == f"diverged at lr 1e+12 ({mlp['diverged']}: --lr mlp=LR)"
    assert f"| {shown} | 0 / 2 |" in (out / "report-mnist.md").read_text()

    run_dir = Path(mlp["run_dir"])
    saved = file_times(run_dir / "checkpoints")
    weight_models.run("smoke", out, 1, ["mlp"], log=QUIET, stores=stores, lrs={"mlp": 1e12})
    assert cells(out)["mlp"]["status"] == "diverged" and file_times(run_dir / "checkpoints") == saved

    lines = []
    weight_models.run("smoke", out, 1, ["mlp"], log=lines.append, stores=stores, lrs={"mlp": 1e-3})
    aside = run_dir.with_name(f"{run_dir.name}.diverged-lr1e+12")
    assert f"mlp: the run in {run_dir} diverged at lr 1e+12: moved to {aside}; training the cell anew at lr 0.001" \
        in lines
    assert file_times(aside / "checkpoints") == {aside / p.relative_to(run_dir): t for p, t in saved.items()}
    anew = cells(out)["mlp"]
    assert (anew["status"], anew["lr"], anew["epochs_done"]) == ("done", 1e-3, 2)


def test_a_cell_saved_within_its_first_epoch_is_unfinished_not_run(stores, tmp_path, monkeypatch):
    """zoo train saves within an epoch (--checkpoint-minutes; here after every step): a cell interrupted in
    its first epoch has work to resume, which the table says, with the share of the epoch done."""
    out, real = tmp_path / "smoke", weight_models.cell_options
    monkeypatch.setattr(weight_models, "cell_options", lambda *a, **k: replace(real(*a, **k), checkpoint_minutes=1e-9))
    interrupt_at_first_save(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        weight_models.run("smoke", out, 1, ["mlp"], log=QUIET, stores=stores, lrs={"mlp": 1e-3})
    cell = cells(out)["mlp"]
    assert (cell["status"], cell["epochs_done"]) == ("unfinished", 0)
    shown = weight_models.summary_cell("mnist", cell, "mlp", weight_models.ACCURACY)
    assert re.match(r"unfinished 0/2 epochs and \d+% of the next, ~", shown), shown


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


# ------------------------------------------------------------------------------ the other columns
# each column at smoke, two models (seconds each); its zoo made once under ROOT/stores
COLUMN_MODELS = {"sine": ["mlp", "dwsnet"], "generalization": ["mlp", "dwsnet"], "adapt": ["mlp", "dwsnet"]}


@pytest.fixture(scope="module")
def columns(tmp_path_factory):
    """The three columns trained at smoke under ROOT/out/smoke (zoos in ROOT/stores); the adaptation
    zoo's images from clf_helpers' fake CIFAR-10."""
    from clf_helpers import write_cifar_like

    root = tmp_path_factory.mktemp("columns")
    images = str(write_cifar_like(root / "images"))
    for column, models in COLUMN_MODELS.items():
        weight_models.run("smoke", root / "out" / "smoke", 1, models, images if column == "adapt" else None,
                          log=QUIET, column=column, stores=root / "stores")
    return root


@pytest.mark.parametrize("column,metrics", [("sine", {"test_mse": "test MSE"}),
                                            ("generalization", {"test_mse": "100 × test MSE",
                                                                "test_kendall_tau": "Kendall τ"}),
                                            ("adapt", {"test_accuracy": "test acc. % (adapted)",
                                                       "test_accuracy_before": "before adaptation %"})])
def test_each_column_trains_its_task_on_its_pipelines_zoo_with_the_lr_chosen_on_val(columns, column, metrics):
    out = columns / "out" / "smoke"
    found, text = cells(out, column), (out / f"report-{column}.md").read_text()
    spec = weight_models.COLUMNS[column]
    assert list(found) == COLUMN_MODELS[column]
    header = "| model | parameters | lr (chosen on) | normalize | batch | " + " | ".join(metrics.values()) + " |"
    assert header in text
    for model, cell in found.items():
        assert cell["status"] == "done" and cell["lr"] in PAPER_LRS and set(cell["lr_search"]) == set(map(str, PAPER_LRS))
        assert cell["epochs_done"] == cell["epochs_planned"] == spec.scales["smoke"].train["epochs"] * len(PAPER_LRS)
        assert set(metrics) | {f"val_{spec.selection}"} <= set(cell) and cell["params"] > 0
        config = json.loads((Path(cell["run_dir"]) / "config.json").read_text())["options"]
        assert config["task"] == spec.task and config["seeds"] == 1 and config["lr"] is None
        assert f"--column {column} --models {model} " in cell["command"]
        shown = [spec.metrics[i].show(cell[key]) for i, key in enumerate(metrics)]
        assert f"| `{model}` | {cell['params']:,} | {cell['lr']:g} (val, this scale) |" in text
        assert " | ".join(shown) in text
    store = json.loads((out / f"results-{column}.json").read_text())["store"]
    assert Path(store).parent == columns / "stores" / "smoke" / "stores"  # where the column's own pipeline puts it
    if column == "generalization":  # the generalization pipeline's task settings
        assert all("--target test_accuracy" in c["zoo_train"] and "--input-reduction 4" in c["zoo_train"]
                   for c in found.values())
        assert all(0 <= c["test_mse"] < 1 for c in found.values())
    if column == "adapt":
        assert [c["normalize"] for c in found.values()] == [None, None] and "| — | 4 |" in text
        assert all(0 <= c[k] <= 1 for c in found.values() for k in ("test_accuracy", "test_accuracy_before"))


def test_a_rerun_of_any_column_reuses_its_finished_cells(columns, monkeypatch):
    out = columns / "out" / "smoke"
    before, found = file_times(out / "runs"), {c: cells(out, c) for c in COLUMN_MODELS}
    monkeypatch.setattr(weight_models, "train_run", lambda *a, **k: pytest.fail("a finished cell was retrained"))
    for column, models in COLUMN_MODELS.items():
        lines = []
        weight_models.run("smoke", out, 1, models, log=lines.append, column=column, stores=columns / "stores")
        assert sum("reusing the finished run" in line for line in lines) == len(models)
        assert cells(out, column) == found[column]
    assert file_times(out / "runs") == before


def test_adaptation_refuses_invariant_models_and_skips_them_by_default(columns, tmp_path, monkeypatch):
    invariant = [m for m in weight_models.MODELS if m not in ADAPT_MODELS]
    assert invariant  # the NFN, NG and ScaleGMN rows
    for model in invariant:
        with pytest.raises(ValueError, match=f"--column adapt trains --task adapt, .*; {model} is invariant") as no:
            weight_models.run("smoke", tmp_path / "smoke", 1, ["dwsnet", model], log=QUIET, column="adapt",
                              stores=tmp_path / "stores")
        assert "\n" not in str(no.value)
    assert not (tmp_path / "stores").exists()  # refused before any zoo is made
    with pytest.raises(SystemExit, match="^error: --column adapt trains .*; nfn-np is invariant"):
        weight_models.main(["--scale", "smoke", "--column", "adapt", "--models", "nfn-np", "--out", str(tmp_path)])

    lines, trained = [], []
    monkeypatch.setattr(weight_models, "train_run", lambda opts, log: trained.append(opts.model))
    weight_models.run("smoke", tmp_path / "smoke", 1, None, log=lines.append, column="adapt",
                      stores=columns / "stores")
    assert [line for line in lines if "no cell for" in line] == \
        [f"--column adapt: no cell for {', '.join(invariant)} (invariant models: --task adapt needs a weight-space output)"]
    rows = [m for m in weight_models.MODELS if m in ADAPT_MODELS]
    assert trained == rows == ["mlp", "mlp-align", "dwsnet"] and list(cells(tmp_path / "smoke", "adapt")) == rows


def test_a_cell_zoo_train_refuses_is_recorded_and_the_others_still_train(columns, tmp_path, monkeypatch):
    real = weight_models.train_run

    def refuse_mlp(opts, log):
        if opts.model == "mlp":
            raise ValueError("--max-memory 4.0 GiB is too small: ...\nsecond line")
        return real(opts, log=log)

    monkeypatch.setattr(weight_models, "train_run", refuse_mlp)
    out, lines = tmp_path / "smoke", []
    weight_models.run("smoke", out, 1, ["mlp", "dwsnet"], log=lines.append, column="sine", stores=columns / "stores")
    found = cells(out, "sine")
    assert found["mlp"]["status"] == "refused" and found["dwsnet"]["status"] == "done"
    assert found["mlp"]["refused"] == "--max-memory 4.0 GiB is too small: ..."
    assert "mlp: not run: --max-memory 4.0 GiB is too small: ..." in lines
    text = (out / "report-sine.md").read_text()
    assert "| not run: --max-memory 4.0 GiB is too small: ... | " in text
    assert "- not run: zoo train refused the cell, for the reason given (a rerun tries again)" in text

    # a scale that takes its lr from this one leaves the refused model out by default, saying so
    spec = weight_models.COLUMNS["sine"]
    monkeypatch.setitem(spec.scales, "smoke-full", Protocol("smoke", {**spec.scales["smoke"].train, "epochs": 1},
                                                            lr_from="smoke", progress=False))
    monkeypatch.setattr(weight_models, "MODELS", ("mlp", "dwsnet"))
    lines.clear()
    weight_models.run("smoke-full", tmp_path / "smoke-full", 1, None, log=lines.append, column="sine",
                      stores=columns / "stores")
    assert "mlp: no cell (zoo train refused its smoke cell: --max-memory 4.0 GiB is too small: ...)" in lines
    assert list(cells(tmp_path / "smoke-full", "sine")) == ["dwsnet"]


def test_generalization_full_trains_on_a_given_zoo_checked_to_be_the_right_kind(columns, tmp_path, monkeypatch):
    """``--store``: an existing zoo instead of generating one (the full fmnist-classifiers zoo), refused
    in one line when it is not the zoo the column's pipeline makes at that scale; full's lr from ci."""
    spec = weight_models.COLUMNS["generalization"]
    smoke = spec.scales["smoke"]
    monkeypatch.setitem(spec.scales, "smoke-full", Protocol("smoke", {**smoke.train, "epochs": 1}, lr_from="smoke",
                                                            progress=False))
    out_root = columns / "out"
    given = Path(json.loads((out_root / "smoke" / "results-generalization.json").read_text())["store"])
    sine_zoo = Path(json.loads((out_root / "smoke" / "results-sine.json").read_text())["store"])
    with pytest.raises(ValueError, match=r"--store .* is a sine-regression zoo of --limit 24; --column generalization "
                                         r"at smoke scale trains on a mnist-classifiers zoo of --limit 8") as no:
        weight_models.run("smoke-full", out_root / "smoke-full", 1, ["dwsnet"], log=QUIET, column="generalization",
                          stores=tmp_path, store=sine_zoo)
    assert "\n" not in str(no.value)
    with pytest.raises(ValueError, match="not-a-store"):
        weight_models.run("smoke-full", out_root / "smoke-full", 1, ["dwsnet"], log=QUIET, column="generalization",
                          stores=tmp_path, store=tmp_path / "not-a-store")

    weight_models.run("smoke-full", out_root / "smoke-full", 1, ["dwsnet"], log=QUIET, column="generalization",
                      stores=tmp_path, store=given)
    cell = cells(out_root / "smoke-full", "generalization")["dwsnet"]
    search = cells(out_root / "smoke", "generalization")["dwsnet"]
    assert cell["status"] == "done" and (cell["lr"], cell["lr_from"]) == (search["lr"], "val at smoke")
    assert f"--store {given}" in cell["command"] and cell["zoo_train"].startswith(f"zoo train {given} ")
    assert not list(tmp_path.iterdir())  # no zoo made


def test_scales_a_column_does_not_have_and_two_names_for_the_column_are_refused(tmp_path):
    for argv, says in [(["--scale", "full", "--column", "sine"], "--column sine has no full scale (its scales: smoke, ci)"),
                       (["--column", "sine", "--dataset", "fmnist"], "--column sine and --dataset fmnist name different")]:
        with pytest.raises(SystemExit, match=f"^error: {re.escape(says)}"):
            weight_models.main([*argv, "--out", str(tmp_path)])
    assert not list(tmp_path.iterdir())


def test_the_summary_gathers_every_column_at_its_scale(columns, stores, tmp_path, monkeypatch):
    out_root = columns / "out"
    # an MNIST cell interrupted after its first epoch, and one recorded as running when it started
    interrupt_at_first_save(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        weight_models.run("smoke", tmp_path / "smoke", 1, ["dwsnet"], log=QUIET, stores=stores, lrs={"dwsnet": 1e-3})
    mnist = json.loads((tmp_path / "smoke" / "results-mnist.json").read_text())
    running = {**mnist["cells"]["dwsnet"], "model": "ng-gnn", "status": "running", "epochs_done": 0}
    mnist["cells"]["ng-gnn"] = running  # its checkpoints (the run directory) say how far it is now
    (tmp_path / "smoke" / "results-mnist.json").write_text(json.dumps(mnist))
    for column in COLUMN_MODELS:
        (tmp_path / "smoke" / f"results-{column}.json").write_text((out_root / "smoke" / f"results-{column}.json")
                                                                   .read_text())
    scales = {c: "smoke" for c in weight_models.COLUMNS}
    text = weight_models.write_summary(tmp_path, scales).read_text()
    assert text == (tmp_path / "summary.md").read_text()
    rows = {line.split(" | ")[0].strip("| `"): line.strip("|").split(" | ")[1:] for line in text.splitlines()
            if line.startswith("| `")}
    assert list(rows) == list(weight_models.MODELS)  # issue 32's rows, in order
    header = next(line for line in text.splitlines() if line.startswith("| model"))
    names = header.strip("| ").split(" | ")[1:]
    assert names == ["MNIST INRs, test acc. % (smoke)", "MNIST INRs, test acc. %, published (its paper)",
                     "Fashion-MNIST INRs, test acc. % (smoke)", "Fashion-MNIST INRs, test acc. %, published (its paper)",
                     "sine, test MSE (smoke)", "generalization, 100 × test MSE (smoke)",
                     "generalization, Kendall τ (smoke)",
                     "generalization, Kendall τ, published (Small CNN Zoo CIFAR10-GS)",
                     "adaptation, test acc. % (adapted) (smoke)", "adaptation, before adaptation % (smoke)"]
    cell = dict(zip(names, rows["dwsnet"]))
    # the published numbers beside ours, "—" where a paper gives none
    assert (cell["MNIST INRs, test acc. %, published (its paper)"],
            cell["Fashion-MNIST INRs, test acc. %, published (its paper)"]) == ("85.71", "67.06")
    assert cell["generalization, Kendall τ, published (Small CNN Zoo CIFAR10-GS)"] == "—"
    assert dict(zip(names, rows["ng-transformer"]))[
        "generalization, Kendall τ, published (Small CNN Zoo CIFAR10-GS)"] == "0.935"
    # how far each is, and the time left at the pace of its recent epochs (one epoch done, one to go)
    progress = weight_models.checkpoint_progress(Path(mnist["cells"]["dwsnet"]["run_dir"]), "classify")
    assert 0 < progress.recent_epoch_seconds <= progress.seconds
    to_go = f"~{weight_models.fmt_seconds(progress.recent_epoch_seconds)} to go"
    # and the best epoch so far, read here from the checkpoint's own history
    (saved,) = (Checkpoint(path, path.stem) for path in (Path(mnist["cells"]["dwsnet"]["run_dir"]) / CHECKPOINTS)
                .glob("*.pt"))
    first = saved.read()["values"]["history"][0]["val_accuracy"]
    best = f", best val {100 * first:.2f} (epoch 1, {saved.label})"
    assert cell["MNIST INRs, test acc. % (smoke)"] == f"unfinished 1/2 epochs, {to_go}{best}"
    assert dict(zip(names, rows["ng-gnn"]))["MNIST INRs, test acc. % (smoke)"] == \
        f"running 1/2 epochs, {to_go}{best}"
    assert cell["Fashion-MNIST INRs, test acc. % (smoke)"] == "not run"
    done = cells(out_root / "smoke", "generalization")["dwsnet"]
    assert cell["generalization, 100 × test MSE (smoke)"] == f"{100 * done['test_mse']:.3f}"
    assert cell["sine, test MSE (smoke)"] == f"{cells(out_root / 'smoke', 'sine')['dwsnet']['test_mse']:.4f}"
    assert cell["adaptation, test acc. % (adapted) (smoke)"] == \
        f"{100 * cells(out_root / 'smoke', 'adapt')['dwsnet']['test_accuracy']:.2f}"
    nfn = dict(zip(names, rows["nfn-np"]))
    assert nfn["adaptation, test acc. % (adapted) (smoke)"] == "— (invariant model)"
    assert nfn["sine, test MSE (smoke)"] == "not run"
    assert f"Fashion-MNIST INR classification: {tmp_path / 'smoke' / 'report-fmnist.md'} (not run yet)" in text

    # the command line: each column at the table's own scale (nothing there: every cell not run)
    weight_models.main(["--summary", "--out", str(tmp_path / "empty")])
    text = (tmp_path / "empty" / "summary.md").read_text()
    assert "MNIST INRs, test acc. % (full)" in text and "sine, test MSE (ci)" in text
    assert "| `scalegmn-b` | not run | 96.59 | not run | 80.78 | not run | not run | not run | — | — (invariant " \
           "model) |" in text


def test_the_best_epoch_so_far_is_found_over_every_training_in_the_tasks_direction(tmp_path):
    """An unfinished cell's checkpoints (read in the order lr0.0001, lr0.001): a running lr candidate and a
    finished one; the best epoch is the task's (highest accuracy, lowest MSE) over both, and a non-finite
    value, here the first read, never counts. The time to go: at the running training's recent pace, or
    (checkpoints without epoch times) the mean over every epoch so far."""
    folder = tmp_path / CHECKPOINTS

    def history(pairs):
        return [{"epoch": e, "train_loss": 1.0, "val_accuracy": a, "val_mse": m} for e, (a, m) in enumerate(pairs)]

    Checkpoint(folder / "lr0.001-seed0.pt", "lr0.001-seed0").finish(
        {"history": history([(0.5, 0.30), (0.7, 0.25)]), "seconds": 10.0})
    running = Checkpoint(folder / "lr0.0001-seed0.pt", "lr0.0001-seed0")
    values = {"epoch": 3, "history": history([(float("nan"), float("nan")), (0.6, 0.40), (0.65, 0.20)]),
              "seconds": 20.0}
    running.save({}, values)  # written before zoo train kept epoch times: no recent pace
    cell = {"model": "dwsnet", "status": weight_models.RUNNING, "run_dir": str(tmp_path), "epochs_done": 0,
            "epochs_planned": 10}

    def time_to_go():
        return weight_models.summary_cell("mnist", cell, "dwsnet", weight_models.ACCURACY).split(", ")[1]

    assert time_to_go() == f"~{weight_models.fmt_seconds(5 * 30.0 / 5)} to go"  # the mean over every epoch
    classify = weight_models.checkpoint_progress(tmp_path, "classify")
    assert classify == (5, 30.0, 0.7, 2, "lr0.001-seed0", None, 0.0)
    assert weight_models.checkpoint_progress(tmp_path, "regress")[2:5] == (0.20, 3, "lr0.0001-seed0")
    assert weight_models.checkpoint_progress(tmp_path / "nothing", "classify") == (0, 0.0, None, None, None, None,
                                                                                   0.0)
    # the running training's recent pace: its last RECENT_EPOCHS epochs (a slow first one left out)
    running.save({}, {**values, "epoch_seconds": [100.0, *[6.0] * (weight_models.RECENT_EPOCHS - 1), 11.0]})
    assert weight_models.checkpoint_progress(tmp_path, "classify").recent_epoch_seconds == pytest.approx(7.0)
    assert time_to_go() == f"~{weight_models.fmt_seconds(5 * 7.0)} to go"
    # saved within its 4th epoch (zoo train --checkpoint-minutes), before any epoch time was kept: 2 of 5
    # batches done, and the pace counts that share of an epoch and its seconds
    running.save({}, {**values, "seconds": 26.0,
                      "within": {"batches": 2, "of": 5, "losses": [1.0, 1.0], "seconds": 6.0}})
    assert weight_models.checkpoint_progress(tmp_path, "classify").partial == pytest.approx(0.4)
    shown = weight_models.summary_cell("mnist", cell, "dwsnet", weight_models.ACCURACY)
    pace = (10.0 + 26.0) / (5 + 0.4)
    assert shown.startswith(f"running 5/10 epochs and 40% of the next, "
                            f"~{weight_models.fmt_seconds((10 - 5 - 0.4) * pace)} to go, best val"), shown
    for column in weight_models.COLUMNS.values():  # the summary shows the best with the column's first metric
        assert column.metrics[0].name == TASKS[column.task].metric == column.selection


def test_full_cells_of_the_graph_models_train_in_bf16_and_only_the_neural_graphs_compile():
    """--precision bf16 (part of a run's identity) for the neural graphs' and ScaleGMN's full cells only, and
    --compile (speed only) for the neural graphs' full cells only; each cell's zoo train command says so, and
    the ci cells whose lr they take stay float32 and eager."""
    from dws.tasks.options import MODELS
    from pipelines.weight_models import SCALES, cell_options, train_command

    for model in MODELS:
        full = cell_options(SCALES["full"], Path("/s/full-mnist-inr"), Path("/o"), model, 1e-3)
        bf16 = model in ("ng-gnn", "ng-transformer", "scalegmn", "scalegmn-b")
        assert (full.precision == "bf16") == bf16 and ("--precision bf16" in train_command(full)) == bf16, model
        compiled = model in ("ng-gnn", "ng-transformer")
        assert full.compile == compiled and ("--compile" in train_command(full)) == compiled, model
        ci = cell_options(SCALES["ci"], Path("/s/ci-mnist-inr"), Path("/o"), model, None)
        assert ci.precision == "fp32" and not ci.compile, model


def fake_cpu(tmp_path: Path, monkeypatch, native: bool) -> None:
    """/proc/cpuinfo of an AVX2 CPU, with native bfloat16 (AMX) or without it."""
    from zoo import cpuinfo

    fake = tmp_path / f"cpuinfo-{native}"
    fake.write_text(f"processor\t: 0\nflags\t\t: avx2 fma{' amx_bf16' if native else ''}\n")
    monkeypatch.setattr(cpuinfo, "CPUINFO", fake)


@pytest.mark.parametrize("native", [False, True])
def test_a_bf16_cell_trains_in_fp32_on_a_cpu_without_native_bfloat16(stores, tmp_path, monkeypatch, native):
    """A cell the protocol trains in bf16 trains in fp32 on a CPU without native bfloat16 (bf16's steps several
    times its fp32 ones there: days more of a full cell), said in one line with the reason, and its record
    names the command that made it; on a CPU that has it, in bf16."""
    fake_cpu(tmp_path, monkeypatch, native)
    monkeypatch.setitem(weight_models.SCALES, "smoke", replace(one_epoch(), bf16=("dwsnet",)))
    out, lines = tmp_path / "smoke", []
    weight_models.run("smoke", out, 1, MODELS, log=lines.append, stores=stores)
    found = cells(out)
    assert found["mlp"]["status"] == found["dwsnet"]["status"] == "done"
    # and a cell the protocol also compiles compiles in either precision (the options only, not trained here)
    compiled = replace(weight_models.cell_options(replace(one_epoch(), bf16=("dwsnet",), compiled=("dwsnet",)),
                                                  stores, tmp_path / "other", "dwsnet", 1e-3), out=str(tmp_path / "none"))
    chosen = weight_models.cell_precision(compiled)[0]
    assert chosen.compile and chosen.precision == ("bf16" if native else "fp32")
    config = json.loads((Path(found["dwsnet"]["run_dir"]) / "config.json").read_text())
    said = [line for line in lines if line.startswith("dwsnet: training in fp32 on this machine, not in the "
                                                      "protocol's bf16: --precision bf16 on a CPU without native")]
    if native:
        assert "--precision bf16" in found["dwsnet"]["zoo_train"] and config["options"]["precision"] == "bf16"
        assert not said
    else:
        assert "--precision" not in found["dwsnet"]["zoo_train"] and config["options"]["precision"] == "fp32"
        assert len(said) == 1 and said[0].endswith("a cell recorded in either stands for the other")
    # a rerun on the other kind of CPU reuses the finished cell, in the precision it trained in
    fake_cpu(tmp_path, monkeypatch, not native)
    lines = []
    weight_models.run("smoke", out, 1, MODELS, log=lines.append, stores=stores)
    assert cells(out)["dwsnet"] == found["dwsnet"]
    assert f"dwsnet: reusing the finished run in {found['dwsnet']['run_dir']}" in lines


def test_an_unfinished_bf16_cell_resumes_in_bf16_on_a_cpu_without_native_bfloat16(stores, tmp_path, monkeypatch):
    """A bf16 cell interrupted on a CPU that has native bfloat16 and rerun on one that has not (a new machine,
    its checkpoints carried or kept) resumes in bf16, as saved: zoo train would refuse to resume it in fp32."""
    fake_cpu(tmp_path, monkeypatch, True)
    monkeypatch.setitem(weight_models.SCALES, "smoke", replace(weight_models.SCALES["smoke"], bf16=("mlp",)))
    out = tmp_path / "smoke"
    real_save = interrupt_at_first_save(monkeypatch, lambda: None)
    with pytest.raises(KeyboardInterrupt):
        weight_models.run("smoke", out, 1, ["mlp"], log=QUIET, stores=stores, lrs={"mlp": 1e-3})
    assert cells(out)["mlp"]["status"] == "unfinished"
    monkeypatch.setattr(Checkpoint, "save", real_save)
    fake_cpu(tmp_path, monkeypatch, False)
    lines = []
    weight_models.run("smoke", out, 1, ["mlp"], log=lines.append, stores=stores, lrs={"mlp": 1e-3})
    assert any("resuming lr 0.001, seed 0 after epoch 1 of 2" in line for line in lines)
    assert not any("training in fp32" in line for line in lines)
    cell = cells(out)["mlp"]
    assert cell["status"] == "done" and "--precision bf16" in cell["zoo_train"]
    assert json.loads((Path(cell["run_dir"]) / "config.json").read_text())["options"]["precision"] == "bf16"


def test_a_cell_recorded_without_speed_only_options_stands_for_the_cell_with_them():
    """The recorded ng-gnn full cell ran without --compile (speed only), which its cell now adds: the record
    still stands, so a new machine does not retrain it, nor one that trains the cell in fp32 (the machine's
    choice: cell_precision); an option that changes what it computes (the lr, the epochs) makes the record
    another cell."""
    from pipelines.weight_models import SCALES, cell_options, comparable_command, standing_records, train_command

    protocol, store = SCALES["full"], Path("/there/full-mnist-inr")
    now = train_command(cell_options(protocol, store, Path("/o"), "ng-gnn", 5e-4))
    assert "--compile" in now
    then = now.replace(" --compile", "")
    assert comparable_command(then) == comparable_command(now)
    assert comparable_command(now + " --loader-workers 3 --restart --checkpoint-minutes 5") == comparable_command(now)
    cell = {"zoo_train": then, "lr": 5e-4, "recorded": "r.json"}
    assert list(standing_records({"ng-gnn": cell}, protocol, Path("/elsewhere"), ["ng-gnn"], {}, "classify",
                                 log=pytest.fail)) == ["ng-gnn"]
    lines = []
    assert comparable_command(then.replace(" --precision bf16", "")) == comparable_command(now)
    for other in (then.replace("--lr 0.0005", "--lr 0.001"), then.replace("--epochs 100", "--epochs 99")):
        assert comparable_command(other) != comparable_command(now)
        assert not standing_records({"ng-gnn": {**cell, "zoo_train": other}}, protocol, Path("/elsewhere"),
                                    ["ng-gnn"], {}, "classify", log=lines.append)
    assert len(lines) == 2 and all("training it here" in line for line in lines)


def test_a_finished_cell_of_older_model_code_is_moved_aside_and_trained_anew(stores, tmp_path, monkeypatch):
    """A model version bump (dws.tasks.options.MODEL_VERSIONS) makes its finished cell another cell: the
    old run directory is kept beside it as RUN.model-vN, said in one line; the other cells are reused."""
    from dws.tasks.options import MODEL_VERSIONS

    out = tmp_path / "smoke"
    monkeypatch.setitem(weight_models.SCALES, "smoke", one_epoch())
    weight_models.run("smoke", out, 1, MODELS, log=QUIET, stores=stores)
    first = cells(out)
    monkeypatch.setitem(MODEL_VERSIONS, "dwsnet", 2)
    lines = []
    weight_models.run("smoke", out, 1, MODELS, log=lines.append, stores=stores)
    run_dir = Path(first["dwsnet"]["run_dir"])
    aside = run_dir.with_name(run_dir.name + ".model-v1")
    assert any(f"moved to {aside}" in line for line in lines)
    assert sum("reusing the finished run" in line for line in lines) == 1  # mlp's
    assert (aside / "metrics.json").is_file() and (run_dir / "metrics.json").is_file()
    assert json.loads((run_dir / "config.json").read_text())["model_version"] == 2
    assert cells(out)["dwsnet"]["status"] == "done" and cells(out)["mlp"] == first["mlp"]


def test_a_cell_of_older_model_code_is_neither_shown_nor_used_for_its_lr(stores, tmp_path, monkeypatch):
    """Until its column runs again, a finished cell of a model whose code has moved on (a version bump) is
    shown as superseded in the summary, and the full scale refuses to take its lr, naming why; cells
    recorded before versions were (no ``model_version``) count as version 1."""
    from dws.tasks.options import MODEL_VERSIONS

    monkeypatch.setitem(weight_models.SCALES, "smoke", one_epoch())
    weight_models.run("smoke", tmp_path / "smoke", 1, MODELS, log=QUIET, stores=stores)
    assert all(cell["model_version"] == 1 for cell in cells(tmp_path / "smoke").values())
    metric = weight_models.COLUMNS["mnist"].metrics[0]
    cell = cells(tmp_path / "smoke")["dwsnet"]
    assert weight_models.summary_cell("mnist", cell, "dwsnet", metric) == metric.show(cell[metric.key])
    monkeypatch.setitem(MODEL_VERSIONS, "dwsnet", 2)
    for recorded in (cell, {k: v for k, v in cell.items() if k != "model_version"}):
        assert weight_models.summary_cell("mnist", recorded, "dwsnet", metric) == \
            "superseded: model version 1, now 2 (rerun the column)"
    mlp = weight_models.summary_cell("mnist", cells(tmp_path / "smoke")["mlp"], "mlp", metric)
    assert not mlp.startswith("superseded")

    monkeypatch.setitem(weight_models.SCALES, "smoke-full", Protocol(
        "smoke", dict(epochs=1, seeds=1, batch_size=8, hidden_channels=4), lr_from="smoke", progress=False))
    with pytest.raises(ValueError, match=r"no learning rate chosen at smoke scale for dwsnet \(its cell there is "
                                         r"of model version 1, now 2\): run .*--models dwsnet"):
        weight_models.run("smoke-full", tmp_path / "smoke-full", 1, MODELS, log=QUIET, stores=stores)


def test_a_cell_finished_on_another_machine_is_taken_from_the_records_not_retrained(stores, tmp_path, monkeypatch):
    """--record copies finished cells into files to commit; a machine without their run directories takes
    them (no zoo made where nothing is left to train), a full scale takes its lr from them, and a record
    whose command differs from the cell's now does not stand for it."""
    monkeypatch.setitem(weight_models.SCALES, "smoke", one_epoch())
    first, records = tmp_path / "first", tmp_path / "records"
    weight_models.run("smoke", first / "smoke", 1, MODELS, log=QUIET, stores=stores)
    finished = cells(first / "smoke")
    weight_models.main(["--record", "--out", str(first), "--recorded", str(records)])
    recorded_file = records / "smoke" / "results-mnist.json"
    assert json.loads(recorded_file.read_text())["cells"] == finished
    lines = []
    assert weight_models.record_cells(first, records, log=lines.append) == 0 and lines == []  # nothing new

    # a new machine: no run directories, no zoo
    monkeypatch.setattr(weight_models, "train_run", lambda *a, **k: pytest.fail("a recorded cell was retrained"))
    second, no_zoos, lines = tmp_path / "second", tmp_path / "no-zoos", []
    text = weight_models.run("smoke", second / "smoke", 1, MODELS, log=lines.append, stores=no_zoos,
                             recorded=records).read_text()
    assert not no_zoos.exists()
    taken = cells(second / "smoke")
    assert taken == {m: {**finished[m], "recorded": str(recorded_file)} for m in MODELS}
    assert sum(f"finished on another machine, recorded in {recorded_file}: not retrained" in line
               for line in lines) == 2
    assert f"finished on another machine (`mlp`, `dwsnet`): recorded in {recorded_file}" in text
    summary = weight_models.write_summary(tmp_path / "third", {c: "smoke" for c in weight_models.COLUMNS},
                                          recorded=records).read_text()
    assert f"| `dwsnet` | {100 * finished['dwsnet']['test_accuracy']:.2f} (recorded) | 85.71 | not run |" in summary
    assert f"(recorded): finished on another machine; its numbers and commands in {recorded_file}" in summary
    # the committed table: the recorded cells alone, unmarked, each with the command that made it
    table = weight_models.write_recorded_table(records, {c: "smoke" for c in weight_models.COLUMNS}).read_text()
    assert f"| `dwsnet` | {100 * finished['dwsnet']['test_accuracy']:.2f} | 85.71 | not run |" in table
    assert "(recorded)" not in table and "[smoke/results-mnist.json](smoke/results-mnist.json)" in table
    for model in MODELS:
        assert f"`{model}`: lr {finished[model]['lr']:g} (chosen on val)" in table
        assert f"`{finished[model]['zoo_train']}`" in table
    # this machine's own results are not recorded again (nothing finished here)
    assert weight_models.record_cells(second, records) == 0

    # a full scale takes each lr from the recorded search (undo: train again, at smoke's own 2 epochs)
    monkeypatch.undo()
    monkeypatch.setattr(weight_models, "RECORDED", tmp_path / "no-records")
    monkeypatch.setitem(weight_models.SCALES, "smoke-full", Protocol(
        "smoke", dict(epochs=1, seeds=1, batch_size=8, hidden_channels=4), lr_from="smoke", progress=False))
    weight_models.run("smoke-full", second / "smoke-full", 1, MODELS, log=QUIET, stores=stores, recorded=records)
    full = cells(second / "smoke-full")
    assert {m: (full[m]["lr"], full[m]["lr_from"], full[m]["status"]) for m in MODELS} == \
        {m: (finished[m]["lr"], "val at smoke", "done") for m in MODELS}

    # the protocol changed since (2 epochs, not 1): the record does not stand, the cell trains here
    lines = []
    weight_models.run("smoke", tmp_path / "third" / "smoke", 1, ["mlp"], log=lines.append, stores=stores,
                      recorded=records)
    (said,) = [line for line in lines if "training it here" in line]
    assert said.startswith(f"mlp: the cell recorded in {recorded_file} ran `--model mlp --task classify --epochs 1 ")
    assert "where this cell runs `--model mlp --task classify --epochs 2 " in said and "on smoke-mnist-inr" in said
    mine = cells(tmp_path / "third" / "smoke")["mlp"]
    assert mine["status"] == "done" and "recorded" not in mine and mine["epochs_planned"] == 2 * len(PAPER_LRS)
    # a finished cell is never replaced in the records: this machine's other one is said, not written
    before = recorded_file.read_text()
    lines = []
    assert weight_models.record_cells(tmp_path / "third", records, log=lines.append) == 0
    assert lines == [f"smoke mnist mlp: recorded already in {recorded_file} with other results; kept that one "
                     "(remove it there to record this machine's)"]
    assert recorded_file.read_text() == before
    # a record of older model code stands for nothing, and is replaced by a new one
    old = json.loads(before)
    old["cells"]["mlp"]["model_version"] = 0
    recorded_file.write_text(json.dumps(old))
    assert list(weight_models.recorded_cells(records, "smoke", "mnist")) == ["dwsnet"]
    assert weight_models.record_cells(tmp_path / "third", records, log=QUIET) == 1
    assert json.loads(recorded_file.read_text())["cells"]["mlp"] == mine

    # a damaged record is an error, in one line, not a reason to retrain
    recorded_file.write_text(before[: len(before) // 2])
    with pytest.raises(SystemExit) as refused:
        weight_models.main(["--scale", "smoke", "--models", "mlp", "--out", str(tmp_path / "fourth"),
                            "--stores", str(stores), "--recorded", str(records)])
    message = str(refused.value.code)
    assert message.startswith(f"error: {recorded_file}: not a file of recorded cells (") and "\n" not in message
    assert message.endswith("restore it from git")


def test_the_committed_records_stand_for_the_cells_the_pipeline_trains_now():
    """docs/recorded/weight-models: every recorded cell is of the model's code now, and its zoo train command
    is the one its cell runs now (at the recorded lr), so a new machine takes it instead of retraining."""
    recorded = weight_models.CHECKOUT / "docs" / "recorded" / "weight-models"
    files = sorted(recorded.glob("*/results-*.json"))
    assert files, "no committed records"
    for path in files:
        scale, column = path.parent.name, path.stem.removeprefix("results-")
        found = weight_models.recorded_cells(recorded, scale, column)
        saved = json.loads(path.read_text())["cells"]
        assert list(found) == list(saved), f"{path}: a cell of older model code, or not finished"
        protocol = weight_models.column_protocol(column, scale)
        standing = weight_models.standing_records(found, protocol, Path("/elsewhere") / scale, list(found), {},
                                                  weight_models.COLUMNS[column].task, log=pytest.fail)
        assert list(standing) == list(found)
        for cell in found.values():
            assert all(cell.get(m.key) is not None for m in weight_models.COLUMNS[column].metrics)


def test_the_committed_carried_cells_continue_the_cells_the_pipeline_trains_now():
    """docs/recorded/weight-models/*/carried: each carried cell is of the model's code now, its zoo train
    command is the one its cell runs now (at its lr), and its files are whole checkpoints (one training at a
    time: at most one unfinished), so a new machine resumes it instead of training the cell from its start."""
    recorded = weight_models.CHECKOUT / "docs" / "recorded" / "weight-models"
    folders = sorted(p.parent for p in recorded.glob("*/carried/*/carried.json"))
    if not folders:
        pytest.skip("no carried cell committed")
    for folder in folders:
        about = carried.read_about(folder)
        scale, column, model = about["scale"], about["column"], about["model"]
        assert folder == carried.carried_folder(recorded, scale, column, model)
        argv = shlex.split(about["zoo_train"])
        lr = float(argv[argv.index("--lr") + 1]) if "--lr" in argv else None
        protocol = weight_models.column_protocol(column, scale)
        now = weight_models.cell_options(protocol, weight_models.recorded_store(about), Path("/elsewhere") / scale,
                                         model, lr, weight_models.COLUMNS[column].task)
        ran, runs = map(weight_models.comparable_command, (about["zoo_train"], weight_models.train_command(now)))
        assert carried.mismatch(about, ran, runs, weight_models.model_version(model),
                                {"content_id": about["content_id"]}) is None
        assert about["content_id"].startswith("sha256:") and 0 < about["epochs_done"] < about["epochs_planned"]
        # an lr search carries its finished candidates (reused on resume) beside the one in training
        statuses = [Checkpoint(folder / name, name).read()["status"] for name in about["files"] if name.endswith(".pt")]
        assert statuses and set(statuses) <= {"training", "finished"} and statuses.count("training") <= 1


def test_a_carried_lr_search_resumes_on_a_new_machine_reusing_its_finished_candidates(stores, tmp_path, monkeypatch):
    """A cell stopped inside its lr search (one candidate finished, the next one epoch in) is carried with
    both checkpoints; a new machine reuses the finished candidate, resumes the other, and chooses the lr
    and reaches the numbers of a search never stopped."""
    whole = tmp_path / "whole" / "smoke"
    weight_models.run("smoke", whole, 1, ["mlp"], log=QUIET, stores=stores)
    uninterrupted = cells(whole)["mlp"]
    assert len(uninterrupted["lr_search"]) > 2

    real_save, saved = Checkpoint.save, []

    def save_then_interrupt_at_the_third(self, objects, values):  # candidate 1's two epochs, candidate 2's first
        real_save(self, objects, values)
        saved.append(self.path.stem)
        if len(saved) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(Checkpoint, "save", save_then_interrupt_at_the_third)
    first, records = tmp_path / "first", tmp_path / "records"
    with pytest.raises(KeyboardInterrupt):
        weight_models.run("smoke", first / "smoke", 1, ["mlp"], log=QUIET, stores=stores)
    monkeypatch.setattr(Checkpoint, "save", real_save)
    assert saved[0] == saved[1] != saved[2]
    assert weight_models.carry_cells(first, records, log=QUIET) == 1
    folder = records / "smoke" / "carried" / "mnist-mlp"
    about = json.loads((folder / "carried.json").read_text())
    statuses = {name[:-3]: Checkpoint(folder / name, name).read()["status"] for name in about["files"]
                if name.endswith(".pt")}
    assert statuses == {saved[0]: "finished", saved[2]: "training"} and about["epochs_done"] == 3

    lines = []
    weight_models.run("smoke", tmp_path / "second" / "smoke", 1, ["mlp"], log=lines.append, stores=stores,
                      recorded=records)
    assert any(line.startswith(f"mlp: resuming the run carried in {folder}: 3 of ") for line in lines)
    resumed = cells(tmp_path / "second" / "smoke")["mlp"]
    assert resumed["status"] == "done" and resumed["lr_search"] == uninterrupted["lr_search"]
    assert (resumed["lr"], resumed["test_accuracy"]) == (uninterrupted["lr"], uninterrupted["test_accuracy"])


def test_every_stage_of_the_queue_names_a_cell_the_pipeline_trains():
    """pipelines/weight_models_queue.sh: each stage's column, scale and models are accepted as the pipeline
    reads them (a scale the column has, models it applies to), and its full cells come after the ci cells
    their learning rates come from."""
    script = (Path(weight_models.__file__).parent / "weight_models_queue.sh").read_text()
    cheap = re.search(r"^CHEAP=(\S+)$", script, re.M).group(1)
    stages = [shlex.split(line.replace("$CHEAP", cheap))[1:] for line in script.splitlines()
              if line.startswith("stage ")]
    assert len(stages) >= 20
    seen_ci = set()
    for name, column, scale, models, *_ in stages:
        args = weight_models.parse_args(["--column", column, "--scale", scale, "--models", models])
        chosen = weight_models.column_models(column, weight_models.parse_models(args.models) if args.models else None,
                                             log=QUIET)
        weight_models.column_protocol(column, scale)
        if scale == "ci":
            seen_ci |= {(column, m) for m in chosen}
        elif column in ("mnist", "fmnist", "generalization"):
            assert {(column, m) for m in chosen} <= seen_ci, f"{name}: full before its ci cells"
    for column in ("mnist", "fmnist"):  # every row of the two INR columns is queued at full scale
        assert {(column, m) for m in weight_models.MODELS} <= seen_ci


def test_an_unfinished_cell_is_carried_to_a_new_machine_and_resumes_there_as_if_never_stopped(
        stores, tmp_path, monkeypatch):
    """--record also carries an unfinished cell's checkpoints (files to commit); a new machine, whose zoo
    was generated anew (another folder and creation time, the same networks), puts them back and resumes
    the cell, which ends as an uninterrupted one does; a carried run of other networks, or of another
    command, is said and not used; a damaged one is an error in one line; one too large is not carried."""
    lrs = {"mlp": 1e-3}
    whole = tmp_path / "whole" / "smoke"
    weight_models.run("smoke", whole, 1, ["mlp"], log=QUIET, stores=stores, lrs=lrs)
    uninterrupted = cells(whole)["mlp"]

    first, records = tmp_path / "first", tmp_path / "records"
    real_save = interrupt_at_first_save(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        weight_models.run("smoke", first / "smoke", 1, ["mlp"], log=QUIET, stores=stores, lrs=lrs)
    monkeypatch.setattr(Checkpoint, "save", real_save)
    lines = []
    assert weight_models.carry_cells(first, records, log=lines.append) == 1
    folder = records / "smoke" / "carried" / "mnist-mlp"
    about = json.loads((folder / "carried.json").read_text())
    store = Path(cells(first / "smoke")["mlp"]["zoo_train"].split()[2])
    assert about["content_id"] == weight_models.WeightStore(store).manifest["content_id"]
    zoo = records / "smoke" / "zoo-checksums" / f"mnist-{about['content_id'][7:23]}.json"
    assert lines == [f"smoke mnist mlp: 1 of 2 epochs carried in {folder}",
                     f"smoke mnist mlp: its zoo's checksums recorded in {zoo}"]
    kept = json.loads(zoo.read_text())  # what the next machine's `zoo compare` reads
    assert (kept["content_id"], kept["networks_id"]) == (about["content_id"], about["networks_id"])
    assert kept["machines"] == [kept["machine"]["cpu"]] and "arrays/W1/c/0/0/0" in kept["entries"]
    assert about["content_id"].startswith("sha256:") and about["epochs_done"] == 1
    assert sorted(p.name for p in folder.iterdir()) == ["carried.json", "lr0.001-seed0.pt", "settings.json"]

    # the summary of a machine that has no run of the cell shows the carried one
    summary = weight_models.write_summary(tmp_path / "elsewhere", {c: "smoke" for c in weight_models.COLUMNS},
                                          recorded=records).read_text()
    best = f"{100 * about['best_val']:.2f} (epoch 1)"
    assert f"| `mlp` | carried 1/2 epochs, best val {best}: another machine's run, resumed when its column runs |" \
        in summary
    table = weight_models.write_recorded_table(records, {c: "smoke" for c in weight_models.COLUMNS}).read_text()
    assert f"| `mlp` | carried 1/2 epochs, best val {best}" in table

    # a new machine: the zoo made anew elsewhere (its creation time differs, its networks do not)
    again = tmp_path / "again"
    inr_store("smoke", again / "smoke", 1, "mnist", log=QUIET)
    regenerated = weight_models.WeightStore(again / "smoke" / "stores" / store.name).manifest
    assert regenerated["created"] != weight_models.WeightStore(store).manifest["created"]
    second, lines = tmp_path / "second", []
    weight_models.run("smoke", second / "smoke", 1, ["mlp"], log=lines.append, stores=again, lrs=lrs,
                      recorded=records)
    assert f"mlp: resuming the run carried in {folder}: 1 of 2 epochs done on another machine " \
           f"({about['carried_at']})" in lines
    assert any("resuming lr 0.001, seed 0 after epoch 1 of 2" in line for line in lines)
    resumed = cells(second / "smoke")["mlp"]
    assert resumed["status"] == "done" and resumed["test_accuracy"] == uninterrupted["test_accuracy"]
    assert resumed["content_id"] == regenerated["content_id"] == uninterrupted["content_id"] == about["content_id"]
    histories = [json.loads((Path(c["run_dir"]) / "metrics.json").read_text())["history"]
                 for c in (uninterrupted, resumed)]
    assert histories[0] == histories[1]
    # finished: recorded, and its carried run removed
    lines = []
    assert weight_models.record_cells(second, records, log=QUIET) == 1
    assert weight_models.carry_cells(second, records, log=lines.append) == 0 and not folder.exists()
    assert lines == [f"smoke mnist mlp: finished; its carried run removed from {folder}"]

    # carried again from the first machine (its cell not yet finished there; the record left out from here
    # on); a carried run further on is kept over this machine's
    (records / "smoke" / "results-mnist.json").unlink()
    assert weight_models.carry_cells(first, records, log=QUIET) == 1
    further = {**about, "epochs_done": 5}
    (folder / "carried.json").write_text(json.dumps(further))
    lines = []
    assert weight_models.carry_cells(first, records, log=lines.append) == 0
    assert lines == [f"smoke mnist mlp: {folder} carries 5 epochs, this machine's run 1: kept that one"]
    (folder / "carried.json").write_text(json.dumps(about))

    def third_machine(lr=1e-3, **kw):
        lines = []
        weight_models.run("smoke", tmp_path / "third" / "smoke", 1, ["mlp"], log=lines.append, stores=again,
                          lrs={"mlp": lr}, recorded=records, **kw)
        shutil.rmtree(tmp_path / "third")
        return lines

    # the same networks with other diagnostics (another content ID, the same networks ID): resumed
    assert about["networks_id"].startswith("networks-sha256:")
    (folder / "carried.json").write_text(json.dumps({**about, "content_id": "sha256:" + "0" * 64}))
    assert any(line.startswith(f"mlp: resuming the run carried in {folder}") for line in third_machine())

    # other networks, or another command: said, and the cell trains from its start
    (folder / "carried.json").write_text(json.dumps({**about, "content_id": "sha256:" + "0" * 64,
                                                     "networks_id": "networks-sha256:" + "1" * 64}))
    lines = third_machine()
    (said,) = [line for line in lines if "does not continue" in line]
    assert said.startswith(f"mlp: the run carried in {folder} does not continue this cell (it trained on a zoo of "
                           f"content sha256:000") and said.endswith("training it from its start")
    assert "networks-sha256:111" in said and not any("resuming" in line for line in lines)
    older = {k: v for k, v in about.items() if k != "networks_id"}  # carried before networks IDs
    (folder / "carried.json").write_text(json.dumps({**older, "content_id": "sha256:" + "0" * 64}))
    (said,) = [line for line in third_machine() if "does not continue" in line]
    assert "its record has no networks ID to tell: `zoo compare` of the two zoos says which" in said
    (folder / "carried.json").write_text(json.dumps(about))
    (said,) = [line for line in third_machine(lr=5e-4) if "does not continue" in line]
    assert "(it ran `--model mlp --task classify --epochs 2 --batch-size 8 --lr 0.001 " in said
    assert "where this cell runs `--model mlp --task classify --epochs 2 --batch-size 8 --lr 0.0005 " in said

    # a damaged carried checkpoint: an error in one line, nothing trained
    pt = folder / "lr0.001-seed0.pt"
    pt.write_bytes(pt.read_bytes()[:100])
    with pytest.raises(SystemExit) as refused:
        weight_models.main(["--scale", "smoke", "--models", "mlp", "--lr", "mlp=1e-3", "--out",
                            str(tmp_path / "fourth"), "--stores", str(again), "--recorded", str(records)])
    message = str(refused.value.code)
    assert message == f"error: {pt} cannot be read (CheckpointError); restore it from git, or delete {folder} to " \
                      f"train the cell from its start"
    assert not (tmp_path / "fourth" / "smoke" / "runs").exists() or \
        not any((tmp_path / "fourth" / "smoke" / "runs").rglob("*.pt"))

    # too large to commit: not carried, said; what was carried stays
    monkeypatch.setattr(carried, "CARRY_LIMIT", 10)
    lines = []
    assert weight_models.carry_cells(first, records, log=lines.append) == 0
    assert len(lines) == 1 and lines[0].startswith("smoke mnist mlp: not carried: its checkpoints are ")
    assert lines[0].endswith("MiB, more than the 0 MiB carried in git") and pt.exists()


@pytest.mark.parametrize("model, carried_here", [("dwsnet", True), ("nfn-np", True), ("nfn-hnp", True),
                                                  ("ng-gnn", True), ("scalegmn", False)])
def test_the_carry_limit_admits_the_inr_cells_of_a_few_hours_and_not_scalegmns(model, carried_here):
    """A full MNIST INR cell's checkpoints (four floats a parameter: model, best model, AdamW's moments) are carried
    for the DWSNet, the NFNs and ng-gnn (hours of a new machine each, lost before at 4 MiB), not for ScaleGMN."""
    _, desc = build_model(model, (2, 32, 32, 1), 10, activation="sine")
    assert (16 * desc["params"] * 1.02 <= carried.CARRY_LIMIT) is carried_here, desc["params"]


def test_the_committed_table_is_the_one_the_committed_records_make(tmp_path):
    """docs/recorded/weight-models/table.md, which the README links, says what the recorded cells say: a
    record committed without `--record`'s table (or a table edited by hand) fails here."""
    recorded, copy = weight_models.CHECKOUT / "docs" / "recorded" / "weight-models", tmp_path / "recorded"
    shutil.copytree(recorded, copy)
    made = weight_models.write_recorded_table(copy).read_text()
    assert (recorded / weight_models.TABLE).read_text() == made, \
        "docs/recorded/weight-models/table.md is not the recorded cells' table: run --record and commit it"
    assert "| `scalegmn` | 97.60 | 96.57 |" in made  # a recorded full MNIST cell
    assert re.search(r"^- recorded: \d+ of 39 cells \(MNIST INRs \(full\) \d of 9, Fashion-MNIST INRs \(full\) \d of 9, "
                     r"sine \(ci\) \d of 9, generalization \(full\) \d of 9, adaptation \(ci\) \d of 3\)$", made, re.M)
    assert "| `dwsnet` | 94.21 | 85.71 |" in made  # a cell recorded under the protocol shows its number
    # one not yet run points to the earlier protocol's measurement (earlier.json): the DWSNet's full Fashion-MNIST
    # cell and the generalization column's full-zoo runs of 2026-11-25 (its DWSNet without BN), as they read until
    # the queue records those cells (taken out of the copy, so that a records commit does not break this test)
    for column in ("fmnist", "generalization"):
        results = weight_models.results_path(copy / "full", column)
        saved = weight_models.read_results(results)
        if saved:
            saved["cells"].pop("dwsnet", None)
            results.write_text(json.dumps(saved))
        shutil.rmtree(carried.carried_folder(copy, "full", column, "dwsnet"), ignore_errors=True)
    unrecorded = weight_models.write_recorded_table(copy).read_text()
    assert "| `dwsnet` | 94.21 | 85.71 | not run (earlier protocol: 74.33 entry) | 67.06 |" in unrecorded
    assert "| not run (earlier protocol: 0.012 entry --no-bn) | not run (earlier protocol: 0.790 entry --no-bn) |" \
        in unrecorded


def earlier_item(**change) -> dict:
    item = {"column": "mnist", "scale": "smoke", "model": "dwsnet", "normalize": "entry", "metric": "test_accuracy",
            "value": 0.9393, "lr": 1e-3, "date": "2026-11-25", "epochs": 100, "best_epoch": 99,
            "command": "python -m pipelines.inr_classification --scale full", "documented": "docs/train.md, \"X\""}
    return {**item, **change}


def test_earlier_measurements_stand_beside_the_recorded_table_not_in_its_cells(tmp_path):
    """earlier.json's numbers (another protocol, run directories lost) are shown in a section of their own, and a
    cell with none recorded points to them; a recorded cell is not overwritten by one."""
    records = tmp_path / "recorded"
    records.mkdir()
    (records / weight_models.EARLIER).write_text(json.dumps({"measurements": [
        earlier_item(), earlier_item(normalize="orbit", value=0.935, best_epoch=None),
        earlier_item(model="mlp", value=0.2242, scale="full")]}))  # full: not the table's scale here
    scales = {c: "smoke" for c in weight_models.COLUMNS}
    table = weight_models.write_recorded_table(records, scales).read_text()
    assert "| `dwsnet` | not run (earlier protocol: 93.93 entry / 93.50 orbit) | 85.71 | not run |" in table
    assert "| `mlp` | not run | 17.55 |" in table  # its measurement is at another scale
    section = table[table.index("## Measured before this table's protocol"):]
    assert "| MNIST INRs (smoke) | `dwsnet` | entry | 93.93 | 85.71 | 0.001 (fixed) | 100 (99) | 2026-11-25 | " \
           "docs/train.md, \"X\" | `python -m pipelines.inr_classification --scale full` |" in section
    assert "| `dwsnet` | orbit | 93.50 | 85.71 | 0.001 (fixed) | 100 | " in section and "22.42" not in table
    # a measurement of both metrics, with other options and an lr an earlier search chose: both cells point to it
    (records / weight_models.EARLIER).write_text(json.dumps({"measurements": [earlier_item(
        column="generalization", model="mlp-align", metric=metric, value=value, options="--no-bn", best_epoch=15,
        lr_from="val, an earlier ci search") for metric, value in (("test_mse", 1.26e-4), ("test_kendall_tau", 0.797))]}))
    table = weight_models.write_recorded_table(records, scales).read_text()
    row = next(line for line in table.splitlines() if line.startswith("| `mlp-align` |"))
    assert row.count("not run (earlier protocol: ") == 2
    assert "| not run (earlier protocol: 0.013 entry --no-bn) | not run (earlier protocol: 0.797 entry --no-bn) |" in row
    assert "| `mlp-align` | entry `--no-bn` | 0.013 | — | 0.001 (val, an earlier ci search) | 100 (15) |" in table
    assert "| `mlp-align` | entry `--no-bn` | 0.797 | — |" in table
    # a recorded cell shows itself, and the earlier number stays below only
    (records / weight_models.EARLIER).write_text(json.dumps({"measurements": [
        earlier_item(), earlier_item(normalize="orbit", value=0.935, best_epoch=None)]}))
    (records / "smoke").mkdir()
    cell = {"model": "dwsnet", "status": "done", "lr": 5e-3, "lr_from": "val", "test_accuracy": 0.9,
            "zoo_train": "zoo train S --model dwsnet --task classify --out R", "model_version": 1, "wall_seconds": 5400}
    (records / "smoke" / "results-mnist.json").write_text(json.dumps({"cells": {"dwsnet": cell}}))
    table = weight_models.write_recorded_table(records, scales).read_text()
    assert "| `dwsnet` | 90.00 | 85.71 |" in table and "| `dwsnet` | entry | 93.93 |" in table
    assert "- MNIST INRs (smoke), `dwsnet`: lr 0.005 (chosen on val), 1.5 h of training: `zoo train S " in table
    assert "- recorded: 1 of 39 cells (MNIST INRs (smoke) 1 of 9, Fashion-MNIST INRs (smoke) 0 of 9, " in table
    assert ", adaptation (smoke) 0 of 3)" in table
    # none: no section
    (records / weight_models.EARLIER).unlink()
    assert "Measured before" not in weight_models.write_recorded_table(records, scales).read_text()


@pytest.mark.parametrize("saved, said", [
    ("{", "Expecting property name"),
    ({"cells": {}}, "'measurements'"),
    ({"measurements": {}}, "'measurements' is not a list"),
    ({"measurements": [{"column": "mnist"}]}, "measurement 0 lacks scale, model, normalize"),
    ({"measurements": [earlier_item(column="cifar")]}, "measurement 0: no column 'cifar' at scale 'smoke'"),
    ({"measurements": [earlier_item(scale="xl")]}, "measurement 0: no column 'mnist' at scale 'xl'"),
    ({"measurements": [earlier_item(model="nfn-np", column="adapt")]}, "'nfn-np' / 'test_accuracy' is no cell"),
    ({"measurements": [earlier_item(metric="test_mse")]}, "'dwsnet' / 'test_mse' is no cell of --column mnist"),
    ({"measurements": [earlier_item(value="93.93")]}, "value '93.93' is not a number"),
    ({"measurements": [earlier_item(options=["--no-bn"], lr_from=None)]}, "measurement 0: lr_from, options is not a text"),
])
def test_a_damaged_earlier_file_is_an_error_in_one_line(tmp_path, saved, said):
    (tmp_path / weight_models.EARLIER).write_text(saved if isinstance(saved, str) else json.dumps(saved))
    with pytest.raises(ValueError) as refused:
        weight_models.write_recorded_table(tmp_path, {c: "smoke" for c in weight_models.COLUMNS})
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / weight_models.EARLIER}: not a file of earlier measurements (")
    assert said in message and message.endswith("restore it from git") and "\n" not in message
