"""A chunk's files written by several threads at once (``zoo.store.writer._stage_chunk_files``): each
array cut into parts, each part checked, checksummed and written at its offset, the parts' crc32c
combined (``zoo.store.checksum.crc32c_combine``). The files are the bytes zarr writes whatever the
cut, the block size and the thread count; a NaN in any part leaves nothing behind."""

import google_crc32c
import numpy as np
import pytest
import zarr
from zarr.codecs import Crc32cCodec

import zoo.store.writer as writer
from zoo.store.checksum import crc32c_combine
from zoo.store.format import StoreError


@pytest.mark.parametrize("seed", range(5))
def test_combined_checksums_are_the_checksum_of_the_whole(seed):
    rng = np.random.default_rng(seed)
    data = rng.bytes(int(rng.integers(0, 5000)))
    cuts = sorted(int(c) for c in rng.integers(0, len(data) + 1, int(rng.integers(0, 6))))
    parts = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
    crc = google_crc32c.value(parts[0])
    for part in parts[1:]:
        crc = crc32c_combine(crc, google_crc32c.value(part), len(part))
    assert crc == google_crc32c.value(data)


def test_a_combined_checksum_tells_a_changed_part():
    a, b = b"weights" * 100, b"biases" * 77
    assert crc32c_combine(google_crc32c.value(a), google_crc32c.value(b), len(b)) == google_crc32c.value(a + b)
    changed = b[:-1] + b"!"
    assert crc32c_combine(google_crc32c.value(a), google_crc32c.value(changed), len(b)) != google_crc32c.value(a + b)
    assert crc32c_combine(google_crc32c.value(a), google_crc32c.value(b), len(b) + 1) != google_crc32c.value(a + b)


def zarr_chunk_files(tmp_path, arrays: dict, checksum: bool) -> tuple[dict, dict]:
    """For each array its zarr-encoded chunk file (one chunk holding all of it) and the path the direct
    write would take in a second, empty array of the same layout."""
    codecs = {"compressors": [Crc32cCodec()] if checksum else None}
    expected, targets = {}, {}
    for side in ("zarr", "direct"):
        group = zarr.open_group(str(tmp_path / side), mode="w", zarr_format=3)
        for name, values in arrays.items():
            arr = group.create_array(name, shape=values.shape, chunks=values.shape, dtype="float32",
                                     fill_value=float("nan"), **codecs)
            if side == "zarr":
                arr[:] = values
                expected[name] = next(p for p in (tmp_path / side / name).rglob("*")
                                      if p.is_file() and p.name != "zarr.json").read_bytes()
            else:
                targets[name] = writer._direct_chunk_file(arr, 0, values)
    return expected, targets


@pytest.mark.parametrize("threads, split_bytes, block", [(1, 8 << 20, 1 << 18), (2, 64, 7), (3, 1, 5), (2, 0, 1 << 18)])
@pytest.mark.parametrize("checksum", [True, False], ids=["crc32c", "v1-bytes-only"])
def test_parts_written_by_several_threads_are_the_bytes_zarr_writes(tmp_path, monkeypatch, threads, split_bytes,
                                                                    block, checksum):
    """Ragged parts and blocks (sizes that divide nothing), arrays too small to cut, an empty one."""
    monkeypatch.setattr(writer, "_STAGING_THREADS", threads)
    monkeypatch.setattr(writer, "_SPLIT_BYTES", split_bytes)
    monkeypatch.setattr(writer, "_BLOCK", block)
    rng = np.random.default_rng(threads)
    arrays = {"W1": rng.standard_normal((5, 7, 11)).astype(np.float32), "b1": rng.standard_normal((5, 3)).astype(np.float32),
              "W2": rng.standard_normal((5, 1, 3)).astype(np.float32), "b2": np.zeros((5, 0), np.float32)}
    expected, targets = zarr_chunk_files(tmp_path, {k: v for k, v in arrays.items() if v.size}, checksum)
    targets["b2"] = (tmp_path / "direct" / "b2" / "c" / "0", checksum)  # an empty array: its bytes are its checksum
    staged = writer._stage_chunk_files([(name, arrays[name], *targets[name]) for name in arrays], chunk=0)
    assert [path for _, path in staged] == [targets[name][0] for name in arrays]
    written = {name: tmp.read_bytes() for name, (tmp, _) in zip(arrays, staged)}
    for name in expected:
        assert written[name] == expected[name], name
    assert written["b2"] == ((0).to_bytes(4, "little") if checksum else b"")


@pytest.mark.parametrize("where", ["first part", "last element", "small array"])
def test_a_nan_in_any_part_leaves_no_file(tmp_path, monkeypatch, where):
    monkeypatch.setattr(writer, "_STAGING_THREADS", 2)
    monkeypatch.setattr(writer, "_SPLIT_BYTES", 64)
    monkeypatch.setattr(writer, "_BLOCK", 16)
    arrays = {"W1": np.ones((6, 8, 8), np.float32), "b1": np.ones((6, 4), np.float32)}
    if where == "first part":
        arrays["W1"][0, 1, 2] = np.nan
    elif where == "last element":
        arrays["W1"][-1, -1, -1] = -np.inf
    else:
        arrays["b1"][2, 3] = np.inf
    _, targets = zarr_chunk_files(tmp_path, arrays, True)
    before = sorted(p for p in tmp_path.rglob("*"))
    with pytest.raises(StoreError, match=f"chunk 3: {'b1' if where == 'small array' else 'W1'} contains NaN or inf"):
        writer._stage_chunk_files([(name, values, *targets[name]) for name, values in arrays.items()], chunk=3)
    after = sorted(p for p in tmp_path.rglob("*"))
    assert after == before or all(p.is_dir() for p in set(after) - set(before))  # no file, at most the folders


def test_a_failing_write_raises_its_own_error_and_leaves_no_file(tmp_path, monkeypatch):
    """A full disk in one thread's part: its OSError reaches the caller, the other parts stop, no file stays."""
    import errno
    import os

    monkeypatch.setattr(writer, "_STAGING_THREADS", 2)
    monkeypatch.setattr(writer, "_SPLIT_BYTES", 64)
    monkeypatch.setattr(writer, "_BLOCK", 16)
    arrays = {"W1": np.ones((6, 8, 8), np.float32), "b1": np.ones((6, 4), np.float32)}
    _, targets = zarr_chunk_files(tmp_path, arrays, True)
    calls, pwrite = [], os.pwrite

    def full_disk(fd, data, offset):
        calls.append(offset)
        if len(calls) == 5:
            raise OSError(errno.ENOSPC, "No space left on device")
        return pwrite(fd, data, offset)

    monkeypatch.setattr(writer.os, "pwrite", full_disk)
    before = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    with pytest.raises(OSError, match="No space left"):
        writer._stage_chunk_files([(name, values, *targets[name]) for name, values in arrays.items()], chunk=0)
    assert sorted(p for p in tmp_path.rglob("*") if p.is_file()) == before
    assert 6 * 8 * 8 * 4 not in calls and 6 * 4 * 4 not in calls  # no checksum was written after it


def test_without_pwrite_one_thread_writes_the_same_bytes(tmp_path, monkeypatch):
    """Where ``os.pwrite`` is missing (Windows) the parts are written by seeking, in one thread."""
    monkeypatch.delattr(writer.os, "pwrite")
    monkeypatch.setattr(writer, "_STAGING_THREADS", 1)
    monkeypatch.setattr(writer, "_SPLIT_BYTES", 64)
    monkeypatch.setattr(writer, "_BLOCK", 7)
    values = np.random.default_rng(3).standard_normal((5, 7, 11)).astype(np.float32)
    expected, targets = zarr_chunk_files(tmp_path, {"W1": values}, True)
    [(tmp, _)] = writer._stage_chunk_files([("W1", values, *targets["W1"])], chunk=0)
    assert tmp.read_bytes() == expected["W1"]
