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


# crc32c's polynomial, bit-reflected (Castagnoli), for combining checksums of consecutive parts
_POLYNOMIAL = 0x82F63B78


def crc32c_combine(crc_a: int, crc_b: int, length_b: int) -> int:
    """The crc32c of ``A + B`` from ``crc32c(A)``, ``crc32c(B)`` and ``len(B)``, as zlib's
    ``crc32_combine`` does for crc32: ``crc_a`` advanced over ``len(B)`` zero bytes by squaring the
    one-zero-bit operator (a 32 x 32 matrix over GF(2)), so that parts of a chunk file checksummed
    by different threads give the checksum of the whole file without another pass over it."""
    def times(matrix: list[int], vector: int) -> int:
        total, row = 0, 0
        while vector:
            if vector & 1:
                total ^= matrix[row]
            vector, row = vector >> 1, row + 1
        return total

    def square(matrix: list[int]) -> list[int]:
        return [times(matrix, column) for column in matrix]

    if length_b <= 0:
        return crc_a
    operator = square(square([_POLYNOMIAL] + [1 << n for n in range(31)]))  # four zero bits
    while length_b:  # the operator for 8 * 2^k zero bits, applied where bit k of length_b is set
        operator = square(operator)
        if length_b & 1:
            crc_a = times(operator, crc_a)
        length_b >>= 1
    return crc_a ^ crc_b
