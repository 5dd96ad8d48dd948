"""The native CPU fitting kernels (``siren_step.c``): built on first use, loaded with ctypes.

Why C: a fitting step's three ``[32, 32] x [32, 784]`` matmuls per network ran at ~40-50 GFLOP/s in
MKL's batched matmul (its small-matrix path), and every elementwise stage re-read activations that
had left the cache while the other 31 networks of the group went through the same stage. The C
step runs one network's whole step at a time (its activations stay in L2), with register-tiled
AVX2/FMA matmuls whose tiles end in the elementwise work (bias, sine and cosine in the forward,
times ``w0 * cos`` in the backward). Adam is one pass per parameter tensor.

The library is compiled with the system C compiler (``$CC``, else ``cc``/``gcc``) into a per-user
cache (``$ZOO_CACHE_DIR`` or ``~/.cache/weightzoo``), named by a hash of the source, the flags and
the compiler, written atomically (parallel Ray workers may race to build it). It needs x86-64 with
AVX2 and FMA. Where any of that is missing, or ``ZOO_NATIVE=0`` is set, :func:`library` returns
``None`` (with one warning if a build failed) and the fitter uses the numba kernels
(:mod:`zoo.fit.kernels`) or plain PyTorch instead: same math, float rounding apart.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

SOURCE = Path(__file__).with_name("siren_step.c")
FLAGS = ["-O3", "-mavx2", "-mfma", "-fno-math-errno", "-std=gnu11", "-shared", "-fPIC"]


class SirenShape(ctypes.Structure):
    """Mirror of ``SirenShape`` in ``siren_step.c``."""

    _fields_ = [
        ("layers", ctypes.c_int),
        ("widths", ctypes.POINTER(ctypes.c_int)),
        ("points", ctypes.c_int),
        ("grid_h", ctypes.c_int),
        ("grid_w", ctypes.c_int),
        ("ys", ctypes.c_void_p),
        ("xs", ctypes.c_void_p),
        ("coords", ctypes.c_void_p),
        ("w0_first", ctypes.c_float),
        ("w0_hidden", ctypes.c_float),
        ("output_offset", ctypes.c_float),
    ]


def cpu_supported() -> bool:
    """x86-64 Linux with AVX2 and FMA (what the kernels are written for)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    return {"avx2", "fma"} <= set(flags)


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        path = shutil.which(name) if name else None
        if path:
            return path
    return None


def _cache_dir() -> Path:
    root = os.environ.get("ZOO_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "weightzoo")
    return Path(root) / "native"


def _build(compiler: str) -> Path:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join([compiler, *version, *FLAGS]).encode()).hexdigest()[:16]
    target = _cache_dir() / f"siren_step-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", tmp], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{compiler} failed:\n{done.stderr.strip()}")
        os.replace(tmp, target)  # atomic: a concurrent builder's identical file is simply replaced
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    for stale in target.parent.glob("siren_step-*.so"):  # builds of older sources (processes that
        if stale != target:                              # still have one loaded keep their mapping)
            stale.unlink(missing_ok=True)
    return target


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded kernels, or ``None`` where they cannot run here (see the module doc)."""
    if os.environ.get("ZOO_NATIVE", "1") == "0" or not cpu_supported():
        return None
    compiler = _compiler()
    if compiler is None:
        warnings.warn("no C compiler (cc, gcc, clang or $CC) found: CPU fitting uses the slower numba/PyTorch "
                      "step; install one (e.g. gcc) for the native kernels, or set ZOO_NATIVE=0 to silence this",
                      stacklevel=2)
        return None
    try:
        lib = ctypes.CDLL(str(_build(compiler)))
    except (OSError, RuntimeError, subprocess.SubprocessError) as err:
        warnings.warn(f"native fitting kernels unavailable, using the slower numba/PyTorch step: {err}", stacklevel=2)
        return None
    shape_p = ctypes.POINTER(SirenShape)
    floats_pp = ctypes.POINTER(ctypes.c_void_p)
    lib.zoo_siren_scratch_floats.argtypes = [shape_p]
    lib.zoo_siren_scratch_floats.restype = ctypes.c_long
    lib.zoo_siren_step.argtypes = [shape_p, ctypes.c_int, floats_pp, floats_pp, ctypes.c_void_p, ctypes.c_void_p,
                                   floats_pp, floats_pp, ctypes.c_void_p]
    lib.zoo_siren_step.restype = ctypes.c_int
    lib.zoo_adam.argtypes = [ctypes.c_int, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_float] * 5
    lib.zoo_adam.restype = None
    return lib


def available() -> bool:
    return library() is not None
