"""Native kernels from C sources: compiled on first use with the system compiler, cached per user.

Used by the fitting step (:mod:`zoo.fit.native`) and the DWS accelerator (:mod:`dws.nn.fast.native`). A
library is compiled with ``$CC`` (else ``cc``, ``gcc`` or ``clang``) into ``$ZOO_CACHE_DIR/native``
(default ``~/.cache/weightzoo/native``), named by a hash of the source, the flags and the compiler
version, and written to a temporary file first then renamed, so parallel workers may race to build
it. A new build removes the cache's builds of older versions of the same source. The kernels are
written for x86-64 with AVX2 and FMA. Where that, a compiler or a successful build is missing, or
``ZOO_NATIVE=0`` is set, :func:`load` returns ``None`` and the caller runs its PyTorch path
(one warning when something is missing; none when switched off).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import Sequence

from . import cpuinfo

BASE_FLAGS = ("-O3", "-mavx2", "-mfma", "-fno-math-errno", "-std=gnu11", "-shared", "-fPIC")


def cpu_supported() -> bool:
    """x86-64 Linux with AVX2 and FMA (what the kernels are written for)."""
    return platform.machine().lower() in ("x86_64", "amd64") and {"avx2", "fma"} <= cpuinfo.flags()


def switched_off() -> bool:
    return os.environ.get("ZOO_NATIVE", "1") == "0"


def compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        path = shutil.which(name) if name else None
        if path:
            return path
    return None


def cache_dir() -> Path:
    root = os.environ.get("ZOO_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "weightzoo")
    return Path(root) / "native"


def build(source: Path, flags: Sequence[str], cc: str) -> Path:
    """Compile ``source`` into the cache (or reuse the cached build); raises RuntimeError on failure."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    key = hashlib.sha256(source.read_bytes() + " ".join([cc, *version, *flags]).encode()).hexdigest()[:16]
    target = cache_dir() / f"{source.stem}-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run([cc, *flags, str(source), "-o", tmp], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{cc} failed:\n{done.stderr.strip()}")
        os.replace(tmp, target)  # atomic: a concurrent builder's identical file is simply replaced
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    for stale in target.parent.glob(f"{source.stem}-*.so"):  # builds of older sources (processes that
        if stale != target:                                  # still have one loaded keep their mapping)
            stale.unlink(missing_ok=True)
    return target


def load(source: Path, flags: Sequence[str], what: str, fallback: str) -> ctypes.CDLL | None:
    """The compiled ``source``, or ``None`` (see the module doc). ``what`` names the kernels and
    ``fallback`` what runs instead, for the warnings."""
    if switched_off() or not cpu_supported():
        return None
    cc = compiler()
    if cc is None:
        warnings.warn(f"no C compiler (cc, gcc, clang or $CC) found: {fallback} runs instead of the {what}; "
                      "install one (e.g. gcc) for them, or set ZOO_NATIVE=0 to silence this", stacklevel=3)
        return None
    try:
        return ctypes.CDLL(str(build(source, flags, cc)))
    except (OSError, RuntimeError, subprocess.SubprocessError) as err:
        warnings.warn(f"{what} unavailable, {fallback} runs instead: {err}", stacklevel=3)
        return None
