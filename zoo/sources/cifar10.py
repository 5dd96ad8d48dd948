"""CIFAR-10 from the official python pickle batches.

Accepted layouts: ``root/cifar-10-batches-py/{data_batch_1..5,test_batch}`` (what the official
archive extracts to, and torchvision's layout too) or the batch files directly in ``root``.
Each batch is a pickled dict with ``data`` uint8 [N, 3072] (the red, green and blue 32x32 planes,
row-major) and ``labels`` [N]. Pickles can run code when loaded, so the unpickler only admits
what a numpy array needs. Paper splits: train = official train items 0..44,999 (batches 1..5 in
order), val = items 45,000..49,999, test = the official 10,000 test items.
"""

from __future__ import annotations

import io
import pickle
import tarfile
from pathlib import Path

import numpy as np

from .errors import DataError
from .fetch import download_file
from .images import HoldOut, ImageSource, OfficialSplit
from .integrity import check_md5, file_record, md5_hex, read_file

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
FILES = {"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)}
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
REDOWNLOAD = "Delete it and download the data set again."
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
    """One batch file: images uint8 [N, 32, 32, 3], labels int64 [N], its manifest record."""
    path = Path(path)
    stored = read_file(path, where_to_put(path.parent))
    verified = check_md5(stored, md5, path, "file", REDOWNLOAD)
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
    labels = np.asarray(labels if labels is not None else [], dtype=np.int64)
    if labels.shape != (len(data),) or (labels.size and (labels.min() < 0 or labels.max() >= len(CLASSES))):
        raise DataError(f"{path}: 'labels' must be {len(data)} integers in 0..9 "
                        f"(got shape {labels.shape}). {REDOWNLOAD}")
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), labels, file_record(path, stored, verified=verified)


def read_split(root: str | Path, split: str, verify: bool = True) -> OfficialSplit:
    """Official split "train" (batches 1..5 concatenated) or "test"."""
    folder = batch_folder(root)
    missing = [name for name in FILES[split] if not (folder / name).is_file()]
    if missing:
        raise DataError(f"CIFAR-10 {split} split not found: no {', '.join(missing)} in {folder}. "
                        + where_to_put(Path(root)))
    parts = [read_batch(folder / name, BATCH_MD5[name] if verify else None) for name in FILES[split]]
    return OfficialSplit(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                         [p[2] for p in parts])


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
    """CIFAR-10 with the 45K / 5K / 10K splits."""

    shape = (32, 32, 3)

    def __init__(self, root: str | Path, verify: bool = True, holdout: HoldOut = HoldOut(last=5_000)):
        super().__init__(holdout)
        self.root, self.verify, self.name = Path(root), verify, "cifar10"

    def read_official(self, official: str) -> OfficialSplit:
        return read_split(self.root, official, self.verify)

    def describe(self) -> dict:
        return {"root": str(self.root), "url": URL, "archive_md5": ARCHIVE_MD5, "classes": list(CLASSES),
                "checksums": "MD5 of each batch file" if self.verify else "not verified"}
