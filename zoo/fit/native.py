"""The native CPU fitting kernels (``siren_step.c``): built on first use, loaded with ctypes.

Why C: a fitting step's three ``[32, 32] x [32, 784]`` matmuls per network ran at ~40-50 GFLOP/s in
MKL's batched matmul (its small-matrix path), and every elementwise stage re-read activations that
had left the cache while the other 31 networks of the group went through the same stage. The C
step runs one network's whole step at a time (its activations stay in L2), with register-tiled
AVX2/FMA matmuls whose tiles end in the elementwise work (bias, sine and cosine in the forward,
times ``w0 * cos`` in the backward). Adam is one pass per parameter tensor.

It is compiled on first use and cached by :mod:`zoo.cbuild`. Where it cannot be (no x86-64 with
AVX2 and FMA, no compiler, a failed build, or ``ZOO_NATIVE=0``), :func:`library` returns ``None`` and the
fitter uses the PyTorch step instead: same math, float rounding apart.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

from zoo import cbuild

SOURCE = Path(__file__).with_name("siren_step.c")
FLAGS = list(cbuild.BASE_FLAGS)


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


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded kernels, or ``None`` where they cannot run here (see the module doc)."""
    lib = cbuild.load(SOURCE, FLAGS, "native fitting kernels", "the slower PyTorch step")
    if lib is None:
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
