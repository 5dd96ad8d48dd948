"""Reading and atomically rewriting a store's ``manifest.json``, which carries its own checksum.

The checksum (``checksum``: crc32c of the manifest's other keys as canonical JSON) is written with
every rewrite and checked on every read where present (stores written before format v2 have none),
so a bit flip that keeps the file valid JSON is caught like one in a chunk.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..cpuinfo import first_processor
from .checksum import crc32c
from .format import FORMAT_NAME, FORMAT_VERSION, MANIFEST, DamagedStoreError, StoreError, StoreVersionError
from .location import put_file, store_root

CHECKSUM_KEY = "checksum"


def manifest_checksum(manifest: dict) -> str:
    body = {k: v for k, v in manifest.items() if k != CHECKSUM_KEY}
    return crc32c(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def read_manifest(root) -> dict:
    """The manifest of the store at ``root`` (a folder or an fsspec URL), checked for its format
    and its checksum."""
    path = store_root(root) / MANIFEST
    if not path.exists():
        store = enclosing_store(root)
        if store is not None:
            raise StoreError(f"{root} is a folder inside the weight store {store}, not a store itself: pass {store}")
        raise StoreError(
            f"{root} is not a weight store: {MANIFEST} is missing "
            f"(was the generation started? `zoo generate ... --out {root}` creates it)"
        )
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DamagedStoreError(f"{path} is not valid JSON ({exc}); the store is damaged: restore "
                                f"{MANIFEST} from a copy") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise StoreError(f"{path} does not describe a {FORMAT_NAME} (format={found!r})")
    version = manifest.get("format_version")
    if not isinstance(version, int):
        raise StoreError(f"{path} has no integer format_version")
    if version > FORMAT_VERSION:
        raise StoreVersionError(
            f"{root} uses store format v{version}, but this weightzoo reads up to "
            f"v{FORMAT_VERSION}; upgrade weightzoo to read it"
        )
    stored = manifest.get(CHECKSUM_KEY)
    if stored is not None and stored != manifest_checksum(manifest):
        raise DamagedStoreError(
            f"{path} fails its crc32c checksum (recorded {stored}, computed {manifest_checksum(manifest)}): "
            f"it changed after it was written, so nothing it says about the store can be trusted; the "
            f"store is damaged: restore {MANIFEST} from a copy, or regenerate the store into a new --out"
        )
    return manifest


def enclosing_store(root, levels: int = 3):
    """The store ``root`` lies inside (its ``arrays/``, ``arrays/W1``, ``fragments/``, ...): the nearest
    of its ``levels`` parents that holds a manifest, or None."""
    root = store_root(root)
    parent = root
    for _ in range(levels):
        if isinstance(parent, Path):
            parent = parent.resolve().parent if parent.parent == parent else parent.parent
        else:
            url = parent.url.rsplit("/", 1)[0]
            if "://" not in url or url.endswith(":/"):
                return None
            parent = store_root(url)
        if (parent / MANIFEST).exists():
            return parent
        if isinstance(parent, Path) and parent.parent == parent:
            return None
    return None


def imported_from(manifest: dict) -> dict | None:
    """``{"layout", "path"}`` of a store ``zoo import`` made (``generation.import``), else None."""
    return (manifest.get("generation") or {}).get("import")


def write_manifest(root, manifest: dict) -> None:
    """Replace the manifest whole (never half-written), with its checksum."""
    manifest[CHECKSUM_KEY] = manifest_checksum(manifest)
    put_file(store_root(root) / MANIFEST, (json.dumps(manifest, indent=2, sort_keys=False) + "\n").encode())


SOFTWARE = ("weightzoo", "torch", "numpy", "zarr", "pyarrow")


def software_versions() -> dict[str, str]:
    """The versions of the packages that make a store (and Python's), as the manifest records them at
    creation (``software``)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in SOFTWARE:
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "not installed"
    found["python"] = platform.python_version()
    return found


#: the CPU flags that select floating-point code paths (vector widths, fused multiply-add, bf16)
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile")


def machine_description() -> dict:
    """The CPU that writes a store, as the manifest records it at creation (``machine``): the same command
    can make different floats on another CPU (the networks it fits, the statistics it computes, even of
    imported networks), so a differing content ID can be traced to it. From
    ``/proc/cpuinfo``'s first processor where there is one (vendor's name, family, model, the flags of
    ``CPU_FLAGS`` it has), else the platform's name."""
    import platform

    cpu: dict = {}
    for key, value in first_processor().items():
        if key in ("model name", "cpu family", "model"):
            cpu[key] = int(value) if value.isdigit() else value
        elif key == "flags":
            cpu["flags"] = [flag for flag in CPU_FLAGS if flag in value.split()]
    return {"cpu": cpu or {"machine": platform.machine() or "unknown"}, "os": platform.system()}
