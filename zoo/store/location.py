"""Where a store lives: a local folder, or any fsspec URL that zarr can write to.

Labs share stores as data sets and clusters write them to object storage, so a store can be read
from and written to ``s3://``, ``gs://``, ``az://``, ``file://`` or ``memory://`` (read-only
protocols such as ``https://`` are read). Zarr opens such URLs itself; the manifest and the Parquet
files go through fsspec. A local folder is a :class:`~pathlib.Path`, a URL a :class:`UrlRoot`,
which answers the same few ``pathlib`` calls; the functions at the end do what ``Path`` has no
method for (replacing a file whole, removing a tree) on both.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from .format import StoreError


def is_url(root) -> bool:
    return isinstance(root, UrlRoot) or (isinstance(root, str) and "://" in root)


class UrlRoot:
    """A ``pathlib``-like handle on a folder behind an fsspec URL."""

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

    @property
    def protocol(self) -> str:
        return self.url.split("://", 1)[0]

    def resolve(self) -> "UrlRoot":
        return self

    def exists(self) -> bool:
        # fsspec file systems cache listings; zarr and other processes write behind this one's back
        self.fs.invalidate_cache()
        return self.fs.exists(self.path)

    def read_bytes(self) -> bytes:
        return self.fs.cat_file(self.path)

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def write_bytes(self, data: bytes) -> None:
        """Replace the file whole: an object store PUTs the object in one request (readers see the
        old object or the new one); a local file system gets a temporary file renamed over it."""
        if _is_local(self.fs):
            tmp = f"{self.path}.tmp-{uuid.uuid4().hex}"
            self.fs.pipe_file(tmp, data)
            self.fs.mv(tmp, self.path)
        else:
            self.fs.pipe_file(self.path, data)

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self.fs.rm_file(self.path)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def mkdir(self, parents: bool = True, exist_ok: bool = True) -> None:
        """A folder where the file system has folders (object stores have none: a no-op)."""
        self.fs.makedirs(self.path, exist_ok=True)

    def is_empty(self) -> bool:
        self.fs.invalidate_cache()
        try:
            return not self.fs.ls(self.path, detail=False)
        except FileNotFoundError:
            return True

    def remove_tree(self) -> None:
        if self.exists():
            self.fs.rm(self.path, recursive=True)

    def sizes(self) -> dict[str, int | None] | None:
        """``{relative key: size in bytes (None: unknown)}`` of every file below this folder, or
        ``None`` when it cannot be listed (plain HTTP servers without index pages)."""
        prefix = self.path.rstrip("/") + "/"
        self.fs.invalidate_cache()
        try:
            listing = self.fs.find(self.path, detail=True)
        except (NotImplementedError, OSError, ValueError):
            return None
        return {p[len(prefix):]: info.get("size") for p, info in listing.items() if p.startswith(prefix)}

    def total_size(self) -> int:
        """Bytes of every file below this folder."""
        return int(self.fs.du(self.path, total=True))


def _is_local(fs) -> bool:
    from fsspec.implementations.local import LocalFileSystem

    return isinstance(fs, LocalFileSystem)


def store_root(root: str | Path | UrlRoot) -> Path | UrlRoot:
    """``root`` as a :class:`~pathlib.Path` (local folder) or a :class:`UrlRoot` (fsspec URL)."""
    if isinstance(root, (Path, UrlRoot)):
        return root
    return UrlRoot(root) if is_url(root) else Path(root)


def zarr_location(root: Path | UrlRoot) -> str:
    """What to hand zarr for ``root``: the URL, except ``file://``, which zarr's fsspec store writes
    without creating folders: that is a local path."""
    if isinstance(root, UrlRoot) and _is_local(root.fs):
        return root.path
    return str(root)


def put_file(target: Path | UrlRoot, data: bytes) -> None:
    """Replace ``target`` whole, so that a reader (or a rerun after a crash) never sees a part of it.

    A local file is written under a temporary name, then renamed. Not ``tempfile.mkstemp``: it
    creates the file 0600, and a store shared with other users must be readable like its other
    files; ``os.open`` with 0666 lets the umask (and default ACLs) decide."""
    if isinstance(target, UrlRoot):
        target.write_bytes(data)
        return
    tmp = target.parent / f".{target.name}-{os.getpid()}-{uuid.uuid4().hex}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove_tree(root: Path | UrlRoot) -> None:
    if isinstance(root, UrlRoot):
        root.remove_tree()
    elif root.exists():
        shutil.rmtree(root)


def is_empty(root: Path | UrlRoot) -> bool:
    if isinstance(root, UrlRoot):
        return root.is_empty()
    return not root.exists() or not any(root.iterdir())


def read_files(paths: list[Path | UrlRoot]) -> list[bytes | None]:
    """The bytes of each file (``None``: missing); URLs on one file system are fetched concurrently."""
    urls = [p for p in paths if isinstance(p, UrlRoot)]
    fetched = {}
    if urls:
        fs = urls[0].fs
        found = fs.cat([u.path for u in urls], on_error="return")
        for u in urls:
            value = found.get(u.path, FileNotFoundError(u.path))
            if isinstance(value, BaseException) and not isinstance(value, FileNotFoundError):
                raise value  # an I/O failure is not a missing file
            fetched[u.path] = None if isinstance(value, BaseException) else value
    out = []
    for p in paths:
        if isinstance(p, UrlRoot):
            out.append(fetched[p.path])
            continue
        try:
            out.append(p.read_bytes())
        except FileNotFoundError:
            out.append(None)
    return out
