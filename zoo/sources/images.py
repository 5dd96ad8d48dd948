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

from .base import Source, check_split
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


@dataclass(frozen=True)
class HoldOut:
    """Which items of the official train split become the validation split.

    ``last=k``: the last k items (for files in random order, e.g. MNIST). ``every=k``: items whose
    index is a multiple of k (for files sorted by class, so that validation covers every class).
    """

    last: int = 0
    every: int = 0

    def __post_init__(self):
        if (self.last > 0) == (self.every > 0):
            raise ValueError("HoldOut needs exactly one of last=k or every=k (k > 0)")

    def mask(self, n: int) -> np.ndarray:
        """Boolean [n]: True for validation items."""
        index = np.arange(n)
        if self.last:
            if self.last >= n:
                raise ValueError(f"cannot hold out the last {self.last} of only {n} train items")
            return index >= n - self.last
        return index % self.every == 0

    def describe(self) -> str:
        val = (f"the last {self.last} items" if self.last
               else f"the items whose index is a multiple of {self.every}")
        return f"val = {val} of the official train split, train = the rest; test = official test"


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
            official = "test" if split == "test" else "train"
            data = self.official(official)
            n = len(data.labels)
            keep = np.ones(n, bool) if split == "test" else self.holdout.mask(n) == (split == "val")
            self._splits[split] = ImageSplit(
                images=data.images[keep].astype(np.float32) / np.float32(self.pixel_scale),
                labels=data.labels[keep].astype(np.int64),
                item_ids=np.flatnonzero(keep).astype(np.int64),
                source=self.name, split=split, official_split=official,
            )
        return self._splits[split]

    def coords(self) -> torch.Tensor:
        return image_grid(*self.shape[:2])

    def targets(self, split: str) -> torch.Tensor:
        """[N, H*W, C]; shares memory with the cached split's images, so do not modify it in place."""
        return pixel_targets(self.split(split).images)

    def provenance(self) -> dict:
        """Everything read so far: call it after reading the splits the store is made from."""
        return {
            "source": self.name,
            "kind": "image",
            "image_shape": list(self.shape),
            "pixel_values": f"stored value / {self.pixel_scale:g}, float32 in [0, 1]",
            "split_rule": self.holdout.describe(),
            "item_ids": "index of the item within its official split file (see official_split)",
            "counts": {s: len(d) for s, d in self._splits.items()},
            "official_splits_read": sorted(self._official),
            "files": [f for o in sorted(self._official) for f in self._official[o].files],
            "coordinates": image_grid_manifest(*self.shape[:2]),
            **self.describe(),
        }
