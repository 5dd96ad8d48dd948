"""Folders below a data root that hold a data set: for the error that says a split is missing.

A data root of several data sets (``data/mnist``, ``data/fashion-mnist``, ``data/cifar-10``) is a common way
to point one folder too high; the error then names the folder to pass instead of only where to download.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable


def folders_below(root: Path, holds: Callable[[Path], bool], depth: int = 2) -> list[Path]:
    """The folders 1 to ``depth`` levels below ``root`` (hidden ones skipped) for which ``holds`` is true,
    nearest first; none inside another found (that one's layout already reaches it)."""
    found, level = [], [Path(root)]
    for _ in range(depth):
        level = sorted(sub for folder in level for sub in _subfolders(folder))
        new = [folder for folder in level if holds(folder)]
        found += new
        level = [folder for folder in level if folder not in new]
    return found


def _subfolders(folder: Path) -> list[Path]:
    try:
        return [sub for sub in folder.iterdir() if sub.is_dir() and not sub.name.startswith(".")]
    except OSError:  # unreadable: nothing below it to suggest
        return []


def use_instead(folders: list[Path], what: str) -> str:
    """The sentence naming them ("" where none)."""
    if not folders:
        return ""
    return f"The {what} are in {', '.join(map(str, folders))}: use --data-root {folders[0]}."
