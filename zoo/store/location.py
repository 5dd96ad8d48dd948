"""Where a store lives: a local folder, or (for reading) any fsspec URL.

Labs share stores as data sets, so a store can be read straight from object storage or a web
server (``s3://``, ``gs://``, ``https://``, ``file://``, ``memory://``: whatever fsspec and its
plug-ins reach). Zarr opens such URLs itself; the manifest and ``networks.parquet`` are read
through fsspec. Stores are written to local folders only (generate, then upload).
"""

from __future__ import annotations

from pathlib import Path

from .format import StoreError


def is_url(root) -> bool:
    return isinstance(root, str) and "://" in root


class UrlRoot:
    """A read-only, ``pathlib``-like handle on a folder behind an fsspec URL."""

    def __init__(self, url: str, _fs=None, _path: str | None = None):
        self.url = url.rstrip("/")
        if _fs is None:
            import fsspec

            try:
                _fs, _path = fsspec.core.url_to_fs(self.url)
            except (ImportError, ValueError) as exc:  # unknown protocol, or its plug-in is not installed
                raise StoreError(f"cannot open {url}: {exc}") from exc
        self.fs, self.path = _fs, _path.rstrip("/") or "/"

    def __truediv__(self, name: str) -> "UrlRoot":
        return UrlRoot(f"{self.url}/{name}", self.fs, f"{self.path}/{name}")

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"UrlRoot({self.url!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, UrlRoot) and other.url == self.url

    def __hash__(self) -> int:
        return hash(self.url)

    @property
    def name(self) -> str:
        return self.url.rsplit("/", 1)[-1]

    def resolve(self) -> "UrlRoot":
        return self

    def exists(self) -> bool:
        return self.fs.exists(self.path)

    def read_bytes(self) -> bytes:
        return self.fs.cat_file(self.path)

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def total_size(self) -> int:
        """Bytes of every file below this folder."""
        return int(self.fs.du(self.path, total=True))


def store_root(root: str | Path | UrlRoot) -> Path | UrlRoot:
    """``root`` as a :class:`~pathlib.Path` (local folder) or a :class:`UrlRoot` (fsspec URL)."""
    if isinstance(root, (Path, UrlRoot)):
        return root
    return UrlRoot(root) if is_url(root) else Path(root)


def require_local(root, action: str) -> Path:
    """``root`` as a local folder, or a clear error for a URL (stores are written locally)."""
    if is_url(root) or isinstance(root, UrlRoot):
        raise StoreError(f"cannot {action} {root}: stores are written to local folders only; "
                         f"write it locally, then upload the folder (it is plain files)")
    return Path(root)
