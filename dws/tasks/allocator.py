"""Keep freed activation buffers in the process heap while training on a CPU.

glibc serves every allocation above its mmap threshold with a fresh ``mmap`` and unmaps it on
free. Autograd frees and re-allocates the same multi-megabyte activations and gradients every step
(a DWSNet's hidden weight features are 12.6 MB at batch 64), so each step page-faults all of them
in again: 3-6 us per 4 KiB page on the development machines, about 10% of a DWSNet training step.
Raising the mmap threshold to glibc's maximum (32 MiB on 64-bit) and the trim threshold keeps
those blocks in the heap for reuse. This is what ``MALLOC_MMAP_THRESHOLD_`` /
``MALLOC_TRIM_THRESHOLD_`` in the environment do; the call does it for a running process. The
price is a resident set that stays at its peak, the usual trade for a training process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

M_TRIM_THRESHOLD = -1  # mallopt parameter numbers from glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit
TRIM_THRESHOLD = 1 << 30


@functools.cache
def retain_freed_memory() -> bool:
    """Apply the thresholds once per process; False where the C library is not glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # glibc only: other C libraries have other parameter numbers
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
