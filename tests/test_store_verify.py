"""Format v2 integrity: checksums everywhere, ``zoo verify``, repair by rerunning the generating
command, version 1 stores, plain zarr without warnings, statistics reduced in a fixed order, and
chunk jobs that never name a path of the driver's machine."""

import json
import random
import shlex
import shutil
import warnings
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

import cli
from generate_helpers import TINY, assert_identical_stores
from zoo.generate.command import NOT_FLAGS, command_line
from zoo.generate.executors import LocalExecutor
from zoo.generate.run import GenerateOptions, generate
from zoo.store import DamagedStoreError, WeightStore, verify_store
from zoo.store.manifest import read_manifest, write_manifest

V1_STORE = Path(__file__).parent / "data" / "store-v1"
V1_SETTINGS = dict(kind="mnist-inr", dataset="digits", limit=6, chunk_size=4, steps=5, lr=1e-3, progress=False)
QUIET = dict(log=lambda *_: None)


@pytest.fixture()
def store(tiny_store, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(tiny_store, dst)
    return dst


def _flip(path: Path, offset: int, bit: int = 0x10) -> None:
    """Flip one bit of a file; its size stays."""
    data = bytearray(path.read_bytes())
    data[offset] ^= bit
    path.write_bytes(bytes(data))


def _verify(root) -> tuple[int, str]:
    result = CliRunner().invoke(cli.main, ["verify", str(root)])
    return result.exit_code, result.output


# ------------------------------------------------------------------------------ verify
def test_verify_passes_an_intact_store(tiny_store):
    code, out = _verify(tiny_store)
    assert code == 0, out
    assert "weightzoo-store v2, complete, 60 networks in 4 chunks" in out
    assert "4 of 4 ok: 24 chunk files" in out and "crc32c" in out and "4 fragments ok" in out
    assert "20 of 20 zarr.json files ok" in out and "equal to the fragments" in out
    train = WeightStore(tiny_store).manifest["splits"]["train"]["count"]
    assert f"recomputed over {train} train networks: largest difference 0 std" in out  # bit for bit
    assert "OK: no damage found" in out


def test_a_flipped_bit_is_refused_on_reading_naming_the_chunk_and_its_networks(store):
    _flip(store / "arrays/b2/c/2/0", 37)
    opened = WeightStore(store)  # every file is there, at its size
    assert np.isfinite(opened.read(0, 32)["b2"]).all()  # the other chunks read
    with pytest.raises(DamagedStoreError, match=r"array b2, chunk 2 \(networks 32..47, file arrays/b2/c/2/0\) "
                                                r"fails its crc32c checksum"):
        opened.read(0, 60)


def test_verify_finds_each_damage_and_rerunning_the_printed_command_repairs_all(tiny_store, store, monkeypatch):
    _flip(store / "arrays/W2/c/1/0/0", 4000)  # a bit flip in chunk 1
    zarr.open_group(str(store / "arrays"), mode="r+")["W1"][50] = np.nan  # written by another tool: valid checksum
    _flip(store / "fragments/chunk-000000.parquet", 100)
    (store / "networks.parquet").unlink()
    _flip(store / "arrays/stats/b1_std/c/0", 3)
    code, out = _verify(store)
    assert code == 1
    for line in ["chunk 1 (networks 16..31): arrays/W2/c/1/0/0 fails its crc32c checksum",
                 "chunk 3 (networks 48..59): arrays/W1/c/3/0/0 holds NaN",
                 "chunk 0 (networks 0..15): fragments/chunk-000000.parquet fails its crc32c checksum",
                 "networks.parquet is missing", "stats/b1_std cannot be decoded", "DAMAGED: 5 problem(s)"]:
        assert line in out, out
    command = out.rsplit("\n  ", 1)[1].strip()
    assert command == shlex.join(["zoo", "generate", "mnist-inr", "--out", str(store), "--dataset", "digits",
                                  "--limit", "60", "--chunk-size", "16", "--steps", "60", "--lr", "0.001"])
    result = CliRunner().invoke(cli.main, shlex.split(command)[1:])
    assert result.exit_code == 0, result.output
    assert "refitting 3 chunk(s), then rewriting the table and the statistics" in result.output
    assert_identical_stores(tiny_store, store)
    assert verify_store(store).ok


def test_statistics_that_disagree_with_the_networks_are_found_and_rewritten(tiny_store, store):
    zarr.open_group(str(store / "arrays"), mode="r+")["stats/W3_mean"][0, 3] += 0.01  # a valid chunk, wrong value
    found = verify_store(store)
    assert [p.part for p in found.problems] == ["statistics"]
    assert "W3_mean differs from the one recomputed from the train networks in 1 entries" in found.summary()
    logs = []
    generate(GenerateOptions(out=str(store), **TINY), log=logs.append)
    assert any("refitting 0 chunk(s), then rewriting the table and the statistics" in line for line in logs)
    assert_identical_stores(tiny_store, store)


def test_a_changed_manifest_or_zarr_metadata_is_named_and_not_rewritten_in_place(store):
    meta = store / "arrays/W1/zarr.json"
    meta.write_text(meta.read_text().replace('"dim0"', '"dimX"'))  # still valid, just changed
    found = verify_store(store)
    assert [p.part for p in found.problems] == ["metadata"] and not found.repairable
    assert "arrays/W1/zarr.json is changed" in found.summary() and "restore metadata files from a copy" in found.summary()
    with pytest.raises(DamagedStoreError, match="arrays/W1/zarr.json is changed"):
        generate(GenerateOptions(out=str(store), **TINY), **QUIET)
    text = (store / "manifest.json").read_text()
    (store / "manifest.json").write_text(text.replace('"num_networks": 60', '"num_networks": 61'))
    with pytest.raises(DamagedStoreError, match="manifest.json fails its crc32c checksum"):
        WeightStore(store)
    code, out = _verify(store)
    assert code == 1 and "manifest.json fails its crc32c checksum" in out and "restore manifest files" in out


def test_a_resume_remakes_finished_chunks_that_were_damaged_since(tiny_store, store):
    m = read_manifest(store)
    m["status"], m["complete_chunks"] = "in_progress", [0, 1, 2]  # interrupted before chunk 3 was listed
    write_manifest(store, m)
    (store / "networks.parquet").unlink()
    _flip(store / "arrays/b3/c/1/0", 2)
    found = verify_store(store)
    assert {p.part for p in found.problems} == {"chunk", "incomplete"} and found.chunks_to_remake() == [1]
    assert "DAMAGED: 2 problem(s)" in found.summary() and "to repair it" in found.repair()
    logs = []
    generate(GenerateOptions(out=str(store), **TINY), log=logs.append)
    assert any("refitting 1 chunk(s)" in line for line in logs) and any("2 of 4 chunks left" in line for line in logs)
    assert_identical_stores(tiny_store, store)


def test_an_unfinished_store_says_how_to_finish_it(store):
    m = read_manifest(store)
    m["status"], m["complete_chunks"] = "in_progress", [0, 2]
    write_manifest(store, m)
    code, out = _verify(store)
    assert code == 1 and "INCOMPLETE: 1 problem(s)" in out and "2 of 4 chunks are not written yet" in out
    assert "rerun the command that generated the store to finish it" in out


# ---------------------------------------------------------------------------- format v1
def test_a_version_1_store_stays_readable_and_verifiable(tmp_path):
    """tests/data/store-v1 was written by the writer before format v2 (tests/data/README.md)."""
    store = WeightStore(V1_STORE)
    assert store.manifest["format_version"] == 1 and "checksum" not in store.manifest
    values = store.read(0, 6)
    assert values["W2"].shape == (6, 32, 32) and all(np.isfinite(v).all() for v in values.values())
    assert store.networks.num_rows == 6 and set(store.stats()) == {"W1", "b1", "W2", "b2", "W3", "b3"}
    code, out = _verify(V1_STORE)
    assert code == 0, out
    assert "v1: no checksums" in out and "manifest   readable (no checksum" in out
    result = CliRunner().invoke(cli.main, ["info", str(V1_STORE)])
    assert result.exit_code == 0 and "6 in 2 chunks" in result.output


def test_a_version_1_store_is_repaired_by_a_rerun_and_stays_version_1(tmp_path):
    root = tmp_path / "v1"
    shutil.copytree(V1_STORE, root)
    (root / "W2/c/1/0/0").unlink()
    _flip(root / "b1/c/0/0", 7, 0x01)  # no checksum in v1: only the recomputed statistics notice a change
    with pytest.raises(DamagedStoreError, match="file W2/c/1/0/0 missing"):
        WeightStore(root)
    found = verify_store(root)
    assert [(p.part, p.chunk) for p in found.problems][:2] == [("chunk", 1), ("statistics", None)]
    assert "b1_mean differs from the one recomputed" in found.summary()
    generate(GenerateOptions(out=str(root), **V1_SETTINGS), **QUIET)
    repaired, original = WeightStore(root), WeightStore(V1_STORE)
    assert repaired.manifest["format_version"] == 1 and not (root / "arrays").exists()
    for name, values in original.read(4, 6).items():  # the refitted chunk
        np.testing.assert_allclose(repaired.read(4, 6)[name], values, atol=1e-6)
    assert verify_store(root).ok


# --------------------------------------------------------------------- plain zarr, foreign files
def test_plain_zarr_opens_the_arrays_without_warnings(tiny_store):
    """Format v2 keeps the manifest and the Parquet files out of the Zarr group's folder."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        group = zarr.open_group(str(tiny_store / "arrays"), mode="r")
        members = dict(group.members(max_depth=None))
    assert {"W1", "b3", "stats", "stats/W2_mean"} <= set(members)
    with warnings.catch_warnings(record=True) as caught:  # what format v1 did
        warnings.simplefilter("always")
        list(zarr.open_group(str(V1_STORE), mode="r").members())
    assert {"manifest.json", "networks.parquet", "fragments"} == {
        str(w.message).split("Object at ")[1].split(" is")[0] for w in caught}


# ------------------------------------------------------------------------ the command line
def test_the_manifest_records_the_command_line_that_remakes_the_store(tiny_store):
    """Every option is a flag of `zoo generate` (or documented as Python-only), and the recorded
    command parses back into the same options."""
    flags = {p.name for p in cli.generate.params}
    assert {f.name for f in fields(GenerateOptions)} - set(NOT_FLAGS) <= flags
    opts = GenerateOptions(kind="fmnist-classifiers", out="s3://lab/zoo", data_root="/data/fm", limit={"train": 4},
                           source_options={"verify": False, "batches": [1, 2]}, workers=3, use_ray=False,
                           diversity=True, chunk_size=298, lr=0.005)
    argv = command_line(opts)
    ctx = cli.generate.make_context("generate", argv[2:])
    parsed = GenerateOptions(**ctx.params)
    assert parsed == opts
    assert read_manifest(tiny_store)["command"][:5] == ["zoo", "generate", "mnist-inr", "--out", str(tiny_store)]


# ---------------------------------------------------------------- statistics in a fixed order
class _ShuffledExecutor(LocalExecutor):
    """Runs every job here, then hands the results back in a random order (as Ray tasks finish)."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def map_unordered(self, fn, jobs):
        results = [fn(**job) for job in jobs]
        self.rng.shuffle(results)
        yield from results


def test_statistics_do_not_depend_on_the_order_chunks_finish(tiny_store, tmp_path, monkeypatch):
    """Issue 21: two --workers 2 runs differed by 1e-10 in stats/W2_mean; the reduction now runs in
    chunk order, whatever order the chunks arrive in."""
    import zoo.generate.run as run

    for seed in (1, 2):
        monkeypatch.setattr(run, "make_executor", lambda *a, seed=seed, **k: _ShuffledExecutor(seed))
        out = tmp_path / f"order-{seed}"
        generate(GenerateOptions(out=str(out), **TINY), **QUIET)
        assert_identical_stores(tiny_store, out)  # statistics bit for bit


# ------------------------------------------------------------ jobs and the driver's machine
class _RecordingExecutor(LocalExecutor):
    def __init__(self):
        self.jobs = []

    def map_unordered(self, fn, jobs):
        for job in jobs:
            self.jobs.append(job)
            yield fn(**job)


def _strings(value):
    if isinstance(value, (str, Path)):
        yield str(value)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)
    elif hasattr(value, "__dataclass_fields__"):
        for f in fields(value):
            yield from _strings(getattr(value, f.name))


@pytest.mark.parametrize("where", ["folder", "url"])
def test_chunk_jobs_name_no_path_of_the_drivers_machine(tmp_path, monkeypatch, where):
    """A task may run on another machine: it gets the store's URL to write itself, or nothing (a
    local folder: it hands the chunk back and the driver writes it)."""
    import fsspec

    import zoo.generate.run as run

    recorder = _RecordingExecutor()
    monkeypatch.setattr(run, "make_executor", lambda *a, **k: recorder)
    out = str(tmp_path / "store") if where == "folder" else f"memory://jobs-{tmp_path.name}"
    generate(GenerateOptions(out=out, **{**TINY, "limit": 20, "chunk_size": 8, "steps": 2}), **QUIET)
    assert len(recorder.jobs) == 3
    for job in recorder.jobs:
        assert job["target"].url == (None if where == "folder" else out)
        assert not [s for s in _strings(job) if str(tmp_path) in s]
    assert WeightStore(out).num_networks == 20
    if where == "url":
        fsspec.filesystem("memory").rm(out.split("://")[1], recursive=True)


def test_a_chunk_tasks_result_carries_what_the_driver_needs(tmp_path):
    from zoo.generate.kinds import get_kind
    from zoo.store.writer import chunk_layout

    opts = GenerateOptions(out=str(tmp_path / "s"), **{**TINY, "limit": 6, "chunk_size": 4})
    generate(opts, **QUIET)
    manifest = read_manifest(tmp_path / "s")
    recipe = get_kind("mnist-inr").recipe(opts)
    from zoo.sources import get_source

    recipe.plan(get_source("digits"))
    from zoo.generate.chunk import ChunkTarget

    target = ChunkTarget(0, 0, 4, 4, chunk_layout(manifest), None)
    result = recipe.work(**recipe.job(target, "cpu"))
    # the driver writes the chunk and takes its moments as it writes it (zoo.generate.chunk)
    assert set(result) >= {"chunk", "networks", "params", "rows"} and not {"fragment", "moments"} & set(result)
    assert json.dumps(result["chunk"]) == "0"
    stored = WeightStore(tmp_path / "s").read(0, 4)
    for name, values in stored.items():
        np.testing.assert_array_equal(result["params"][name], values)
