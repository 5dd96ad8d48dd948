"""The real data sets kept beside the checkout in ``../shared/data`` (CI has them; a user's clone does not).

Every test skips cleanly when its folder is absent. The expected numbers are those of the official
releases (label counts, first labels) and, for the approximate CIFAR-10 copy, the MD5s its
PROVENANCE.md lists.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from cli import main
from zoo.sources import FASHION_MNIST, MNIST, DataError, get_source
from zoo.store import WeightStore

SHARED = Path(__file__).resolve().parents[1].parent / "shared/data"
MNIST_FULL, FASHION, CIFAR = SHARED / "mnist-full", SHARED / "fashion-mnist", SHARED / "cifar-10"
CIFAR_SUBSTITUTE_MD5 = {"data_batch_1": "feee733244894b222a27c154ccdbcf5e",
                        "data_batch_2": "2063c17b2db2ec21d9ffe7ef58c9d613",
                        "test_batch": "3927d7bb9d34c3555c5eb09009d0a298"}
MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]


def needs(folder: Path, *names: str):
    return pytest.mark.skipif(not all((folder / n).is_file() for n in names), reason=f"{folder} not here")


needs_mnist_full = needs(MNIST_FULL, "train-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
needs_fashion = needs(FASHION, "train-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
needs_cifar = needs(CIFAR / "cifar-10-batches-py", "data_batch_1", "data_batch_2", "test_batch")


@needs_mnist_full
def test_full_mnist_gives_the_papers_splits_from_verified_files():
    source = get_source("mnist", MNIST_FULL)
    splits = source.splits()
    assert {k: len(v) for k, v in splits.items()} == {"train": 55_000, "val": 5_000, "test": 10_000}
    assert splits["train"].labels[:5].tolist() == [5, 0, 4, 1, 9]  # the well-known first training digits
    assert splits["val"].item_ids[[0, -1]].tolist() == [55_000, 59_999]
    train_val = np.concatenate([splits["train"].labels, splits["val"].labels])
    assert np.bincount(train_val).tolist() == MNIST_TRAIN_COUNTS
    files = source.provenance()["files"]
    assert len(files) == 4 and all(f["verified"] for f in files)
    assert {f["name"].removesuffix(".gz"): f["content_md5"] for f in files} == MNIST.content_md5


@needs_fashion
def test_fashion_mnist_gives_the_papers_splits_from_verified_files():
    source = get_source("fashion-mnist", FASHION)
    splits = source.splits()
    assert {k: len(v) for k, v in splits.items()} == {"train": 55_000, "val": 5_000, "test": 10_000}
    train_val = np.concatenate([splits["train"].labels, splits["val"].labels])
    assert np.bincount(train_val).tolist() == [6_000] * 10
    assert np.bincount(splits["test"].labels).tolist() == [1_000] * 10
    files = source.provenance()["files"]
    assert {f["name"].removesuffix(".gz"): f["content_md5"] for f in files} == FASHION_MNIST.content_md5


@needs_cifar
def test_cifar10_copy_is_refused_as_official_and_read_as_an_unverified_substitute():
    with pytest.raises(DataError, match="data_batch_1: MD5 of the file is feee7332.*--dataset cifar10-unverified"):
        get_source("cifar10", CIFAR, batches=(1, 2)).split("train")
    with pytest.raises(DataError, match="no data_batch_3, data_batch_4, data_batch_5.*--dataset cifar10-unverified"):
        get_source("cifar10", CIFAR).split("train")
    source = get_source("cifar10-unverified", CIFAR)
    splits = source.splits()
    assert {k: len(v) for k, v in splits.items()} == {"train": 18_000, "val": 2_000, "test": 10_000}
    assert splits["val"].item_ids[[0, -1]].tolist() == [18_000, 19_999]
    assert np.bincount(splits["test"].labels).tolist() == [1_000] * 10
    assert splits["train"].labels[:5].tolist() == [6, 9, 9, 4, 1]  # frog, truck, truck, deer, automobile
    record = source.provenance()
    assert record["verification"] == "unverified substitute" and record["md5"] == CIFAR_SUBSTITUTE_MD5
    assert record["train_batches"] == ["data_batch_1", "data_batch_2"]


@needs_mnist_full
def test_offline_mnist_sources_read_the_full_folder_too():
    for name, test_count in (("mnist-offline", 10_000), ("mnist-offline-xl", 2_000)):
        assert len(get_source(name, MNIST_FULL).split("test")) == test_count


@pytest.mark.parametrize("kind, dataset, root", [
    pytest.param("mnist-inr", "mnist", MNIST_FULL, marks=needs_mnist_full),
    pytest.param("fmnist-inr", "fashion-mnist", FASHION, marks=needs_fashion),
    pytest.param("cifar10-inr", "cifar10-unverified", CIFAR, marks=needs_cifar),
])
def test_generate_reads_each_real_folder_with_data_root(tmp_path, kind, dataset, root):
    out = tmp_path / "store"
    result = CliRunner().invoke(main, ["generate", kind, "--dataset", dataset, "--data-root", str(root),
                                       "--limit", "train=3,val=2,test=2", "--steps", "2", "--no-ray",
                                       "--out", str(out)])
    assert result.exit_code == 0, result.output
    store = WeightStore(out)
    assert store.num_networks == 7 and store.manifest["source"]["root"] == str(root)
