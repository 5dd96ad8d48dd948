"""Writing never stalls compute (issue 33): ``zoo generate`` writes each finished chunk in a
background thread with a bounded queue (:mod:`zoo.generate.writeback`), and a local chunk file is
written straight from the values (:func:`zoo.store.writer.write_chunk`), byte for byte as zarr
writes it. The background path makes the same store as the synchronous one; a failing write
surfaces as its own exception and lists nothing it did not write; the producer blocks when the
writer holds its limit. None of these tests depends on timing."""

import threading
import time

import numpy as np
import pyarrow as pa
import pytest
import zarr

import zoo.generate.run as run
from generate_helpers import TINY, WriteFailed, assert_identical_stores, fail_writing
from zoo.generate.run import GenerateOptions, generate
from zoo.generate.writeback import DEPTH_VARIABLE, MIN_BACKGROUND_BYTES, ChunkWriter, write_depth
from zoo.store.manifest import read_manifest

QUIET = dict(log=lambda *_: None)
SMALL = {**TINY, "steps": 5}  # 60 INRs of 8x8 digits in 4 chunks (the last one 12 networks: an edge chunk)


def wait_until(condition, what: str, seconds: float = 30.0) -> None:
    """Wait for another thread's progress (a generous bound, not a measured time)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.001)


@pytest.fixture(scope="module")
def synchronous_store(tmp_path_factory):
    """The reference: every chunk written in the main thread before the next one is made."""
    out = tmp_path_factory.mktemp("sync") / "store"
    with pytest.MonkeyPatch.context() as env:
        env.setenv(DEPTH_VARIABLE, "0")
        generate(GenerateOptions(out=str(out), **SMALL), **QUIET)
    return out


# ---------------------------------------------------------------- the store it makes
@pytest.mark.parametrize("depth, progress", [("1", False), ("2", True)])
def test_the_background_writer_makes_the_synchronous_store(synchronous_store, tmp_path, monkeypatch, depth,
                                                         progress):
    monkeypatch.setenv(DEPTH_VARIABLE, depth)
    out = tmp_path / "store"
    generate(GenerateOptions(out=str(out), **{**SMALL, "progress": progress}), **QUIET)
    assert_identical_stores(synchronous_store, out)  # arrays bit for bit, table, statistics, file checksums
    for path in sorted((synchronous_store / "arrays").rglob("*")):  # and every file of the arrays, byte for byte
        if path.is_file():
            assert (out / path.relative_to(synchronous_store)).read_bytes() == path.read_bytes(), path


@pytest.mark.parametrize("checksum", [True, False], ids=["crc32c", "v1-bytes-only"])
def test_a_whole_chunk_file_has_the_bytes_zarr_writes(tmp_path, checksum):
    """The direct write of a local chunk (format v2: values + crc32c; v1: values) equals zarr's own
    encoding; an edge chunk (zarr pads it to full size) is left to zarr."""
    import os

    from zarr.codecs import Crc32cCodec

    from zoo.store.writer import _direct_chunk_file, _stage_chunk_files

    values = np.random.default_rng(0).standard_normal((10, 3, 5)).astype(np.float32)
    codecs = {"compressors": [Crc32cCodec()] if checksum else None}
    files = {}
    for side in ("zarr", "direct"):
        group = zarr.open_group(str(tmp_path / side), mode="w", zarr_format=3)
        arr = group.create_array("W1", shape=(10, 3, 5), chunks=(4, 3, 5), dtype="float32",
                                 fill_value=float("nan"), **codecs)
        for chunk, (start, stop) in enumerate([(0, 4), (4, 8), (8, 10)]):
            target = _direct_chunk_file(arr, chunk, values[start:stop])
            assert (target is None) == (chunk == 2)  # only the edge chunk goes through zarr
            if side == "direct" and target is not None:
                path, crc = target
                assert crc == checksum
                [(tmp, _)] = _stage_chunk_files([("W1", values[start:stop], path, crc)], chunk)
                os.replace(tmp, path)
            else:
                arr[start:stop] = values[start:stop]
        files[side] = {p.relative_to(tmp_path / side): p.read_bytes() for p in (tmp_path / side).rglob("*")
                       if p.is_file()}
        np.testing.assert_array_equal(zarr.open_array(str(tmp_path / side / "W1"), mode="r")[:], values)
    assert files["direct"] == files["zarr"] and len(files["zarr"]) == 5  # 3 chunks + 2 zarr.json


def test_a_store_written_through_zarr_alone_has_the_same_files(synchronous_store, tmp_path, monkeypatch):
    import zoo.store.writer as writer

    monkeypatch.setattr(writer, "_direct_chunk_file", lambda *args: None)
    out = tmp_path / "store"
    generate(GenerateOptions(out=str(out), **SMALL), **QUIET)
    for path in sorted((synchronous_store / "arrays").rglob("*")):
        if path.is_file():
            assert (out / path.relative_to(synchronous_store)).read_bytes() == path.read_bytes(), path


def test_a_nan_is_refused_before_any_file_is_written(tmp_path):
    from zoo.store.format import StoreError
    from zoo.store.writer import chunk_layout, write_chunk

    out = tmp_path / "store"
    generate(GenerateOptions(out=str(out), **{**SMALL, "limit": 8, "chunk_size": 4}), **QUIET)
    manifest = read_manifest(out)
    params = {name: np.zeros((4, *shape), np.float32) for name, shape in manifest["parameters"].items()}
    params["b2"][3, -1] = np.nan
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(StoreError, match="b2 contains NaN"):
        write_chunk(out, 0, params, pa.table({"index": range(4)}), chunk_layout(manifest))
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


# ---------------------------------------------------------------- failures
@pytest.mark.parametrize("depth", ["0", "1", "2"])
def test_a_failing_write_raises_its_own_error_and_lists_only_written_chunks(synchronous_store, tmp_path,
                                                                            monkeypatch, depth):
    monkeypatch.setenv(DEPTH_VARIABLE, depth)
    failure, attempted = fail_writing(monkeypatch, 2)
    out = tmp_path / "store"
    with pytest.raises(WriteFailed) as raised:
        generate(GenerateOptions(out=str(out), **SMALL), **QUIET)
    assert raised.value is failure  # the same exception object, as the synchronous path raises it
    assert attempted == [0, 1, 2]  # nothing is written after the failed chunk
    manifest = read_manifest(out)
    assert manifest["complete_chunks"] == [0, 1] and manifest["status"] == "in_progress"
    assert sorted(k for k in manifest["checksums"]["files"] if k.startswith("fragments/")) == [
        "fragments/chunk-000000.parquet", "fragments/chunk-000001.parquet"]
    monkeypatch.undo()
    logs = []
    generate(GenerateOptions(out=str(out), **SMALL), log=logs.append)  # the rerun makes chunks 2 and 3
    assert any("2 of 4 chunks left" in line for line in logs), logs
    assert_identical_stores(synchronous_store, out)


def test_an_interrupt_in_the_writer_reaches_the_main_thread(synchronous_store, tmp_path, monkeypatch):
    """Ctrl-C delivered while the manifest was about to list chunk 2 (its files stored): the run stops
    with KeyboardInterrupt, chunk 2 is not listed, the rerun makes it again."""
    monkeypatch.setenv(DEPTH_VARIABLE, "2")
    real = run.mark_chunks_complete

    def mark(root, manifest, fragments):
        if 2 in fragments:
            raise KeyboardInterrupt
        return real(root, manifest, fragments)

    monkeypatch.setattr(run, "mark_chunks_complete", mark)
    out = tmp_path / "store"
    with pytest.raises(KeyboardInterrupt):
        generate(GenerateOptions(out=str(out), **SMALL), **QUIET)
    assert read_manifest(out)["complete_chunks"] == [0, 1]
    assert (out / "fragments" / "chunk-000002.parquet").exists()  # stored, not listed
    monkeypatch.undo()
    generate(GenerateOptions(out=str(out), **SMALL), **QUIET)
    assert_identical_stores(synchronous_store, out)


def test_a_failure_while_computing_keeps_the_chunks_already_made(synchronous_store, tmp_path, monkeypatch):
    """Ctrl-C (or any error) while chunk 2 is made: chunks 0 and 1, handed to the writer, are still
    written and listed, as the synchronous path had them; the rerun makes 2 and 3."""
    monkeypatch.setenv(DEPTH_VARIABLE, "2")
    from zoo.generate.inr import InrRecipe

    real_work = InrRecipe.work

    def work(**job):
        if job["target"].chunk == 2:
            raise KeyboardInterrupt
        return real_work(**job)

    monkeypatch.setattr(InrRecipe, "work", staticmethod(work))
    out = tmp_path / "store"
    with pytest.raises(KeyboardInterrupt):
        generate(GenerateOptions(out=str(out), **SMALL), **QUIET)
    assert read_manifest(out)["complete_chunks"] == [0, 1]
    monkeypatch.undo()
    generate(GenerateOptions(out=str(out), **SMALL), **QUIET)
    assert_identical_stores(synchronous_store, out)


# ---------------------------------------------------------------- the writer itself
def test_the_writer_handles_items_in_order_and_close_waits_for_them():
    handled = []
    writer = ChunkWriter(handled.append, depth=2)
    for i in range(20):
        writer.put(i)
    writer.close()
    assert handled == list(range(20)) and writer.handled == 20


def test_the_producer_blocks_while_the_writer_holds_its_limit():
    release, started, handled = threading.Event(), threading.Event(), []

    def handle(item):
        started.set()
        release.wait()
        handled.append(item)

    writer = ChunkWriter(handle, depth=2)
    returned = []

    def produce():
        for i in range(5):
            writer.put(i)
            returned.append(i)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        wait_until(lambda: started.is_set() and writer.blocked == 1, "the producer waits for room")
        assert writer.held == 2 and returned == [0, 1]  # item 0 in hand, 1 waiting, 2 held back
    finally:
        release.set()
    producer.join()
    writer.close()
    assert handled == list(range(5)) and returned == list(range(5))


def test_a_writer_error_is_raised_by_put_check_and_close_and_stops_the_writer():
    failure, handled = WriteFailed("boom"), []

    def handle(item):
        if item == 1:
            raise failure
        handled.append(item)

    writer = ChunkWriter(handle, depth=1)
    writer.put(0)
    writer.put(1)
    wait_until(lambda: writer._error is not None, "the writer fails")
    for call in (lambda: writer.put(2), writer.check, writer.close):
        with pytest.raises(WriteFailed) as raised:
            call()
        assert raised.value is failure
    writer.stop()  # returns at once: the writer has stopped
    assert handled == [0]


def test_stop_writes_what_the_writer_holds_and_abandon_drops_what_it_has_not_started():
    release, handled = threading.Event(), []
    writer = ChunkWriter(lambda item: (release.wait(), handled.append(item)), depth=3)
    for i in range(3):
        writer.put(i)
    release.set()
    writer.stop()  # after an error of the caller: the chunks it holds are still written
    assert handled == [0, 1, 2]

    release.clear()
    handled.clear()
    writer = ChunkWriter(lambda item: (release.wait(), handled.append(item)), depth=3)
    for i in range(3):
        writer.put(i)
    try:
        wait_until(lambda: len(writer._waiting) == 2, "item 0 taken")
        writer.abandon()  # a second Ctrl-C: nothing more is started; item 0, in hand, finishes
    finally:
        release.set()
    writer._thread.join()
    assert handled == [0]


def test_depth_zero_writes_in_the_calling_thread(monkeypatch):
    threads = []
    writer = ChunkWriter(lambda item: threads.append(threading.current_thread()), depth=0)
    writer.put(0)
    assert threads == [threading.current_thread()]
    writer.close()
    monkeypatch.setenv(DEPTH_VARIABLE, "0")
    assert write_depth() == 0
    monkeypatch.setenv(DEPTH_VARIABLE, "-1")
    with pytest.raises(ValueError, match=DEPTH_VARIABLE):
        write_depth()
    monkeypatch.delenv(DEPTH_VARIABLE)
    assert write_depth() == 2  # unknown size: large
    assert write_depth(MIN_BACKGROUND_BYTES - 1, in_process=True) == 0  # small chunks made here: synchronous
    assert write_depth(MIN_BACKGROUND_BYTES - 1, in_process=False) == 2  # Ray: the driver only waits
    assert write_depth(MIN_BACKGROUND_BYTES, in_process=True) == 2


def test_a_run_of_small_chunks_in_this_process_writes_in_the_main_thread(tmp_path, monkeypatch):
    monkeypatch.delenv(DEPTH_VARIABLE, raising=False)
    threads, real = set(), run.write_chunk

    def write_chunk(*args, **kwargs):
        threads.add(threading.current_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(run, "write_chunk", write_chunk)
    generate(GenerateOptions(out=str(tmp_path / "store"), **{**SMALL, "limit": 8, "chunk_size": 4}), **QUIET)
    assert threads == {threading.main_thread()}
