"""MNIST and Fashion-MNIST from their official IDX files.

Accepted layouts under ``root`` (gzip or uncompressed, first match wins):

* ours: the files directly in ``root`` (``root/train-images-idx3-ubyte.gz`` ...);
* torchvision's: ``root/MNIST/raw/...`` and ``root/FashionMNIST/raw/...``.

Files are verified against the MD5 of their *uncompressed* content (recompressed copies are
common, so the MD5 of a .gz file says little); the official .gz MD5s (torchvision's list) are
used to check downloads. Paper splits: train = official train items 0..54,999, val = items
55,000..59,999, test = the official 10,000 test items.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import DataError
from .fetch import download_file
from .idx import REDOWNLOAD, load_idx
from .images import HoldOut, ImageSource, OfficialSplit, check_labels
from .nearby import folders_below, use_instead

FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


@dataclass(frozen=True)
class IdxDataset:
    """What distinguishes MNIST from Fashion-MNIST: names, mirrors and checksums."""

    name: str  # registry name
    title: str
    folder: str  # torchvision's folder: root/<folder>/raw
    mirrors: tuple[str, ...]
    gz_md5: dict  # file stem -> MD5 of the official .gz (for downloads)
    content_md5: dict  # file stem -> MD5 of the uncompressed file (for every read)
    classes: tuple[str, ...]


MNIST = IdxDataset(
    name="mnist", title="MNIST", folder="MNIST",
    mirrors=("https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/"),
    gz_md5={
        "train-images-idx3-ubyte": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte": "ec29112dd5afa0611ce80d1b7f02629c",
    },
    content_md5={
        "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
        "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
        "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
        "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
    },
    classes=tuple(str(d) for d in range(10)),
)

FASHION_MNIST = IdxDataset(
    name="fashion-mnist", title="Fashion-MNIST", folder="FashionMNIST",
    mirrors=("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
    gz_md5={
        "train-images-idx3-ubyte": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "train-labels-idx1-ubyte": "25c81989df183df01b3e8a0aad5dffbe",
        "t10k-images-idx3-ubyte": "bef4ecab320f06d8554ea6380940ec79",
        "t10k-labels-idx1-ubyte": "bb300cfdad3c16e7a12a480ee83cd310",
    },
    content_md5={
        "train-images-idx3-ubyte": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
        "train-labels-idx1-ubyte": "9018921c3c673c538a1fc5bad174d6f9",
        "t10k-images-idx3-ubyte": "8181f5470baa50b63fa0f6fddb340f0a",
        "t10k-labels-idx1-ubyte": "15d484375f8d13e6eb1aabb0c3f46965",
    },
    classes=("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
             "Ankle boot"),
)


def where_to_put(root: Path, dataset: IdxDataset, split: str | None = None) -> str:
    """The advice every missing-file error ends with."""
    stems = FILES[split] if split else FILES["train"] + FILES["test"]
    return (f"Put the official {dataset.title} files ({', '.join(s + '[.gz]' for s in stems)}) directly in "
            f"{root} or in {root / dataset.folder / 'raw'}, e.g. from {dataset.mirrors[0]}, or let "
            f"`zoo generate ... --data-root {root} --download` fetch them (in Python: "
            f"get_source({dataset.name!r}, root, download=True)).")


def locate(root: str | Path, dataset: IdxDataset, stem: str) -> Path | None:
    """The first existing copy of ``stem`` in the accepted layouts (uncompressed first), or None."""
    root = Path(root)
    for folder in (root, root / dataset.folder / "raw"):
        for name in (stem, stem + ".gz"):
            if (folder / name).is_file():
                return folder / name
    return None


def holds_split(folder: Path, dataset: IdxDataset, split: str) -> bool:
    """Whether ``folder`` holds ``dataset``'s ``split`` in an accepted layout, its labels the official ones
    (MNIST and Fashion-MNIST share every file name)."""
    paths = [locate(folder, dataset, stem) for stem in FILES[split]]
    if None in paths:
        return False
    try:
        load_idx(paths[1], md5=dataset.content_md5[FILES[split][1]], ndim=1)
    except DataError:
        return False
    return True


def read_split(root: str | Path, split: str, dataset: IdxDataset = MNIST, verify: bool = True) -> OfficialSplit:
    """Official split "train" or "test": images uint8 [N, 28, 28, 1], labels int64 [N].

    ``verify=False`` skips the content checksums (for non-official variants); the provenance
    records ``verified: false`` for such files.
    """
    root = Path(root)
    paths = [locate(root, dataset, stem) for stem in FILES[split]]
    if None in paths:
        missing = [s for s, p in zip(FILES[split], paths) if p is None]
        found = use_instead(folders_below(root, lambda folder: holds_split(folder, dataset, split)),
                            f"official {dataset.title} {split} files")
        raise DataError(f"{dataset.title} {split} split not found under {root}: no {', '.join(missing)} "
                        f"(.gz or uncompressed) in {root} or {root / dataset.folder / 'raw'}. "
                        + (found or where_to_put(root, dataset, split)))
    images, labels = (
        load_idx(path, md5=dataset.content_md5[stem] if verify else None, ndim=ndim)
        for path, stem, ndim in zip(paths, FILES[split], (3, 1))
    )
    if images.array.shape[1:] != (28, 28):
        raise DataError(f"{paths[0]}: images of shape {images.array.shape[1:]}, expected 28x28 for {dataset.title}. "
                        + REDOWNLOAD)
    label_array = check_labels(labels.array, len(images.array), len(dataset.classes), paths[1],
                               f"{paths[0].name} and {paths[1].name} must be the {dataset.title} {split} files. "
                               + REDOWNLOAD)
    return OfficialSplit(images.array[..., None], label_array, [images.record, labels.record])


def download(root: str | Path, dataset: IdxDataset = MNIST, splits=("train", "test")) -> dict[str, str]:
    """Fetch the missing .gz files of ``splits`` into ``root`` (flat layout); return {file: URL}.

    Files already present in an accepted layout are left alone (they are verified when read).
    Offline, or when every mirror fails, raises DataError saying where to put the files by hand.
    """
    root = Path(root)
    fetched = {}
    for split in splits:
        for stem in FILES[split]:
            if locate(root, dataset, stem) is None:
                urls = [mirror + stem + ".gz" for mirror in dataset.mirrors]
                fetched[stem + ".gz"] = download_file(urls, root / (stem + ".gz"), dataset.gz_md5[stem],
                                                      where_to_put(root, dataset))
    return fetched


class IdxSource(ImageSource):
    """MNIST or Fashion-MNIST with the paper's 55K / 5K / 10K splits."""

    shape = (28, 28, 1)

    def __init__(self, root: str | Path, dataset: IdxDataset = MNIST, verify: bool = True,
                 holdout: HoldOut = HoldOut(last=5_000)):
        super().__init__(holdout)
        self.root, self.dataset, self.verify = Path(root), dataset, verify
        self.name = dataset.name

    def read_official(self, official: str) -> OfficialSplit:
        return read_split(self.root, official, self.dataset, self.verify)

    def describe(self) -> dict:
        return {"root": str(self.root), "mirrors": list(self.dataset.mirrors), "classes": list(self.dataset.classes),
                "checksums": "MD5 of the uncompressed IDX files" if self.verify else "not verified"}
