"""crc32c checksums: of chunk files (appended by zarr's crc32c codec), and of every other file of a
store (Parquet files, Zarr metadata), which the manifest records along with its own."""

from __future__ import annotations

import google_crc32c
import numpy as np

ALGORITHM = "crc32c"


def crc32c(data) -> str:
    """The checksum of ``data`` (bytes or a numpy byte view) as 8 hex digits, as the manifest holds it."""
    if not isinstance(data, (bytes, np.ndarray)):
        data = bytes(data)
    return f"{google_crc32c.value(data):08x}"


def chunk_checksum_ok(blob: bytes) -> bool:
    """Whether a chunk file written through zarr's ``Crc32cCodec`` matches the checksum it ends with
    (the crc32c of the bytes before it, 4 bytes little-endian)."""
    if len(blob) < 4:
        return False
    body = np.frombuffer(blob, np.uint8)[:-4]
    return google_crc32c.value(body) == int.from_bytes(blob[-4:], "little")
