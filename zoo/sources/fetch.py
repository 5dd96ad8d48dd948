"""Downloads over urllib with a progress bar, MD5 verification and mirror fallback.

A download is written to ``<dest>.part`` and renamed only once its checksum matched, so an
interrupted or corrupted transfer never leaves a file the readers would pick up.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import urllib.request
from pathlib import Path
from typing import Sequence

from tqdm import tqdm

from .errors import DataError

CHUNK = 1 << 16
TIMEOUT_S = 60


def download_file(urls: Sequence[str], dest: Path, md5: str | None, manual_hint: str) -> str:
    """Fetch ``dest`` from the first of ``urls`` that answers with the expected MD5; return that URL.

    Every mirror is tried in order; when all fail the DataError lists each failure and ends with
    ``manual_hint`` (where to put the file by hand, for offline machines).
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    failures = []
    for url in urls:
        try:
            _fetch(url, dest, md5)
            return url
        except (OSError, http.client.HTTPException, DataError) as err:  # OSError covers URLError, timeouts
            failures.append(f"  {url}: {err}")
    raise DataError(f"could not download {dest.name}:\n" + "\n".join(failures) + f"\n{manual_hint}")


def _fetch(url: str, dest: Path, md5: str | None) -> None:
    part = dest.with_name(dest.name + ".part")
    digest = hashlib.md5()
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response, open(part, "wb") as out:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=dest.name) as bar:
                while chunk := response.read(CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
        if md5 is not None and digest.hexdigest() != md5:
            raise DataError(f"downloaded MD5 {digest.hexdigest()} != expected {md5}")
        os.replace(part, dest)
    finally:
        part.unlink(missing_ok=True)
