"""Checksums of the files the readers consume, for verification and for the store manifest."""

from __future__ import annotations

import hashlib
from pathlib import Path

from .errors import DataError


def md5_hex(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_md5(data: bytes, expected: str | None, path: Path, what: str, hint: str) -> bool:
    """Raise if ``data`` does not hash to ``expected``; return whether a check was made.

    ``what`` names the checked bytes (e.g. "uncompressed content"), ``hint`` says how to recover.
    """
    if expected is None:
        return False
    actual = md5_hex(data)
    if actual != expected:
        raise DataError(f"{path}: MD5 of the {what} is {actual}, expected {expected}: the file is "
                        f"corrupt or not the official release. {hint}")
    return True


def file_record(path: Path, stored: bytes, content: bytes | None = None, verified: bool = False) -> dict:
    """Manifest entry for one file read: size and SHA-256 as stored, MD5 of the decoded content.

    The content MD5 is the one that identifies a release when the stored file was recompressed
    (e.g. a re-gzipped MNIST file), so both are kept.
    """
    content = stored if content is None else content
    return {
        "path": str(path),
        "name": path.name,
        "bytes": len(stored),
        "sha256": sha256_hex(stored),
        "content_md5": md5_hex(content),
        "content_bytes": len(content),
        "verified": verified,
    }


def read_file(path: Path, hint: str) -> bytes:
    """All bytes of ``path``, or a DataError that says what to do when it is missing."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found. {hint}")
    return path.read_bytes()
