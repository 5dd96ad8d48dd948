"""Checks of command options, shared by ``zoo generate`` and ``zoo train``: a bad value is refused
with the flag's name before any store or run directory is created, and a resume with other
settings than the interrupted work's is refused with every difference named."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

# A val split of fewer networks chooses a learning rate or a best epoch mostly by chance: `zoo
# generate` warns when it plans one, `zoo train` when it chooses on one.
MIN_SELECTION_NETWORKS = 50
# A classifier zoo's val split is counted by runs: the checkpoints of one run are alike (one
# initialization, one data order), so 149 checkpoints of 1 run are one example, not 149. Below 5
# runs (the ci pipelines' 5 of 40) the choice follows that run's quirks.
MIN_SELECTION_RUNS = 5


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``1 network``, ``2 networks`` (``nouns``: an irregular plural)."""
    return f"{count} {noun if count == 1 else (nouns or noun + 's')}"


def require_writable_folder(flag: str, path) -> None:
    """ValueError unless ``path`` is a folder this user can write in, or one that can be created
    (its nearest existing ancestor is a folder this user can write in). Checked before any work,
    so a file, a read-only folder or a read-only file system costs nothing and leaves nothing.
    URLs (``s3://...``) are left to their file system."""
    if "://" in str(path):
        return
    path = Path(path)
    existing = _nearest_existing(path)
    if not existing.is_dir():
        if existing == path:
            raise ValueError(f"{flag} {path} is a file, not a folder: name a new folder or an existing one")
        raise ValueError(f"{flag} {path}: {existing} is a file, so no folder can be made below it; name another "
                         f"folder")
    _require_write_access(flag, path, existing)


def require_writable_file(flag: str, path) -> None:
    """ValueError unless the file ``path`` can be written: its folder exists and is writable, and the
    file, if it exists, is not a folder and is writable (before any work, as above)."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{flag} {path} is a folder: name a file, e.g. {path / 'figure.png'}")
    if not path.parent.is_dir():
        raise ValueError(f"{flag} {path}: the folder {path.parent} does not exist (create it first)")
    _require_write_access(flag, path, path if path.exists() else path.parent)


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        try:
            if candidate.exists():
                return candidate
        except OSError:  # e.g. an ancestor this user may not list
            return candidate
    return Path(".")


def _require_write_access(flag: str, path: Path, existing: Path) -> None:
    error = _write_probe(existing)
    if error is not None:
        where = "" if existing == path else " (where it would be created)"
        raise ValueError(f"{flag} {path}: {existing}{where} is not writable ({error.strerror or error}: permissions, "
                         f"or a read-only file system); choose a place you can write")


def _write_probe(existing: Path) -> OSError | None:
    """Whether this process can write ``existing`` (a folder: create a file in it; a file: open it to
    append), found by trying: permission bits do not stop root, and read-only mounts, ACLs and special
    file systems say no only when asked. The probe file is removed at once; a file opened to append
    is left as it was. None: it can."""
    try:
        if existing.is_dir():
            fd, probe = tempfile.mkstemp(prefix=".zoo-write-probe-", dir=existing)
            os.close(fd)
            os.unlink(probe)
        else:
            with open(existing, "ab"):
                pass
    except OSError as exc:
        return exc
    return None


def require_at_least(bounds: dict[str, tuple[float | None, float]]) -> None:
    """``{flag: (value, least)}``: ValueError for the first value below its bound (None: unset)."""
    for flag, (value, least) in bounds.items():
        if value is not None and value < least:
            raise ValueError(f"{flag} must be at least {least}, got {value}")


def require_positive(flag: str, value: float | None) -> None:
    """ValueError unless ``value`` is unset or > 0 (NaN included)."""
    if value is not None and not value > 0:
        raise ValueError(f"{flag} must be positive, got {value}")


def settings_diff(stored, asked, prefix: str = "", labels: tuple[str, str] = ("store", "asked")) -> list[str]:
    """``key: <labels[0]> stored, <labels[1]> asked`` for every leaf where two nested settings dicts differ."""
    if isinstance(stored, dict) and isinstance(asked, dict):
        lines = []
        for key in list(stored) + [k for k in asked if k not in stored]:
            lines += settings_diff(stored.get(key), asked.get(key), f"{prefix}{key}.", labels)
        return lines
    return [] if stored == asked else [f"{prefix.rstrip('.')}: {labels[0]} {stored!r}, {labels[1]} {asked!r}"]


# ------------------------------------------------------------------------------------ memory
# The default --max-memory: a fixed size, not a fraction of the memory free when a command starts,
# because the budget decides whether a split is held or streamed and how large a shuffle window is,
# which decides a training's data order: the same command must train the same way on any machine
# and at any moment. 4 GiB runs beside other work on a laptop and holds small zoos whole.
DEFAULT_MAX_MEMORY = 4 * 2**30
# What a `zoo` process holds before it reads any network: the interpreter, PyTorch, pyarrow, zarr,
# the project's modules and matplotlib for a run's figures (measured: ~320 MiB peak after the
# imports of `zoo train`, and 574 MiB peak for a whole training whose data, model and activations
# were counted at 30 MiB: tests/test_memory_gaps.py), with room for the allocators' slack.
RUNTIME_BYTES = 640 * 2**20
_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMGT]?)(?:I?B)?\s*", re.IGNORECASE)


def parse_size(text: str | int, flag: str = "--max-memory") -> int:
    """Bytes of a size written ``8G``, ``512M``, ``1.5GiB``, ``4096`` (binary units: ``G`` is 2**30).
    ValueError naming ``flag`` for anything else, or for a size below one byte."""
    if isinstance(text, int):
        size = text
    else:
        match = _SIZE.fullmatch(str(text))
        if match is None:
            raise ValueError(f"{flag} {text!r} is not a size: write e.g. 8G, 512M, 1.5G or a number of bytes")
        size = int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    if size < 1:
        raise ValueError(f"{flag} must be at least one byte, got {text!r}")
    return size


def format_size(size: int) -> str:
    """``size`` bytes for people: ``4.0 GiB``, ``420 MiB``, ``12 KiB``."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            value = size / scale
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{size} B"


def require_memory(flag: str, budget: int, needs: dict[str, int], what: str) -> None:
    """ValueError in one line when ``budget`` bytes cannot hold ``needs`` (``{what it is: bytes}``,
    the least ``what`` holds at once), saying the minimum and what it is made of."""
    least = sum(needs.values())
    if budget < least:
        parts = ", ".join(f"{name} {format_size(size)}" for name, size in needs.items())
        # a budget under a MiB is a unit left out (``--max-memory 8`` is 8 bytes), never a real budget
        unit = f" (a size without a unit counts bytes: write e.g. {budget}G)" if budget < 2**20 else ""
        raise ValueError(f"{flag} {format_size(budget)} is too small: {what} needs at least {format_size(least)} "
                         f"({parts}); raise {flag}{unit}")
