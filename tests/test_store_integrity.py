"""Damaged stores (chunk files deleted, truncated or with flipped bits, table gone or changed,
manifest changed) are refused by name, never read as NaN; the manifest is as readable as every
other file."""

import os
import shutil
import stat
import uuid

import fsspec
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import zarr
from click.testing import CliRunner

import cli
from zoo.store import DamagedStoreError, StoreError, WeightStore, rebuild_networks_table
from zoo.store.manifest import read_manifest, write_manifest

CHUNK = "arrays/W2/c/1/0/0"  # networks 16..31 of W2 (tiny_store: 60 networks in chunks of 16)
CHUNK_BYTES = 16 * 32 * 32 * 4 + 4  # values + crc32c


@pytest.fixture()
def store(tiny_store, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(tiny_store, dst)
    return dst


@pytest.fixture()
def memory_store(tiny_store):
    fs = fsspec.filesystem("memory")
    name = f"/zoo-{uuid.uuid4().hex}"
    fs.put(str(tiny_store), name, recursive=True)
    yield fs, name, f"memory://{name}"
    fs.rm(name, recursive=True)


def _says_damaged(message: str, root) -> None:
    assert str(root) in message and "damaged" in message
    assert "rerun the `zoo generate` command that made it" in message and "from a copy" in message


# --------------------------------------------------------------------------- missing chunk
def test_missing_chunk_is_refused_when_opening(store):
    (store / CHUNK).unlink()
    with pytest.raises(DamagedStoreError) as err:
        WeightStore(store)
    msg = str(err.value)
    _says_damaged(msg, store)
    assert f"chunk 1: file {CHUNK} missing (networks 16..31)" in msg and "NaN" in msg


def test_missing_chunk_is_refused_by_zoo_info(store):
    (store / CHUNK).unlink()
    result = CliRunner().invoke(cli.main, ["info", str(store)])
    assert result.exit_code == 2
    assert "damaged" in result.output and CHUNK in result.output and "complete)" not in result.output


def test_missing_chunk_is_refused_when_opening_a_url(memory_store):
    fs, path, url = memory_store
    fs.rm(f"{path}/{CHUNK}")
    with pytest.raises(DamagedStoreError, match=f"chunk 1: file {CHUNK} missing \\(networks 16..31\\)"):
        WeightStore(url)


def test_missing_chunk_is_refused_when_reading(store):
    opened = WeightStore(store)  # intact when opened
    (store / CHUNK).unlink()
    (store / "arrays/W2/c/3/0/0").unlink()
    assert np.isfinite(opened.read(0, 16)["W2"]).all()  # chunk 0 is fine
    with pytest.raises(DamagedStoreError) as err:
        opened.read(0, 60)
    msg = str(err.value)
    _says_damaged(msg, store)
    assert "array W2 holds NaN for 28 network(s) (networks 16..31, 48..59" in msg
    assert "arrays/W2/c/1/0/0, arrays/W2/c/3/0/0" in msg
    with pytest.raises(DamagedStoreError, match="networks 20..21"):
        opened.read(20, 22)


def test_read_refuses_nan_where_the_url_cannot_be_listed(memory_store, monkeypatch):
    """Plain HTTP servers often cannot list folders: the open check is skipped, reads still refuse."""
    fs, path, url = memory_store
    fs.rm(f"{path}/{CHUNK}")

    def unlistable(self, *args, **kwargs):
        raise NotImplementedError("no listing")

    monkeypatch.setattr(type(fs), "find", unlistable)
    opened = WeightStore(url)
    assert np.isfinite(opened.read(0, 16)["W2"]).all()
    with pytest.raises(DamagedStoreError, match="W2 holds NaN for 16 network\\(s\\) \\(networks 16..31"):
        opened.read(0, 60)


def test_nan_written_into_a_chunk_is_refused_when_reading(store):
    """A chunk overwritten with NaN by another tool (not through the writer, which refuses NaN)."""
    zarr.open_group(str(store / "arrays"), mode="r+")["b3"][40] = np.nan
    opened = WeightStore(store)  # every file is there, at its size
    with pytest.raises(DamagedStoreError, match="array b3 holds NaN for 1 network\\(s\\) \\(networks 40;"):
        opened.read(32, 48)


# ------------------------------------------------------------------------- truncated chunk
def test_truncated_chunk_is_refused_when_opening(store, memory_store):
    os.truncate(store / CHUNK, 100)
    with pytest.raises(DamagedStoreError) as err:
        WeightStore(store)
    _says_damaged(str(err.value), store)
    assert f"chunk 1: file {CHUNK} 100 bytes instead of {CHUNK_BYTES} (networks 16..31)" in str(err.value)
    fs, path, url = memory_store
    fs.pipe_file(f"{path}/{CHUNK}", fs.cat_file(f"{path}/{CHUNK}")[:100])
    with pytest.raises(DamagedStoreError, match=f"100 bytes instead of {CHUNK_BYTES}"):
        WeightStore(url)


def test_truncated_chunk_is_refused_when_reading(store):
    opened = WeightStore(store)
    os.truncate(store / CHUNK, 100)
    for start, stop in [(0, 60), (20, 22)]:
        with pytest.raises(DamagedStoreError) as err:
            opened.read(start, stop)
        msg = str(err.value)
        _says_damaged(msg, store)
        assert f"array W2, chunk 1 (networks 16..31, file {CHUNK}) fails its crc32c checksum" in msg
        assert "truncated" in msg
        assert isinstance(err.value.__cause__, ValueError)  # zarr's own error stays chained
    assert opened.read(0, 16)["W2"].shape == (16, 32, 32)
    with pytest.raises(TypeError):  # a bad argument is not reported as damage
        opened.read(0, 1.5)


# --------------------------------------------------------------------------- statistics
def test_missing_statistics_chunk_is_refused(store):
    (store / "arrays/stats/W1_mean/c/0/0").unlink()  # would read back as 0, a plausible mean
    with pytest.raises(DamagedStoreError, match="arrays/stats/W1_mean/c/0/0 is missing"):
        WeightStore(store).stats()


# ---------------------------------------------------------------------------- manifest mode
@pytest.mark.parametrize("umask", [0o022, 0o027], ids=["umask022", "umask027"])
def test_manifest_mode_follows_the_umask(store, umask):
    old = os.umask(umask)
    try:
        write_manifest(store, read_manifest(store))
        (store / "probe").write_text("")  # how any other file is created
    finally:
        os.umask(old)
    mode = stat.S_IMODE((store / "manifest.json").stat().st_mode)
    assert mode == 0o666 & ~umask == stat.S_IMODE((store / "probe").stat().st_mode)
    assert not [p for p in store.iterdir() if p.name.endswith(".tmp")]  # no temporary left


def test_generated_manifest_is_as_readable_as_the_arrays(tiny_store):
    mode = stat.S_IMODE((tiny_store / "manifest.json").stat().st_mode)
    assert mode == stat.S_IMODE((tiny_store / "arrays/zarr.json").stat().st_mode)


# -------------------------------------------------------------------------- networks table
def test_missing_table_says_how_to_rebuild_it_from_fragments(store):
    before = pq.read_table(store / "networks.parquet")
    (store / "networks.parquet").unlink()
    with pytest.raises(DamagedStoreError) as err:
        WeightStore(store).networks
    msg = str(err.value)
    assert "networks.parquet is missing" in msg and "fragments/" in msg
    assert f"rebuild_networks_table('{store}')" in msg and f"zoo verify {store}" in msg
    rebuild_networks_table(store)  # what the message says to run (or rerun generate: test_store_verify.py)
    pd.testing.assert_frame_equal(pq.read_table(store / "networks.parquet").to_pandas(), before.to_pandas())
    assert WeightStore(store).networks.schema == before.schema


def test_missing_table_without_fragments_says_to_regenerate(store):
    (store / "networks.parquet").unlink()
    (store / "fragments/chunk-000002.parquet").unlink()
    with pytest.raises(DamagedStoreError) as err:
        WeightStore(store).networks
    msg = str(err.value)
    assert "fragments/ are gone too" in msg and "rebuild_networks_table" not in msg
    _says_damaged(msg, store)
    with pytest.raises(DamagedStoreError, match="1 of 4 fragments are missing .*\\[2\\]"):
        rebuild_networks_table(store)


def test_rebuild_refuses_an_incomplete_store(store):
    m = read_manifest(store)
    m["status"] = "in_progress"
    write_manifest(store, m)
    with pytest.raises(StoreError, match="not complete"):
        rebuild_networks_table(store)


def test_rebuild_works_on_a_url(tiny_store, memory_store):
    fs, path, url = memory_store
    fs.rm(f"{path}/networks.parquet")
    with pytest.raises(DamagedStoreError, match="networks.parquet is missing"):
        WeightStore(url).networks
    rebuild_networks_table(url)
    assert WeightStore(url).networks.to_pandas().equals(WeightStore(tiny_store).networks.to_pandas())


# --------------------------------------------------------------------------- repair
def test_rerunning_generate_refits_exactly_the_damaged_chunks(tiny_store, store):
    """A deleted chunk file and a truncated one (the last, partial chunk: a partial write would
    read it back) are refitted by rerunning the store's command; the result equals the undamaged
    store: arrays bit for bit, rows, statistics."""
    from zoo.generate.run import GenerateOptions, generate

    (store / CHUNK).unlink()
    os.truncate(store / "arrays/b1/c/3/0", 10)
    logs = []
    generate(GenerateOptions(kind="mnist-inr", out=str(store), dataset="digits", limit=60, chunk_size=16,
                             steps=60, lr=1e-3, progress=False), log=logs.append)
    assert any(f"chunk 1 (networks 16..31): {CHUNK} is missing" in line and "refitting 2 chunk(s)" in line
               for line in logs), logs
    assert any("2 of 4 chunks left" in line for line in logs)
    fixed, original = WeightStore(store), WeightStore(tiny_store)
    for name, values in original.read(0, original.num_networks).items():
        assert np.array_equal(fixed.read(0, fixed.num_networks)[name], values), name
    assert fixed.networks.to_pandas().equals(original.networks.to_pandas())  # (pandas: NaN equals NaN)
    for name, (mean, std) in original.stats().items():  # bit for bit: the reduction runs in chunk order
        assert np.array_equal(fixed.stats()[name][0], mean) and np.array_equal(fixed.stats()[name][1], std)
