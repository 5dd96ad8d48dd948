"""The `zoo` command: info, show and the one-line errors for bad input."""

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
])
def test_train_refuses_bad_values_before_creating_a_run(tiny_store, tmp_path, options, message):
    run = tmp_path / "run"
    _assert_refused(["train", str(tiny_store), "--out", str(run), *options], message, run)


def _assert_refused(args: list[str], message: str, not_created) -> None:
    """One clear line with ``message`` (no traceback), exit 2, and ``not_created`` left uncreated."""
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not not_created.exists()


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
