"""Dataset cards (``README.md`` in every complete store, ``zoo card``) and content IDs (``zoo verify``)."""

import re
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

import cli
from clf_helpers import write_mnist_like
from generate_helpers import TINY
from zoo.store.card import CARD, card_text
from zoo.generate.run import GenerateOptions, generate
from zoo.store import verify_store
from zoo.store.identity import KEY, content_id
from zoo.store.manifest import read_manifest, write_manifest

V1_STORE = Path(__file__).parent / "data" / "store-v1"
QUIET = dict(log=lambda *_: None)


def _python_blocks(card: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", card, re.S)


def test_card_is_written_with_the_store(tiny_store):
    card = (tiny_store / CARD).read_text()
    manifest = read_manifest(tiny_store)
    assert card == card_text(tiny_store)  # written from the finished store
    assert shlex.join(manifest["command"]) in card
    for package in ("weightzoo", "torch", "numpy", "zarr", "pyarrow"):
        assert f"{package} {manifest['software'][package]}" in card
    assert "2 -> 32 -> 32 -> 1" in card and "| 1 | 32 x 2 | sine | 30.0 |" in card
    assert "output offset 0.0" in card and '"init_ranges"' in card
    for split, info in manifest["splits"].items():
        assert re.search(rf"\| {split} \| {info['count']} \({info['start']}\.\.\d+\) \| p5 \d", card), split
    assert "PSNR (dB)" in card and "| `digits` |" in card and "BSD-3-Clause" in card
    assert manifest[KEY].startswith("sha256:") and card.count(manifest[KEY]) >= 2
    assert str(tiny_store.parent) not in card.replace(shlex.join(manifest["command"]), "")  # no absolute path
    assert "DWSNets" in card


def test_card_load_snippets_run(tiny_store, monkeypatch):
    plain, project = _python_blocks((tiny_store / CARD).read_text())
    assert len(plain.strip().splitlines()) <= 5 and len(project.strip().splitlines()) <= 5
    monkeypatch.chdir(tiny_store.parent)  # the snippets name the store's folder, relative
    scope = {}
    exec(plain, scope)  # noqa: S102 - the card's own snippet
    assert scope["W1"].shape == (8, 32, 2) and len(scope["rows"]) == 60
    reference = zarr.open_group(str(tiny_store / "arrays"), mode="r")["W1"][:8]
    np.testing.assert_array_equal(scope["W1"], reference)
    scope = {}
    exec(project, scope)  # noqa: S102
    np.testing.assert_array_equal(scope["params"]["W1"], reference)


def test_zoo_card_prints_it(tiny_store):
    result = CliRunner().invoke(cli.main, ["card", str(tiny_store)])
    assert result.exit_code == 0, result.output
    assert result.output == (tiny_store / CARD).read_text()


def test_old_store_gets_a_card_on_the_fly_and_verifies_without_an_id():
    assert not (V1_STORE / CARD).exists()
    result = CliRunner().invoke(cli.main, ["card", str(V1_STORE)])
    assert result.exit_code == 0, result.output
    assert "not stored" in result.output  # the note (stderr, mixed in by the runner)
    assert "# Weight zoo `store-v1`: mnist-inr" in result.output and "| train | 4 (0..3) | p5" in result.output
    assert "command was not recorded" in result.output and "content ID: none recorded" in result.output
    found = verify_store(V1_STORE)
    assert found.ok and ("identity", "no content ID recorded (made before content IDs, 2026-11-27, or "
                                     "format v1)") in found.checked
    assert not (V1_STORE / CARD).exists()  # printing never writes into the store


def test_same_zoo_same_id_anywhere_and_one_network_changes_it(tiny_store, tmp_path):
    other = tmp_path / "elsewhere" / "zoo"
    manifest = generate(GenerateOptions(**{**TINY, "out": str(other)}), **QUIET)
    assert manifest[KEY] == read_manifest(tiny_store)[KEY] == content_id(tiny_store, read_manifest(tiny_store))
    changed = tmp_path / "changed"
    shutil.copytree(tiny_store, changed)
    w1 = zarr.open_group(str(changed / "arrays"), mode="r+")["W1"]
    w1[5] = w1[5] + np.float32(1e-3)  # one network, written through zarr (its chunk's crc32c follows)
    assert content_id(changed, read_manifest(changed)) != manifest[KEY]


def test_verify_checks_the_id(tiny_store, tmp_path):
    store = tmp_path / "copy"
    shutil.copytree(tiny_store, store)
    found = verify_store(store)
    assert found.ok and any(part == "identity" and "ok" in what for part, what in found.checked)
    manifest = read_manifest(store)
    manifest[KEY] = "sha256:" + "0" * 64
    write_manifest(store, manifest)  # a consistent manifest (its own checksum holds) naming another zoo
    result = CliRunner().invoke(cli.main, ["verify", str(store)])
    assert result.exit_code == 1
    assert "DAMAGED" in result.output and "content ID sha256:000" in result.output
    assert "does not match" in result.output and "repair: " in result.output and "from a copy" in result.output


def test_classifier_store_card(tmp_path):
    data = write_mnist_like(tmp_path / "mnist-like", n_train=200, n_test=100)
    out = tmp_path / "clf"
    generate(GenerateOptions(kind="mnist-classifiers", out=str(out), data_root=str(data),
                             source_options={"verify": False}, limit=4, batch_size=32, steps=4, chunk_size=4,
                             progress=False), **QUIET)
    card = (out / CARD).read_text()
    assert "test accuracy" in card and "| test |" in card and "mlp-classifier" in card
    assert "CC BY-SA 3.0" in card and "DWSNets" not in card
    assert read_manifest(out)[KEY] in card and verify_store(out).ok


def test_derived_store_gets_its_own_id_and_card(tiny_store, tmp_path):
    from zoo.store import WeightStore
    from zoo.store.derive import write_store

    source = WeightStore(tiny_store)
    metadata = {k: v for k, v in source.manifest.items() if k in ("kind", "description", "architecture", "targets",
                                                                  "generation", "source", KEY)}
    params = {k: -v for k, v in source.read(0, source.num_networks).items()}  # other networks
    out = write_store(tmp_path / "negated", widths=source.widths, params=params, rows=source.networks,
                      splits=source.manifest["splits"], metadata=metadata, chunk_size=source.chunk_size)
    manifest = read_manifest(out)
    assert manifest[KEY] != source.manifest[KEY] and manifest[KEY] == content_id(out, manifest)
    assert manifest["software"]["zarr"] == zarr.__version__
    assert manifest[KEY] in (out / CARD).read_text() and verify_store(out).ok


def test_rerun_on_a_complete_store_writes_a_missing_card(tiny_store, tmp_path):
    store = tmp_path / "copy"
    shutil.copytree(tiny_store, store)
    (store / CARD).unlink()  # a finish interrupted between the manifest and the card
    logs = []
    generate(GenerateOptions(**{**TINY, "out": str(store)}), log=logs.append)
    assert "already complete" in logs[-1] and (store / CARD).read_text() == card_text(store)
