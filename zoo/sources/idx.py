"""Reader for the IDX format of MNIST-like data sets, gzip-compressed or raw.

IDX layout (big-endian): two zero bytes, a type code, the number of dimensions ``d``, then ``d``
uint32 sizes, then the data. Compression is recognised by the gzip magic bytes, not by the file
name, since renamed and recompressed copies are common. Every way a file can be bad (missing,
not gzip after all, gzip stream cut short, wrong magic, wrong number of dimensions, fewer or more
data bytes than the header announces, checksum mismatch) raises :class:`DataError`.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import DataError
from .integrity import check_md5, file_record, read_file

GZIP_MAGIC = b"\x1f\x8b"
DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
REDOWNLOAD = "Delete it and download the data set again (or copy a good file in its place)."


@dataclass(frozen=True)
class IdxFile:
    """A decoded IDX file and the manifest record of the bytes it came from."""

    array: np.ndarray
    record: dict


def load_idx(path: str | Path, *, md5: str | None = None, ndim: int | None = None,
             missing_hint: str = "") -> IdxFile:
    """Read ``path``; ``md5`` is checked against the *uncompressed* IDX bytes.

    ``ndim`` is the number of dimensions the caller needs (3 for images, 1 for labels).
    ``missing_hint`` is appended to the error for a missing file (where the file should come from).
    """
    path = Path(path)
    stored = read_file(path, missing_hint or "Check the path, or download the data set.")
    content = _decompress(stored, path) if stored[:2] == GZIP_MAGIC else stored
    verified = check_md5(content, md5, path, "uncompressed content", REDOWNLOAD)
    array = parse_idx(content, path, ndim=ndim)
    return IdxFile(array, file_record(path, stored, content, verified))


def read_idx(path: str | Path, *, md5: str | None = None, ndim: int | None = None) -> np.ndarray:
    """The array stored in an IDX file (native byte order); see :func:`load_idx`."""
    return load_idx(path, md5=md5, ndim=ndim).array


def parse_idx(content: bytes, path: Path | str = "<bytes>", *, ndim: int | None = None) -> np.ndarray:
    """Decode uncompressed IDX bytes; ``path`` only names the source in error messages."""
    if len(content) < 4:
        raise DataError(f"{path}: truncated IDX file: {len(content)} bytes, not even a header. {REDOWNLOAD}")
    zero, code, dims = struct.unpack(">HBB", content[:4])
    if zero != 0 or code not in DTYPES:
        raise DataError(f"{path}: not an IDX file (magic bytes {content[:4].hex()}; expected 0000 then a "
                        f"type code in {sorted(hex(c) for c in DTYPES)}). {REDOWNLOAD}")
    if ndim is not None and dims != ndim:
        raise DataError(f"{path}: IDX file has {dims} dimensions, expected {ndim}: wrong file "
                        f"(images and labels swapped?) or corrupt header. {REDOWNLOAD}")
    header = 4 + 4 * dims
    if len(content) < header:
        raise DataError(f"{path}: truncated IDX header ({len(content)} of {header} bytes). {REDOWNLOAD}")
    shape = struct.unpack(f">{dims}I", content[4:header])
    dtype = np.dtype(DTYPES[code])
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    found = len(content) - header
    if found != expected:
        problem = "truncated" if found < expected else "corrupt (trailing bytes)"
        raise DataError(f"{path}: {problem} IDX file: header announces shape {shape} of {dtype.name} "
                        f"({expected} data bytes) but {found} follow. {REDOWNLOAD}")
    array = np.frombuffer(content, dtype=dtype, offset=header).reshape(shape)
    return array.astype(dtype.newbyteorder("="), copy=True)


def _decompress(stored: bytes, path: Path) -> bytes:
    try:
        return gzip.decompress(stored)
    except EOFError as err:  # the stream ends before its end-of-stream marker
        raise DataError(f"{path}: truncated gzip stream ({err}). {REDOWNLOAD}") from err
    except (OSError, zlib.error) as err:  # BadGzipFile (an OSError), bad CRC, bad deflate data
        raise DataError(f"{path}: corrupt gzip data ({err}). {REDOWNLOAD}") from err
