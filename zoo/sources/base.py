"""The interface every data source offers to the zoo generator."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

SPLITS = ("train", "val", "test")


class Source(ABC):
    """A named data set with the paper's train/val/test splits.

    What the fitting code needs per item is a target signal on a coordinate grid: ``coords()``
    is the grid shared by all items, ``targets(split)`` the per-item values on it. Splits are
    read lazily, so a source whose test files are present but train files missing still serves
    ``split("test")`` and fails with a clear DataError only when train or val is asked for.
    """

    name: str

    @abstractmethod
    def split(self, split: str) -> Any:
        """One split ("train", "val" or "test")."""

    def splits(self) -> dict[str, Any]:
        """All three splits, in the order train, val, test."""
        return {s: self.split(s) for s in SPLITS}

    @abstractmethod
    def coords(self) -> torch.Tensor:
        """[P, d_in] float32 coordinate grid shared by all items."""

    @abstractmethod
    def targets(self, split: str) -> torch.Tensor:
        """[N, P, d_out] float32 target values of the split's items on :meth:`coords`."""

    @abstractmethod
    def provenance(self) -> dict:
        """What the store manifest should record: files and checksums, URLs, rules, counts."""


def check_split(split: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    return split
