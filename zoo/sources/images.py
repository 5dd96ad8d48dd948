"""Image data sets: the common split type and the official-split -> paper-split logic.

Every image source reads two *official* splits ("train", "test") from disk; the paper's
validation split is held out of the official train split by a deterministic :class:`HoldOut`
rule (MNIST/Fashion-MNIST: the last 5,000 of the 60,000; CIFAR-10: the last 5,000 of the 50,000),
and the official test split is the test split. ``item_ids`` always index the official split file
the item came from, so an INR in the store can be traced back to its image.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field

import numpy as np
import torch

from .base import SPLITS, Source, check_split
from .errors import DataError
from .grids import image_grid, image_grid_manifest, pixel_targets


@dataclass(frozen=True)
class ImageSplit:
    """One paper split of an image data set.

    ``images`` float32 [N, H, W, C] in [0, 1]; ``labels`` int64 [N]; ``item_ids`` int64 [N], the
    index of each item within the official split file ``official_split`` ("train" or "test").
    """

    images: np.ndarray
    labels: np.ndarray
    item_ids: np.ndarray
    source: str
    split: str
    official_split: str

    def __post_init__(self):
        n = len(self.images)
        if self.images.ndim != 4 or self.images.dtype != np.float32:
            raise ValueError(f"images must be float32 [N, H, W, C], got {self.images.dtype} {self.images.shape}")
        if self.labels.shape != (n,) or self.item_ids.shape != (n,):
            raise ValueError(f"{n} images but labels {self.labels.shape} and item_ids {self.item_ids.shape}")

    def __len__(self) -> int:
        return len(self.images)


@dataclass(frozen=True)
class OfficialSplit:
    """An official split as read from disk, before scaling: ``images`` uint8 [N, H, W, C]."""

    images: np.ndarray
    labels: np.ndarray
    files: list[dict] = field(default_factory=list)
    item_ids: np.ndarray | None = None  # what the items' ``item_ids`` index; default: position in this split


def check_labels(labels, count: int, classes: int, path, hint: str) -> np.ndarray:
    """``labels`` as int64 [count] in 0..classes-1, or a DataError naming the file and what is wrong."""
    if labels is None:
        raise DataError(f"{path}: no labels. {hint}")
    array = np.asarray(labels)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise DataError(f"{path}: labels must be a list of integers, got {array.dtype} {array.shape}. {hint}")
    if len(array) != count:
        raise DataError(f"{path}: {count} images but {len(array)} labels: a file is cut short or does not "
                        f"belong with the other. {hint}")
    bad = np.flatnonzero((array < 0) | (array >= classes))
    if bad.size:
        raise DataError(f"{path}: label {array[bad[0]]} of item {bad[0]} is out of range 0..{classes - 1} "
                        f"({bad.size} such labels). {hint}")
    return array.astype(np.int64)


@dataclass(frozen=True)
class HoldOut:
    """Which items of the official train split become the validation split.

    ``last=k``: the last k items (for files in random order, e.g. MNIST). ``last_share=f``: the
    last ``round(f * n)`` of the n items read (for sources that may read only part of the official
    train split, e.g. two of CIFAR-10's five batches). ``every=k``: items whose index is a multiple
    of k (for files sorted by class, so that validation covers every class).
    """

    last: int = 0
    every: int = 0
    last_share: float = 0.0

    def __post_init__(self):
        if sum(rule > 0 for rule in (self.last, self.every, self.last_share)) != 1 or self.last_share >= 1:
            raise ValueError("HoldOut needs exactly one of last=k, every=k (k > 0) or last_share=f (0 < f < 1)")

    def mask(self, n: int) -> np.ndarray:
        """Boolean [n]: True for validation items."""
        index = np.arange(n)
        if self.every:
            return index % self.every == 0
        last = round(self.last_share * n) if self.last_share else self.last
        if last >= n:
            raise ValueError(f"cannot hold out the last {last} of only {n} train items")
        return index >= n - last

    def describe(self) -> str:
        if self.last_share:
            val = f"the last {self.last_share:.0%} (rounded) of the official train items read"
        elif self.last:
            val = f"the last {self.last} items of the official train split"
        else:
            val = f"the items of the official train split whose index is a multiple of {self.every}"
        return f"val = {val}, train = the rest; test = official test"


def official_split_of(split: str) -> str:
    """The official split a paper split is read from: val is held out of the official train split."""
    return "test" if split == "test" else "train"


class ImageSource(Source):
    """An image data set read from official split files; subclasses implement :meth:`read_official`."""

    name: str
    shape: tuple[int, int, int]  # H, W, C
    pixel_scale: float = 255.0   # stored value that maps to 1.0

    def __init__(self, holdout: HoldOut):
        self.holdout = holdout
        self._official: dict[str, OfficialSplit] = {}
        self._splits: dict[str, ImageSplit] = {}

    @abstractmethod
    def read_official(self, official: str) -> OfficialSplit:
        """Read official split "train" or "test"; raise DataError if missing or bad."""

    def describe(self) -> dict:
        """Source-specific provenance (URLs, classes, ...), merged into :meth:`provenance`."""
        return {}

    def official(self, official: str) -> OfficialSplit:
        if official not in self._official:
            data = self.read_official(official)
            if data.images.shape[1:] != self.shape:
                raise DataError(f"{self.name}: read images of shape {data.images.shape[1:]}, expected {self.shape}")
            self._official[official] = data
        return self._official[official]

    def split(self, split: str) -> ImageSplit:
        check_split(split)
        if split not in self._splits:
            official = official_split_of(split)
            data = self.official(official)
            n = len(data.labels)
            keep = np.ones(n, bool) if split == "test" else self.holdout.mask(n) == (split == "val")
            ids = np.arange(n) if data.item_ids is None else data.item_ids
            self._splits[split] = ImageSplit(
                # one pass, the same bits as astype(float32) then dividing (uint8 converts exactly)
                images=np.divide(data.images[keep], np.float32(self.pixel_scale), dtype=np.float32),
                labels=data.labels[keep].astype(np.int64),
                item_ids=ids[keep].astype(np.int64),
                source=self.name, split=split, official_split=official,
            )
        return self._splits[split]

    def coords(self) -> torch.Tensor:
        return image_grid(*self.shape[:2])

    def targets(self, split: str) -> torch.Tensor:
        """[N, H*W, C]; shares memory with the cached split's images, so do not modify it in place."""
        return pixel_targets(self.split(split).images)

    def files_read(self) -> list[dict]:
        """The records of the files read so far, each file once."""
        records = {}
        for official in sorted(self._official):
            for record in self._official[official].files:
                records.setdefault((record.get("path", record.get("name")), record.get("sha256")), record)
        return list(records.values())

    def provenance(self) -> dict:
        """Everything read so far: call it after reading the splits the store is made from."""
        return {
            "source": self.name,
            "kind": "image",
            "image_shape": list(self.shape),
            "pixel_values": f"stored value / {self.pixel_scale:g}, float32 in [0, 1]",
            "split_rule": self.holdout.describe(),
            "item_ids": "index of the item within the official split file it was read from (official_split)",
            "official_split": {split: official_split_of(split) for split in SPLITS},
            "counts": {s: len(d) for s, d in self._splits.items()},
            "official_splits_read": sorted(self._official),
            "files": self.files_read(),
            "coordinates": image_grid_manifest(*self.shape[:2]),
            **self.describe(),
        }
