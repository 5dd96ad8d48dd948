"""Where a store lives: a local folder, or any fsspec URL that zarr can write to.

Labs share stores as data sets and clusters write them to object storage, so a store can be read
from and written to ``s3://``, ``gs://``, ``az://``, ``file://`` or ``memory://`` (read-only
protocols such as ``https://`` are read). Zarr opens such URLs itself; the manifest and the Parquet
files go through fsspec. A local folder is a :class:`~pathlib.Path`, a URL a :class:`UrlRoot`,
which answers the same few ``pathlib`` calls; the functions at the end do what ``Path`` has no
method for (replacing a file whole, removing a tree) on both.
"""

from __future__ import annotations

import functools
import os
import shutil
import uuid
from pathlib import Path

from .format import StoreError


def is_url(root) -> bool:
    return isinstance(root, UrlRoot) or (isinstance(root, str) and "://" in root)


# What to do about a URL whose server refuses or cannot be reached, per protocol (fsspec's plug-ins
# read their credentials and endpoints from these; docs/store-format.md, "Stores behind a URL")
CREDENTIAL_HINTS = {
    "s3": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, ~/.aws/credentials), AWS_ENDPOINT_URL "
          "for a server other than AWS (MinIO, Ceph), or FSSPEC_S3_ANON=true for a public bucket",
    "gs": "set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file, or run `gcloud auth "
          "application-default login`",
    "az": "set AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY",
}
ENDPOINT_HINTS = {
    "s3": "check the network and the endpoint: AWS_ENDPOINT_URL names an S3-compatible server (MinIO, Ceph; unset "
          "for AWS itself), AWS_DEFAULT_REGION the region",
}
_ALIASES = {"s3a": "s3", "gcs": "gs", "abfs": "az", "abfss": "az", "adl": "az"}
# exception classes of the fsspec plug-ins and their clients, by name (none of them is imported here)
_CREDENTIAL_ERRORS = {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
                      "UnauthorizedSSOTokenError", "TokenRetrievalError", "DefaultCredentialsError", "RefreshError",
                      "ClientAuthenticationError", "CredentialUnavailableError"}
_CONNECTION_ERRORS = {"EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError",
                      "ProxyConnectionError", "ClientConnectorError", "ClientConnectionError", "ServerTimeoutError",
                      "ServiceRequestError", "NoRegionError", "gaierror"}
_CLIENT_MODULES = ("botocore", "aiobotocore", "boto3", "s3fs", "gcsfs", "adlfs", "aiohttp", "google", "azure",
                   "fsspec", "requests", "urllib3")


def access_error(exc: BaseException, url: str | None = None, *, any_module: bool = True) -> StoreError | None:
    """A one-line :class:`StoreError` naming the fix, for the errors of a URL store whose server
    cannot be reached or does not accept this machine's credentials (None for any other error).

    ``any_module=False``: only exceptions raised by the fsspec plug-ins and their clients (botocore,
    aiohttp, google-auth, azure; for a caller that cannot tell a store's errors from others')."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    from_client = type(exc).__module__.split(".")[0] in _CLIENT_MODULES
    if not (any_module or from_client):
        return None
    protocol = url.split("://", 1)[0] if url and "://" in url else None
    protocol = _ALIASES.get(protocol, protocol)
    detail = (str(exc).strip().splitlines() or [""])[0][:200]
    where = f" {url}" if url else " the store"
    if names & _CREDENTIAL_ERRORS:
        problem = f"no usable credentials for{where} ({type(exc).__name__}: {detail})"
        hint = CREDENTIAL_HINTS.get(protocol, "configure the credentials of its fsspec plug-in")
    elif isinstance(exc, PermissionError) and (url or from_client):
        problem = f"access to{where} was refused ({detail or type(exc).__name__})"
        hint = ("check that the credentials found are valid and may read (and, to generate, write) it; "
                + CREDENTIAL_HINTS.get(protocol, "configure the credentials of its fsspec plug-in"))
    elif names & _CONNECTION_ERRORS or (isinstance(exc, (ConnectionError, TimeoutError)) and (url or from_client)):
        problem = f"cannot reach the server of{where} ({type(exc).__name__}: {detail})"
        hint = ENDPOINT_HINTS.get(protocol, "check the network and the URL")
    else:
        return None
    return StoreError(f"{problem}; {hint}")


def _reporting_access(method):
    """A :class:`UrlRoot` method whose credential and connection errors become :func:`access_error`'s."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except StoreError:
            raise
        except Exception as exc:
            error = access_error(exc, self.url)
            if error is None:
                raise
            raise error from exc

    return wrapper


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

    @_reporting_access
    def exists(self) -> bool:
        # fsspec file systems cache listings; zarr and other processes write behind this one's back
        self.fs.invalidate_cache()
        return self.fs.exists(self.path)

    @_reporting_access
    def read_bytes(self) -> bytes:
        return self.fs.cat_file(self.path)

    def read_text(self) -> str:
        return self.read_bytes().decode()

    @_reporting_access
    def write_bytes(self, data: bytes) -> None:
        """Replace the file whole: an object store PUTs the object in one request (readers see the
        old object or the new one); a local file system gets a temporary file renamed over it."""
        if _is_local(self.fs):
            tmp = f"{self.path}.tmp-{uuid.uuid4().hex}"
            self.fs.pipe_file(tmp, data)
            self.fs.mv(tmp, self.path)
        else:
            self.fs.pipe_file(self.path, data)

    @_reporting_access
    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self.fs.rm_file(self.path)
        except FileNotFoundError:
            if not missing_ok:
                raise

    @_reporting_access
    def mkdir(self, parents: bool = True, exist_ok: bool = True) -> None:
        """A folder where the file system has folders (object stores have none: a no-op)."""
        self.fs.makedirs(self.path, exist_ok=True)

    @_reporting_access
    def is_empty(self) -> bool:
        self.fs.invalidate_cache()
        try:
            return not self.fs.ls(self.path, detail=False)
        except FileNotFoundError:
            return True

    @_reporting_access
    def remove_tree(self) -> None:
        if self.exists():
            self.fs.rm(self.path, recursive=True)

    @_reporting_access
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

    @_reporting_access
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
        try:
            found = fs.cat([u.path for u in urls], on_error="return")
        except Exception as exc:
            error = access_error(exc, urls[0].url)
            if error is None:
                raise
            raise error from exc
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
