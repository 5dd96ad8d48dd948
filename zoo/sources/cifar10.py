"""CIFAR-10 from the official python pickle batches.

Accepted layouts: ``root/cifar-10-batches-py/{data_batch_1..5,test_batch}`` (what the official
archive extracts to, and torchvision's layout too) or the batch files directly in ``root``.
Each batch is a pickled dict with ``data`` uint8 [N, 3072] (the red, green and blue 32x32 planes,
row-major) and ``labels`` [N]. Pickles can run code when loaded, so the unpickler only admits
what a numpy array needs.

Two data sets by name:

* ``cifar10``: the official release, every file checked against its official MD5, all five
  training batches required.
* ``cifar10-unverified``: files that are not (or not known to be) the official bytes, e.g. a
  copy rebuilt from JPEGs. Nothing is refused for its checksum; the provenance says "unverified
  substitute" and records each file's MD5 and whether it matches the official one. It reads the
  training batches that are present (at least one) and records which.

In Python, ``Cifar10Source(root, verify=..., batches=...)`` chooses both independently
(``batches=(1, 2)``, ``"present"`` or ``None`` = all five).

Splits: train and val come from the training batches read, concatenated in batch order: val =
the last 10% of those items, train = the rest; test = the official 10,000 test items. With all
five batches that is the paper's split (train = items 0..44,999, val = 45,000..49,999); with
``data_batch_1`` and ``data_batch_2``, train = items 0..17,999, val = 18,000..19,999. ``item_ids``
of train/val index the concatenation of *all five* batches (data_batch_k's item j is
``(k - 1) * 10,000 + j``), so an item keeps its id whichever batches were read.
"""

from __future__ import annotations

import io
import pickle
import tarfile
from pathlib import Path

import numpy as np

from .errors import DataError
from .fetch import download_file
from .images import HoldOut, ImageSource, OfficialSplit, check_labels
from .integrity import check_md5, file_record, md5_hex, read_file
from .nearby import folders_below, use_instead

FOLDER = "cifar-10-batches-py"
ARCHIVE = "cifar-10-python.tar.gz"
URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
ARCHIVE_MD5 = "c58f30108f718f92721af3b95e74349a"
BATCH_MD5 = {  # of the extracted files (torchvision's list)
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
}
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
BATCH_SIZE = 10_000  # items per official batch (item_ids of train/val count in these)
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
REDOWNLOAD = "Delete it and download the data set again."
UNVERIFIED = "cifar10-unverified"
USE_UNVERIFIED = (f"To use the files as they are, recorded as an unverified substitute, pass `--dataset {UNVERIFIED}` "
                  f"(in Python: get_source({UNVERIFIED!r}, root) or Cifar10Source(root, verify=False)).")
# (module, name) pairs a CIFAR batch pickle may refer to: numpy array reconstruction only.
ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
}


def where_to_put(root: Path) -> str:
    return (f"Extract {ARCHIVE} ({URL}) into {root} so that {root / FOLDER / 'data_batch_1'} exists, or download it "
            f"with `zoo generate ... --data-root {root} --download` (in Python: get_source('cifar10', root, "
            f"download=True)).")


def missing_hint(root: str | Path, names, what: str) -> str:
    """What to do when batches ``names`` are missing: the folder below ``root`` that holds some of them (a data
    root one level too high; its own error then says what a partial copy needs), or where to put them."""
    folder = batch_folder(root)
    below = folders_below(Path(root), lambda other: batch_folder(other) != folder
                          and any((batch_folder(other) / name).is_file() for name in names))
    return use_instead(below, what) or where_to_put(Path(root))


class _ArrayUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) not in ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR batch")
        return super().find_class(module, name)


def batch_folder(root: str | Path) -> Path:
    """The folder holding the batches: ``root/cifar-10-batches-py`` if it exists, else ``root``."""
    root = Path(root)
    return root / FOLDER if (root / FOLDER).is_dir() else root


def read_batch(path: str | Path, md5: str | None = None) -> tuple[np.ndarray, np.ndarray, dict]:
    """One batch file: images uint8 [N, 32, 32, 3], labels int64 [N], its manifest record.

    ``md5``: refuse the file unless its MD5 is this. The record always holds the file's MD5
    (``content_md5``) and, for the official batch names, whether it is the official one.
    """
    path = Path(path)
    stored = read_file(path, where_to_put(path.parent))
    verified = check_md5(stored, md5, path, "file", f"{REDOWNLOAD} {USE_UNVERIFIED}")
    try:
        batch = _ArrayUnpickler(io.BytesIO(stored), encoding="latin1").load()
    except Exception as err:  # anything the bytes can make pickle raise
        if isinstance(err, EOFError) or "truncated" in str(err):
            raise DataError(f"{path}: truncated pickle ({len(stored)} bytes). {REDOWNLOAD}") from err
        raise DataError(f"{path}: not a CIFAR-10 batch pickle ({type(err).__name__}: {err}). {REDOWNLOAD}") from err
    if not isinstance(batch, dict):
        raise DataError(f"{path}: pickle holds a {type(batch).__name__}, expected a dict. {REDOWNLOAD}")
    batch = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in batch.items()}
    data, labels = batch.get("data"), batch.get("labels")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        shown = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DataError(f"{path}: 'data' must be uint8 [N, 3072], got {shown}. {REDOWNLOAD}")
    labels = check_labels(labels, len(data), len(CLASSES), path, REDOWNLOAD)
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    record = file_record(path, stored, verified=verified)
    if path.name in BATCH_MD5:
        record["official_md5"] = BATCH_MD5[path.name]
        record["matches_official"] = record["content_md5"] == BATCH_MD5[path.name]
    return np.ascontiguousarray(images), labels, record


def train_batch_names(batches) -> tuple[str, ...]:
    """``None`` -> all five training batches; ``(1, 2)`` -> data_batch_1, data_batch_2 (sorted, unique)."""
    if batches is None:
        return TRAIN_BATCHES
    numbers = sorted(set(batches))
    if not numbers or any(not isinstance(k, (int, np.integer)) or not 1 <= k <= 5 for k in numbers):
        raise ValueError(f"CIFAR-10 training batches are numbered 1..5; got {list(batches)!r}")
    return tuple(f"data_batch_{k}" for k in numbers)


def present_batches(root: str | Path) -> tuple[int, ...]:
    """The numbers of the training batches found in ``root`` (in an accepted layout)."""
    folder = batch_folder(root)
    return tuple(k for k, name in enumerate(TRAIN_BATCHES, 1) if (folder / name).is_file())


def read_split(root: str | Path, split: str, verify: bool = True, batches=None) -> OfficialSplit:
    """Official split "test", or "train" from the training ``batches`` (see :func:`train_batch_names`).

    ``item_ids`` of "train" index all five batches, so ``data_batch_2``'s first item is 10,000.
    """
    folder = batch_folder(root)
    names = ("test_batch",) if split == "test" else train_batch_names(batches)
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        hint = missing_hint(root, names, f"CIFAR-10 {split} batches")
        if split == "train" and batches is None and len(missing) < len(names):
            hint += (f" To read only the training batches present (recorded in the provenance), pass `--dataset "
                     f"{UNVERIFIED}` (in Python: Cifar10Source(root, batches='present')).")
        raise DataError(f"CIFAR-10 {split} split not found: no {', '.join(missing)} in {folder}. " + hint)
    parts = [read_batch(folder / name, BATCH_MD5[name] if verify else None) for name in names]
    ids = None
    if split == "train":
        ids = np.concatenate([(int(name.rsplit("_", 1)[1]) - 1) * BATCH_SIZE + np.arange(len(p[1]))
                              for name, p in zip(names, parts)])
    return OfficialSplit(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                         [p[2] for p in parts], item_ids=ids)


def download(root: str | Path) -> str | None:
    """Fetch and extract the official archive into ``root`` unless the batches are there; return the URL."""
    root = Path(root)
    if all((batch_folder(root) / name).is_file() for name in BATCH_MD5):
        return None
    archive = root / ARCHIVE
    if not (archive.is_file() and md5_hex(archive.read_bytes()) == ARCHIVE_MD5):
        download_file([URL], archive, ARCHIVE_MD5, where_to_put(root))
    try:
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(root, filter="data")  # "data" refuses absolute paths and links out of root
    except (tarfile.TarError, EOFError, OSError) as err:
        raise DataError(f"{archive}: cannot extract ({err}). Delete it and download again.") from err
    return URL


class Cifar10Source(ImageSource):
    """CIFAR-10: val = the last 10% of the training batches read (the paper's 45K / 5K with all five), test 10K.

    ``verify``: refuse files whose MD5 is not the official one (default); ``verify=False`` reads
    them and records them as an unverified substitute. ``batches``: the training batches to read,
    ``None`` (all five), a collection of numbers 1..5, or ``"present"`` (those in the folder).
    """

    shape = (32, 32, 3)

    def __init__(self, root: str | Path, verify: bool = True, batches=None,
                 holdout: HoldOut = HoldOut(last_share=0.1)):
        super().__init__(holdout)
        self.root, self.verify, self.name = Path(root), verify, "cifar10" if verify else UNVERIFIED
        if batches == "present":
            batches = present_batches(self.root)
            if not batches:
                raise DataError(f"no CIFAR-10 training batch (data_batch_1..5) in {batch_folder(self.root)}. "
                                + missing_hint(self.root, TRAIN_BATCHES, "CIFAR-10 training batches"))
        self.train_batches = train_batch_names(batches)  # file names, checked here so bad numbers fail early
        self.batches = batches

    def read_official(self, official: str) -> OfficialSplit:
        return read_split(self.root, official, self.verify, self.batches)

    def describe(self) -> dict:
        return {"root": str(self.root), "url": URL, "archive_md5": ARCHIVE_MD5, "classes": list(CLASSES),
                "train_batches": list(self.train_batches),
                "item_ids": "train/val: (k - 1) * 10000 + j for item j of data_batch_k; test: index in test_batch",
                "checksums": "MD5 of each batch file checked against the official one" if self.verify else
                             "not checked: see md5 and each file's matches_official",
                **({} if self.verify else {"verification": "unverified substitute",
                                           "md5": {f["name"]: f["content_md5"] for f in self.files_read()}})}
