"""A folder written whole or not at all: for commands that make a new store or layout from another
(``zoo import``, ``zoo export``, ``zoo derive``), where an error half way must leave nothing behind
and an older folder at the same place must survive until the new one is complete."""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def staged_folder(out) -> Iterator[Path]:
    """An empty folder that becomes ``out`` only when the ``with`` block succeeds: written under a
    temporary name beside it (same file system; the same final name inside, so a dataset card that
    names its folder names the right one), renamed into place at the end, replacing what ``out``
    held; removed on any error, leaving ``out`` as it was. Whether ``out`` may be replaced is the
    caller's to check first."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    holder = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    stage = holder / out.name
    stage.mkdir()
    try:
        yield stage
        if out.exists():
            os.replace(out, holder / ".replaced")
        os.replace(stage, out)
    finally:
        shutil.rmtree(holder, ignore_errors=True)
