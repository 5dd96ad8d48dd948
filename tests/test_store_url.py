"""Stores read from fsspec URLs: the same networks, rows, statistics and batches as from the folder."""

import json
import uuid

import fsspec
import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner

import cli
from dws.stream import WeightStoreLoader
from zoo.generate.run import GenerateOptions, generate
from zoo.store import StoreError, StoreVersionError, WeightStore


@pytest.fixture()
def memory_copy(tiny_store):
    """``tiny_store`` uploaded to fsspec's in-memory file system; yields its URL."""
    fs = fsspec.filesystem("memory")
    name = f"/zoo-{uuid.uuid4().hex}"
    fs.put(str(tiny_store), name, recursive=True)
    yield f"memory://{name}"
    fs.rm(name, recursive=True)


def _same_store(a: WeightStore, b: WeightStore) -> None:
    assert a.manifest == b.manifest
    assert a.networks.schema == b.networks.schema
    pd.testing.assert_frame_equal(a.networks.to_pandas(), b.networks.to_pandas())  # NaN targets equal too
    for name in a.parameter_names:
        np.testing.assert_array_equal(a.read(0, a.num_networks)[name], b.read(0, b.num_networks)[name])
    for name, (mean, std) in a.stats().items():
        np.testing.assert_array_equal(mean, b.stats()[name][0])
        np.testing.assert_array_equal(std, b.stats()[name][1])


def test_a_store_reads_the_same_from_a_url(tiny_store, memory_copy):
    local, remote = WeightStore(tiny_store), WeightStore(memory_copy)
    _same_store(local, remote)
    _same_store(local, WeightStore(tiny_store.as_uri()))  # file:// goes through fsspec too
    assert str(remote.root) == memory_copy and remote.root.name == memory_copy.rsplit("/", 1)[-1]
    assert remote.size_on_disk() == local.size_on_disk()


def test_a_loader_streams_the_same_batches_from_a_url(tiny_store, memory_copy):
    kw = dict(batch_size=7, target="label", seed=3, in_memory=False, buffer_chunks=2)
    for a, b in zip(WeightStoreLoader(tiny_store, "train", **kw), WeightStoreLoader(memory_copy, "train", **kw),
                    strict=True):
        assert torch.equal(a.index, b.index) and torch.equal(a.target, b.target)
        for x, y in zip(a.ws.weights + a.ws.biases, b.ws.weights + b.ws.biases):
            assert torch.equal(x, y)


def test_url_stores_get_the_same_checks(memory_copy):
    fs, path = fsspec.core.url_to_fs(memory_copy)
    manifest = json.loads(fs.cat_file(f"{path}/manifest.json"))
    fs.pipe_file(f"{path}/manifest.json", json.dumps({**manifest, "format_version": 99}).encode())
    with pytest.raises(StoreVersionError, match="v99"):
        WeightStore(memory_copy)
    fs.rm(f"{path}/manifest.json")
    with pytest.raises(StoreError, match="not a weight store"):
        WeightStore(memory_copy)
    with pytest.raises(StoreError, match="cannot open"):
        WeightStore("nosuchprotocol://bucket/zoo")


def test_cli_reads_and_writes_urls(memory_copy):
    runner = CliRunner()
    result = runner.invoke(cli.main, ["info", memory_copy])
    assert result.exit_code == 0, result.output
    assert memory_copy in result.output and "complete" in result.output
    url = f"memory://zoo-{uuid.uuid4().hex}"
    result = runner.invoke(cli.main, ["generate", "sine-regression", "--out", url, "--limit", "4", "--steps", "2"])
    assert result.exit_code == 0, result.output
    assert WeightStore(url).num_networks == 4
    fsspec.filesystem("memory").rm(url.split("://")[1], recursive=True)


def test_a_memory_url_is_refused_where_ray_workers_would_write_it():
    """memory:// lives in one process: Ray's workers would write into their own."""
    with pytest.raises(StoreError, match="Ray's workers cannot write"):
        generate(GenerateOptions(kind="sine-regression", out="memory://zoo", limit=4, workers=2, progress=False))


def test_a_file_url_store_equals_the_folder_store(tmp_path):
    """``file://`` is written through fsspec (chunk tasks write it themselves): the same files."""
    from generate_helpers import assert_identical_stores

    opts = dict(kind="sine-regression", limit=6, chunk_size=4, steps=2, progress=False)
    generate(GenerateOptions(out=str(tmp_path / "folder"), **opts), log=lambda *_: None)
    generate(GenerateOptions(out=(tmp_path / "url").as_uri(), **opts), log=lambda *_: None)
    assert_identical_stores(tmp_path / "folder", (tmp_path / "url").as_uri())
    assert not [p for p in (tmp_path / "url").rglob("*") if ".tmp" in p.name]
