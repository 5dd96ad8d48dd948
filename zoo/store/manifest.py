"""Reading and atomically rewriting a store's ``manifest.json``."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

from .format import FORMAT_NAME, FORMAT_VERSION, MANIFEST, StoreError, StoreVersionError
from .location import require_local, store_root


def read_manifest(root) -> dict:
    """The manifest of the store at ``root`` (a folder or an fsspec URL), checked for its format."""
    path = store_root(root) / MANIFEST
    if not path.exists():
        raise StoreError(
            f"{root} is not a weight store: {MANIFEST} is missing "
            f"(was the generation started? `zoo generate ... --out {root}` creates it)"
        )
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise StoreError(f"{path} is not valid JSON ({exc}); the store is damaged") from exc
    if manifest.get("format") != FORMAT_NAME:
        raise StoreError(f"{path} does not describe a {FORMAT_NAME} (format={manifest.get('format')!r})")
    version = manifest.get("format_version")
    if not isinstance(version, int):
        raise StoreError(f"{path} has no integer format_version")
    if version > FORMAT_VERSION:
        raise StoreVersionError(
            f"{root} uses store format v{version}, but this weightzoo reads up to "
            f"v{FORMAT_VERSION}; upgrade weightzoo to read it"
        )
    return manifest


def write_manifest(root: str | Path, manifest: dict) -> None:
    """Replace the manifest atomically so a crash never leaves a half-written one."""
    root = require_local(root, "write the manifest of")
    # not tempfile.mkstemp: it creates the file 0600, and a store shared with other users must be
    # readable like its other files. os.open with 0666 lets the umask (and default ACLs) decide.
    tmp = root / f".manifest-{os.getpid()}-{uuid.uuid4().hex}.json"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(manifest, f, indent=2, sort_keys=False)
            f.write("\n")
        os.replace(tmp, root / MANIFEST)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
