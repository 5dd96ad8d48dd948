"""This machine's CPU as ``/proc/cpuinfo``'s first processor describes it: read by the C kernels' build
(:mod:`zoo.cbuild`: are AVX2 and FMA there?), by a store's manifest (:mod:`zoo.store.manifest`: which CPU
made these floats?), by ``zoo train --precision bf16`` (:func:`dws.tasks.trainer.slow_precision`: does the
CPU have native bfloat16?) and by the weight-space models' linear maps (:mod:`dws.ops.linear`: does it have
AVX-512, which makes a convolution of node features the faster product?)."""

from __future__ import annotations

from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def first_processor() -> dict[str, str]:
    """The first processor's ``key: value`` lines, in their order ({} where there is no ``/proc/cpuinfo``)."""
    try:
        text = CPUINFO.read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.split("\n\n")[0].splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def flags() -> set[str]:
    """The first processor's feature flags (empty where there are none)."""
    return set(first_processor().get("flags", "").split())
