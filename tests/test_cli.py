"""The `zoo` command: info, show and the one-line errors for bad input."""

from click.testing import CliRunner

from cli import main


def test_info_and_show(tiny_store, tmp_path):
    runner = CliRunner()
    info = runner.invoke(main, ["info", str(tiny_store)])
    assert info.exit_code == 0, info.output
    assert "train" in info.output and "psnr (dB)" in info.output and "2 -> 32 -> 32 -> 1" in info.output
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
