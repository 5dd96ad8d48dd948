"""Per-block parameter counts agree with the "# params" columns of the paper's Tables 5-9.

The tables are transcribed here case by case (1-based layer indices, block ``U_j -> U_i``), with
two readings made explicit: rows 7/8 of the weight-to-weight table are the blocks W_1 -> W_2 and
W_{M-1} -> W_M, and the lower-triangular rows of the weight-to-bias table cover ``j = i - 1`` too.
The ``M = 2`` blocks W_1 <-> W_2 follow the footnoted case of Appendix C (2 d_0 d_M).
"""

from __future__ import annotations

from itertools import combinations

import pytest

from dws import DWSLayer
from dws_helpers import random_widths


def w2w(i, j, d):
    M, d0, dM = len(d) - 1, d[0], d[-1]
    if i == j:
        return 2 * d0**2 if i == 1 else 2 * dM**2 if i == M else 4
    if abs(i - j) == 1 and {i, j} == {1, M}:
        return 2 * d0 * dM  # footnote: M = 2
    if j == i + 1:
        return 2 * d0 if i == 1 else 2 * dM if i == M - 1 else 2
    if j == i - 1:
        return 2 * d0 if j == 1 else 2 * dM if i == M else 2
    if j > i + 1:
        return (d0 * dM if j == M else d0) if i == 1 else (dM if j == M else 1)
    return (d0 * dM if i == M else d0) if j == 1 else (dM if i == M else 1)


def b2b(i, j, d):
    M, dM = len(d) - 1, d[-1]
    if i == j:
        return dM**2 if i == M else 2
    if i < j:
        return dM if j == M else 1
    return dM if i == M else 1


def w2b(i, j, d):
    M, d0, dM = len(d) - 1, d[0], d[-1]
    if i == j:
        return 2 * d0 if i == 1 else dM**2 if i == M else 2
    if j == i + 1:
        return 2 * dM if j == M else 2
    if j > i + 1:
        return dM if j == M else 1
    if j == 1:
        return d0 * dM if i == M else d0
    return dM if i == M else 1


def b2w(i, j, d):
    M, d0, dM = len(d) - 1, d[0], d[-1]
    if i == j:
        return 2 * d0 if i == 1 else dM**2 if i == M else 2
    if i == j + 1:
        return 2 * dM if i == M else 2
    if j < i - 1:
        return dM if i == M else 1
    if i == 1:
        return dM * d0 if j == M else d0
    return dM if j == M else 1


TABLES = {("weight", "weight"): w2w, ("bias", "bias"): b2b, ("weight", "bias"): w2b, ("bias", "weight"): b2w}


def orbits(slot, d):
    """Table 9: number of orbits of a tensor = parameters of its equivariant bias (one channel)."""
    M = len(d) - 1
    if slot.kind == "weight":
        return d[0] if slot.layer == 1 else d[-1] if slot.layer == M else 1
    return d[-1] if slot.layer == M else 1


def block_params(layer, src, dst) -> int:
    shared = [a for a in src.set_axes if a in dst.set_axes]
    blocks = [layer.block_weight(src, dst, k) for r in range(len(shared) + 1) for k in combinations(shared, r)]
    return sum(b.numel() for b in blocks if b is not None)


ARCHS = [random_widths(seed, max_width=6) for seed in range(12)] + [(2, 32, 32, 1), (5, 3, 1), (3, 4, 5, 2)]


@pytest.mark.parametrize("widths", ARCHS)
def test_block_parameter_counts_match_tables(widths):
    layer = DWSLayer(widths, 1, 1)
    for src in layer.slots:
        for dst in layer.slots:
            expected = TABLES[(src.kind, dst.kind)](dst.layer, src.layer, widths)
            assert block_params(layer, src, dst) == expected, (src.name, dst.name, widths)


@pytest.mark.parametrize("widths", ARCHS)
def test_bias_parameter_counts_match_orbit_table(widths):
    layer = DWSLayer(widths, 1, 1)
    for s in layer.slots:
        assert layer.slot_bias[s.name].numel() == orbits(s, widths), s.name


@pytest.mark.parametrize("c_in,c_out", [(1, 1), (2, 3), (4, 4)])
def test_total_count_scales_with_channels(c_in, c_out):
    widths = (2, 5, 4, 3)
    base = DWSLayer(widths, 1, 1)
    layer = DWSLayer(widths, c_in, c_out)
    table_total = sum(TABLES[(s.kind, t.kind)](t.layer, s.layer, widths) for s in base.slots for t in base.slots)
    orbit_total = sum(orbits(s, widths) for s in base.slots)
    assert sum(p.numel() for p in layer.parameters()) == table_total * c_in * c_out + orbit_total * c_out
