"""``zoo info`` on unfinished stores and ``zoo show``'s requests it cannot or need not honour as made
(INR zoos here; classifier zoos in test_classifiers.py)."""

import json
import shutil
import struct

import pytest
from click.testing import CliRunner

from cli import main
from zoo.store.manifest import write_manifest


def png_size(path) -> tuple[int, int]:
    """(width, height) from a PNG's header."""
    data = path.read_bytes()
    assert data[:4] == b"\x89PNG"
    return struct.unpack(">II", data[16:24])


def unfinish(store, into, chunks_done):
    """A copy of a complete store as a generation leaves it when interrupted after ``chunks_done``."""
    shutil.copytree(store, into)
    manifest = json.loads((into / "manifest.json").read_text())
    manifest.update(status="in_progress", complete_chunks=chunks_done)
    for key in ("normalization", "completed"):
        manifest.pop(key, None)
    write_manifest(into, manifest)  # with its checksum, as the writer leaves it
    (into / "networks.parquet").unlink()
    return into


def test_info_on_an_unfinished_store_summarizes_its_progress(tiny_store, tmp_path):
    manifest = json.loads((tiny_store / "manifest.json").read_text())
    assert manifest["num_chunks"] == 4 and manifest["chunk_size"] == 16
    store = unfinish(tiny_store, tmp_path / "store", [0, 2])
    result = CliRunner().invoke(main, ["info", str(store)])
    assert result.exit_code == 0, result.output
    assert "in_progress" in result.output and "mnist-inr" in result.output
    assert "2 of 4 chunks written: 32 of 60 networks (53.3%)" in result.output
    train = manifest["splits"]["train"]["count"]
    assert f"train 32/{train}" in result.output  # chunks 0 and 2 hold train networks only
    assert "psnr (dB)  p5" in result.output and "2 chunks, 28 networks" in result.output
    assert "rerun the same `zoo generate` command" in result.output
    nothing = unfinish(tiny_store, tmp_path / "nothing", [])
    result = CliRunner().invoke(main, ["info", str(nothing)])
    assert result.exit_code == 0 and "0 of 4 chunks written" in result.output and "none" in result.output


def test_show_draws_many_networks_as_a_grid(tiny_store, tmp_path):
    out = tmp_path / "grid.png"
    result = CliRunner().invoke(main, ["show", str(tiny_store), "--out", str(out), "--count", "40"])
    assert result.exit_code == 0, result.output
    width, height = png_size(out)
    assert width <= 2000 and height > 1000, (width, height)  # 10 per row, 4 rows: not a 7,680-pixel strip
    assert "note" not in result.output


def test_show_says_when_it_draws_fewer_than_asked(tiny_store, tmp_path):
    out = tmp_path / "all.png"
    result = CliRunner().invoke(main, ["show", str(tiny_store), "--out", str(out), "--count", "100"])
    assert result.exit_code == 0, result.output
    assert "the store has 60 networks: drawing all of them, not 100" in result.output
    assert png_size(out)[1] > png_size(out)[0]  # 6 rows of 10


@pytest.mark.parametrize("options, message", [
    (["--count", "0"], "--count must be between 1 and 100"),
    (["--count", "500"], "--count must be between 1 and 100"),
    (["--out", "{tmp}/missing/grid.png"], "the folder {tmp}/missing does not exist"),
    (["--out", "{tmp}/grid.txt"], "give the file one of the extensions"),
])
def test_show_refuses_what_it_cannot_draw_before_writing(tiny_store, tmp_path, options, message):
    options = [o.replace("{tmp}", str(tmp_path)) for o in options]
    result = CliRunner().invoke(main, ["show", str(tiny_store), "--out", str(tmp_path / "grid.png"), *options])
    assert result.exit_code == 2, result.output
    assert message.replace("{tmp}", str(tmp_path)) in result.output and "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == []  # no image, no folder


def test_version():
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and result.output.startswith("zoo (weightzoo) ")
    assert result.output.split()[-1][0].isdigit()
