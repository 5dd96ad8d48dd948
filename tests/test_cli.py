"""The `zoo` command: info, show and the one-line errors for bad input."""

import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from cli import main


def test_info_and_show(tiny_store, tmp_path):
    runner = CliRunner()
    info = runner.invoke(main, ["info", str(tiny_store)])
    assert info.exit_code == 0, info.output
    assert "train" in info.output and "psnr (dB)" in info.output and "2 -> 32 -> 32 -> 1" in info.output
    assert "fitted by " in info.output
    out = tmp_path / "grid.png"
    shown = runner.invoke(main, ["show", str(tiny_store), "--out", str(out), "--count", "4"])
    assert shown.exit_code == 0, shown.output
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_bad_input_is_one_clear_line(tmp_path):
    runner = CliRunner()
    result = runner.invoke(main, ["info", str(tmp_path)])
    assert result.exit_code == 2 and "not a weight store" in result.output
    result = runner.invoke(main, ["generate", "nope-inr", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "unknown zoo kind" in result.output
    result = runner.invoke(main, ["generate", "mnist-inr", "--out", str(tmp_path / "y"), "--limit", "train=abc"])
    assert result.exit_code == 2 and "expected e.g." in result.output


def test_generate_offers_every_init_the_fitter_knows():
    """The CLI lists the inits literally (it imports torch lazily); keep the list equal to INITS."""
    from zoo.fit.siren import INITS

    option = next(p for p in main.commands["generate"].params if p.name == "init")
    assert tuple(option.type.choices) == INITS


@pytest.mark.parametrize("options, message", [
    (["--limit", "train=-3,val=1,test=1"], "cannot be negative"),
    (["--limit", "train=0,val=0,test=0"], "no networks"),
    (["--limit", "-5"], "--limit must be at least 1"),
    (["--steps", "0"], "--steps must be at least 1"),
    (["--lr", "-1"], "--lr must be positive"),
    (["--workers", "0"], "--workers must be at least 1"),
    (["--device", "foo"], "is not a device"),
])
def test_generate_refuses_bad_values_before_creating_anything(tmp_path, options, message):
    out = tmp_path / "store"
    _assert_refused(["generate", "mnist-inr", "--dataset", "digits", "--out", str(out), *options], message, out)


@pytest.mark.parametrize("options, message", [
    (["--epochs", "0"], "--epochs must be at least 1"),
    (["--seeds", "0"], "--seeds must be at least 1"),
    (["--hidden-channels", "0"], "--hidden-channels must be at least 1"),
    (["--batch-size", "0"], "--batch-size must be at least 1"),
    (["--lr", "0"], "--lr must be positive"),
    (["--dropout", "1"], "--dropout must be in [0, 1)"),
    (["--device", "foo"], "is not a device"),
    (["--clip-grad", "0"], "--clip-grad must be positive"),
    (["--clip-grad", "nan"], "--clip-grad must be positive"),
    (["--weight-decay", "-1e-4"], "--weight-decay must be >= 0"),
])
def test_train_refuses_bad_values_before_creating_a_run(tiny_store, tmp_path, options, message):
    run = tmp_path / "run"
    _assert_refused(["train", str(tiny_store), "--out", str(run), *options], message, run)


@pytest.fixture(scope="module")
def sine_stores(tmp_path_factory):
    """A tiny regression store, and a copy whose networks 3 and 7 lost their frequency (NaN)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from zoo.generate.run import GenerateOptions, generate
    from generate_helpers import replace_networks_table

    root = tmp_path_factory.mktemp("sines")
    generate(GenerateOptions(kind="sine-regression", out=str(root / "sines"), limit=24, chunk_size=8, steps=2,
                             progress=False), log=lambda *_: None)
    shutil.copytree(root / "sines", root / "holes")
    table = pq.read_table(root / "holes" / "networks.parquet")
    holes = pc.is_in(table.column("index"), value_set=pa.array([3, 7], pa.int64()))
    frequency = pc.if_else(holes, pa.scalar(float("nan"), pa.float32()), table.column("frequency"))
    replace_networks_table(root / "holes", table.set_column(table.schema.get_field_index("frequency"), "frequency",
                                                            frequency))
    return root / "sines", root / "holes"


@pytest.fixture()
def nan_store(tiny_store, tmp_path):
    """A copy of the digits store with NaN written over one network's weights (all chunk files there)."""
    import zarr

    store = tmp_path / "nan-store"
    shutil.copytree(tiny_store, store)
    zarr.open_group(str(store / "arrays"), mode="r+")["W2"][5] = np.nan
    return store


@pytest.mark.parametrize("store, options, messages", [
    ("sines", ["--task", "classify"], ["--task classify", "'label' is missing for every network",
                                       "this store's targets: ['frequency']"]),
    ("digits", ["--task", "regress"], ["--task regress", "'frequency' is missing for every network",
                                       "this store's targets: ['label']"]),
    ("digits", ["--task", "regress", "--target", "psnr,nope"], ["unknown target 'nope'", "targets: ['label']"]),
    ("holes", ["--task", "regress"], ["'frequency' is missing (null or NaN) for 2 of networks 0..19", ": 3, 7 ",
                                      "targets: ['frequency']"]),
    ("holes", ["--task", "regress", "--workers", "2"], ["'frequency' is missing (null or NaN) for 2 of networks"]),
    ("sines", ["--task", "ssl", "--batch-size", "32"], ["--task ssl trains on full batches of --batch-size 32",
                                                         "the train split has 20 networks"]),
    ("digits", ["--blocks", "nope"], ["blocks must be one of"]),
    ("digits", ["--model", "mlp", "--blocks", "W2W"], ["--blocks shapes DWSNet layers and --model mlp has none",
                                                       "drop --blocks"]),
    ("digits", ["--model", "transformer", "--no-bn"], ["--no-bn shapes DWSNet layers",
                                                       "the baselines always use batch norm"]),
    ("digits", ["--address", "ray://head:10001"], ["--address ray://head:10001 joins a Ray cluster",
                                                   "--workers N with N > 1"]),
    ("nan", ["--model", "dwsnet"], ["is damaged", "holds NaN for 1 network(s) (networks 5;"]),
    ("nan", ["--model", "mlp-align", "--lr", "1e-3"], ["is damaged", "holds NaN for 1 network(s) (networks 5;"]),
], ids=["wrong-task", "missing-target", "unknown-target", "nan-target", "nan-target-ray", "ssl-batch-too-large",
        "bad-blocks", "baseline-with-blocks", "baseline-without-bn", "address-without-workers", "nan-weights",
        "nan-weights-mlp-align"])
def test_train_refuses_a_store_that_does_not_fit_before_writing_anything(tiny_store, sine_stores, nan_store,
                                                                         tmp_path, store, options, messages):
    """Issue 21: each refusal is one clear line, exit 2, and no (empty) run directory is left behind."""
    path = {"digits": tiny_store, "sines": sine_stores[0], "holes": sine_stores[1], "nan": nan_store}[store]
    run = tmp_path / "runs" / "run"
    result = CliRunner().invoke(main, ["train", str(path), "--out", str(run), "--epochs", "1", "--hidden-channels",
                                       "4", *options])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for message in messages:
        assert message in result.output
    assert not (tmp_path / "runs").exists()
    assert "0..60" not in result.output and "0..45" not in result.output


def test_train_offers_what_the_registries_build_with_the_options_defaults():
    """`zoo train` reads its choices and defaults from dws.tasks.options; the models and tasks named
    there are those dws.tasks.models and dws.tasks.objectives build."""
    from dws.baselines import BASELINES
    from dws.tasks import objectives, options

    assert options.MODELS == ("dwsnet", *BASELINES, *options.NFN_MODELS, *options.NG_MODELS, *options.SCALEGMN_MODELS)
    assert options.TASKS == tuple(objectives.TASKS)
    params = {p.name: p for p in main.commands["train"].params}
    assert set(params) == {"store"} | set(options.DEFAULTS) - {"progress", "pool"}
    for name, param in params.items():
        if name != "store":
            assert param.default == options.DEFAULTS[name], name
    assert tuple(params["model"].type.choices) == options.MODELS
    assert tuple(params["task"].type.choices) == options.TASKS
    from dws.nn.fast import BACKENDS

    assert options.BACKENDS == BACKENDS == tuple(params["backend"].type.choices)


def _assert_refused(args: list[str], message: str, not_created) -> None:
    """One clear line with ``message`` (no traceback), exit 2, and ``not_created`` left uncreated."""
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not not_created.exists()


def test_backend_with_a_baseline_is_refused(tiny_store, tmp_path):
    out = tmp_path / "run"
    _assert_refused(["train", str(tiny_store), "--model", "mlp", "--backend", "plain", "--out", str(out)],
                    "--backend", out)


def test_eval_of_a_folder_that_is_not_a_run_is_one_clear_line(tiny_store, tmp_path):
    """E.g. RUN and STORE swapped: the store folder has no checkpoint."""
    result = CliRunner().invoke(main, ["eval", str(tiny_store), str(tiny_store)])
    assert result.exit_code == 2, result.output
    assert "has no best.pt" in result.output and "Traceback" not in result.output


def test_summary_of_one_seed_shows_no_spread():
    from dws.tasks.protocol import format_summary

    assert format_summary({"mean": 0.5, "std": 0.0}, 1) == "0.5000 (one seed)"
    assert format_summary({"mean": 0.5, "std": 0.01}, 3) == "0.5000 ± 0.0100 (3 seeds)"


def test_interrupted_generate_says_what_is_kept_and_how_to_resume(tmp_path, monkeypatch):
    """Ctrl-C: exit 130 and one line with the finished chunks, instead of click's bare "Aborted!"."""
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    out = tmp_path / "store"
    args = ["generate", "mnist-inr", "--dataset", "digits", "--limit", "24", "--chunk-size", "8", "--steps", "3",
            "--out", str(out)]
    monkeypatch.setattr("zoo.generate.run.get_source", interrupt)  # before the store exists
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 130 and "no finished chunk" in result.output and "rerun the same command" in result.output
    monkeypatch.undo()
    monkeypatch.setattr("zoo.generate.run.consolidate_rows", interrupt)  # after every chunk was fitted
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 130 and "3 of 3 chunks" in result.output and "kept" in result.output
    monkeypatch.undo()
    result = CliRunner().invoke(main, args)  # the rerun finishes the store
    assert result.exit_code == 0 and "complete" in result.output, result.output


def test_train_warns_in_one_line_when_the_val_split_is_too_small_to_select_on(tiny_store, tmp_path):
    from dws.tasks.options import TrainOptions
    from dws.tasks.prepare import prepare_run
    from zoo.store import WeightStore

    val = WeightStore(tiny_store).manifest["splits"]["val"]["count"]
    assert val < 50
    for lr, chosen in ((None, "the learning rate and the best epoch are"), (1e-3, "the best epoch is")):
        logs = []
        prepare_run(TrainOptions(store=str(tiny_store), model="mlp", lr=lr, out=str(tmp_path / "run")),
                    log=logs.append)
        warnings = [line for line in logs if line.startswith("warning")]
        assert warnings == [f"warning: {chosen} chosen on {val} val networks; 50 or more give a choice worth "
                            f"making (zoo generate --limit train=N,val=N,test=N)"]
    assert not (tmp_path / "run").exists()


def test_pipeline_reports_give_no_spread_for_one_seed():
    from pipelines.common import fmt

    one = {"summary": {"accuracy": {"mean": 0.5, "std": 0.0}}, "seeds": [0]}
    three = {"summary": {"accuracy": {"mean": 0.5, "std": 0.01}}, "seeds": [0, 1, 2]}
    assert fmt(one, "accuracy", 100) == "50.00"
    assert fmt(three, "accuracy", 100) == "50.00 ± 1.00"


def test_pipeline_help_lists_every_scale_and_default():
    import subprocess
    import sys

    text = subprocess.run([sys.executable, "-m", "pipelines.inr_classification", "--help"], capture_output=True,
                          text=True, check=True).stdout
    text = " ".join(text.split())
    assert "xl: a paper-sized zoo" in text and "(default: ci)" in text and "(default: 2)" in text
    assert "(default: results/inr-classification)" in text
