"""Stores on object storage: ``zoo generate --out s3://...`` against a real S3-compatible server
(moto's server mode on 127.0.0.1, see conftest's ``s3_server``), end to end: the store equals a
local one bit for bit, every reader takes the URL, a killed run resumes, damage is named and a
rerun repairs it, classifier zoos too."""

import shlex
import sys

import fsspec
import pytest
import torch
from click.testing import CliRunner

import cli
from dws.stream import WeightStoreLoader
from generate_helpers import TINY, assert_identical_stores, kill_after_chunks
from zoo.generate.run import GenerateOptions, generate
from zoo.store import DamagedStoreError, WeightStore, verify_store

QUIET = dict(log=lambda *_: None)


@pytest.fixture(scope="module")
def s3_store(s3_server):
    """``tiny_store`` generated straight into a bucket (in this process, no Ray)."""
    import uuid

    import boto3

    bucket = f"zoo-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    url = f"s3://{bucket}/zoos/digits"
    generate(GenerateOptions(out=url, **TINY), **QUIET)
    return url


def _s3():
    fs = fsspec.filesystem("s3")
    fs.invalidate_cache()
    return fs


def test_a_store_generated_on_s3_equals_the_local_one(tiny_store, s3_store):
    assert_identical_stores(tiny_store, s3_store)
    keys = {p.split("/zoos/digits/", 1)[1] for p in _s3().find(s3_store)}
    assert {"manifest.json", "networks.parquet", "arrays/zarr.json", "arrays/W2/c/1/0/0",
            "fragments/chunk-000003.parquet", "arrays/stats/W2_mean/c/0/0"} <= keys
    assert not [k for k in keys if k.endswith(".tmp")]
    assert verify_store(s3_store).ok


def test_every_reader_takes_the_s3_url(tiny_store, s3_store, tmp_path):
    runner = CliRunner()
    for command in (["info", s3_store], ["verify", s3_store], ["show", s3_store, "--out", str(tmp_path / "g.png")],
                    ["compare", s3_store, str(tiny_store)], ["checksums", s3_store]):
        result = runner.invoke(cli.main, command)
        assert result.exit_code == 0, result.output
    assert "identical" in runner.invoke(cli.main, ["compare", str(tiny_store), s3_store]).output
    assert (tmp_path / "g.png").stat().st_size > 0
    kw = dict(batch_size=7, target="label", seed=3, in_memory=False, buffer_chunks=2)
    for a, b in zip(WeightStoreLoader(tiny_store, "train", **kw), WeightStoreLoader(s3_store, "train", **kw),
                    strict=True):
        assert torch.equal(a.index, b.index)
        assert all(torch.equal(x, y) for x, y in zip(a.ws.weights + a.ws.biases, b.ws.weights + b.ws.biases))
    run = tmp_path / "run"
    result = runner.invoke(cli.main, ["train", s3_store, "--out", str(run), "--epochs", "1", "--lr", "1e-3",
                                      "--hidden-channels", "4", "--batch-size", "16"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(cli.main, ["eval", str(run), s3_store])
    assert result.exit_code == 0 and '"accuracy"' in result.output, result.output


def test_an_interrupted_run_on_s3_resumes_to_the_same_store(tiny_store, s3_bucket, monkeypatch):
    """Interrupted after chunk 2's arrays and fragment were stored but before the manifest listed
    it (where a kill hurts most): the rerun makes chunks 2 and 3 again."""
    import zoo.generate.run as run

    url, listed = f"{s3_bucket}/interrupted", []
    real = run.mark_chunks_complete

    def interrupt_at_the_third(root, manifest, fragments):
        if len(listed) == 2:
            raise KeyboardInterrupt
        listed.append(fragments)
        return real(root, manifest, fragments)

    monkeypatch.setattr(run, "mark_chunks_complete", interrupt_at_the_third)
    with pytest.raises(KeyboardInterrupt):
        generate(GenerateOptions(out=url, **TINY), **QUIET)
    monkeypatch.undo()
    assert _s3().exists(f"{url}/fragments/chunk-000002.parquet")  # stored, not listed
    logs = []
    generate(GenerateOptions(out=url, **TINY), log=logs.append)
    assert any("resuming" in line and "2 of 4 chunks left" in line for line in logs)
    assert_identical_stores(tiny_store, url)


@pytest.mark.slow
def test_a_killed_run_on_s3_resumes_to_the_same_store(tiny_store, s3_bucket):
    url = f"{s3_bucket}/killed"
    cmd = [sys.executable, "-m", "cli", "generate", "mnist-inr", "--out", url, "--dataset", "digits",
           "--limit", "60", "--chunk-size", "16", "--steps", "60", "--lr", "1e-3"]
    state = kill_after_chunks(cmd, url, chunks=1)
    assert state["status"] == "in_progress" and len(state["complete_chunks"]) == 1
    logs = []
    generate(GenerateOptions(out=url, **TINY), log=logs.append)
    assert any("resuming" in line for line in logs)
    assert_identical_stores(tiny_store, url)


def test_damage_on_s3_is_named_and_the_printed_command_repairs_it(tiny_store, s3_bucket):
    url = f"{s3_bucket}/damaged"
    fs = _s3()
    fs.put(str(tiny_store), url.split("://")[1], recursive=True)
    path = url.split("://")[1]
    chunk = bytearray(fs.cat_file(f"{path}/arrays/W2/c/1/0/0"))
    chunk[1000] ^= 0x10  # one flipped bit; the size stays
    fs.pipe_file(f"{path}/arrays/W2/c/1/0/0", bytes(chunk))
    fs.rm(f"{path}/fragments/chunk-000002.parquet")
    table = bytearray(fs.cat_file(f"{path}/networks.parquet"))
    table[len(table) // 2] ^= 0x01
    fs.pipe_file(f"{path}/networks.parquet", bytes(table))

    store = WeightStore(url)  # every file is there at its size
    with pytest.raises(DamagedStoreError, match=r"array W2, chunk 1 \(networks 16..31, file arrays/W2/c/1/0/0\) "
                                                r"fails its crc32c checksum"):
        store.read(0, 60)
    with pytest.raises(DamagedStoreError, match="networks.parquet fails its crc32c checksum"):
        store.networks
    result = CliRunner().invoke(cli.main, ["verify", url])
    assert result.exit_code == 1
    out = result.output
    assert "chunk 1 (networks 16..31): arrays/W2/c/1/0/0 fails its crc32c checksum" in out
    assert "chunk 2 (networks 32..47): fragments/chunk-000002.parquet is missing" in out
    assert "networks.parquet fails its crc32c checksum" in out and "DAMAGED: 3 problem(s)" in out
    command = out.rsplit("\n  ", 1)[1].strip()
    assert command.startswith("zoo generate mnist-inr --out " + url)
    result = CliRunner().invoke(cli.main, shlex.split(command)[1:])  # the repair it names
    assert result.exit_code == 0, result.output
    assert "refitting 2 chunk(s)" in result.output
    assert_identical_stores(tiny_store, url)


def test_a_classifier_zoo_on_s3_equals_the_local_one(tmp_path, s3_bucket):
    from clf_helpers import write_cifar_like

    data = write_cifar_like(tmp_path / "cifar-like", per_batch=30, n_test=60)
    opts = dict(kind="cifar10-classifiers", data_root=str(data), source_options={"verify": False}, limit=6,
                batch_size=16, steps=4, chunk_size=2, progress=False)
    generate(GenerateOptions(out=str(tmp_path / "local"), **opts), **QUIET)
    generate(GenerateOptions(out=f"{s3_bucket}/pairs", **opts), **QUIET)
    assert_identical_stores(tmp_path / "local", f"{s3_bucket}/pairs")
