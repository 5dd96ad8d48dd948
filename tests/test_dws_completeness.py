"""The DWS layer spans *all* equivariant affine maps, and its invariant layer all invariant ones.

The dimension of the family the layer can express (rank of parameters -> linear map) is compared with
the dimension of the space of equivariant maps computed independently of the layer's construction:
(1) numerically, as the null space of ``rho(g) (x) rho(g) - I`` stacked over generators of the group,
and (2) by the character formula ``1/|G| sum_g tr(rho(g))^2`` over the enumerated group. Removing any
single group of parameters must lose dimensions, so the test notices a missing block.
"""

from __future__ import annotations

from itertools import permutations, product

import pytest
import torch

from dws import DWSInvariantLayer, DWSLayer, WeightSpace
from dws_helpers import num_params

ARCHS = [(2, 3, 2), (1, 2, 3, 1), (2, 2, 2, 2, 1), (1, 3, 2), (2, 2, 3, 2, 2, 1)]
F64 = torch.float64


def rho(widths, perms) -> torch.Tensor:
    """The permutation matrix of a group element on the flattened weight space."""
    P = num_params(widths)
    basis = WeightSpace.unflatten(torch.eye(P, dtype=F64), widths)
    return basis.permute([torch.as_tensor(p) for p in perms]).flatten().T.contiguous()  # column i = rho e_i


def generators(widths):
    """A transposition and a full cycle per hidden layer (they generate S_d), identity elsewhere."""
    hidden = widths[1:-1]
    gens = []
    for k, d in enumerate(hidden):
        for gen in ([1, 0] + list(range(2, d)), list(range(1, d)) + [0]) if d > 1 else ():
            gens.append([gen if j == k else list(range(e)) for j, e in enumerate(hidden)])
    return gens


def rank(m: torch.Tensor) -> int:
    return int(torch.linalg.matrix_rank(m, atol=1e-8, rtol=0).item()) if m.numel() else 0


def equivariant_dim_nullspace(widths, c_in=1, c_out=1) -> int:
    P = num_params(widths)
    eye_in, eye_out = torch.eye(c_in, dtype=F64), torch.eye(c_out, dtype=F64)
    rows = []
    for g in generators(widths):
        r = rho(widths, g)
        rows.append(torch.kron(torch.kron(r, eye_out), torch.kron(r, eye_in)) - torch.eye(P * P * c_in * c_out, dtype=F64))
    n = (P * c_in) * (P * c_out)
    return n - (rank(torch.cat(rows)) if rows else 0)


def fixed_point_dim(widths) -> int:
    """Dimension of {b : rho(g) b = b}: the equivariant constants (= number of orbits)."""
    P = num_params(widths)
    rows = [rho(widths, g) - torch.eye(P, dtype=F64) for g in generators(widths)]
    return P - (rank(torch.cat(rows)) if rows else 0)


def character_average(widths, power: int) -> float:
    """``1/|G| sum_g tr(rho(g))^power`` over the whole enumerated group (Lemma C.1 / Prop. B.2)."""
    elements = list(product(*[list(permutations(range(d))) for d in widths[1:-1]]))
    return sum(torch.trace(rho(widths, [list(p) for p in g])).item() ** power for g in elements) / len(elements)


def expressed_maps(module, widths, c_in, params) -> torch.Tensor:
    """Rows: the (flattened) linear map realised with one parameter entry set to 1, all others 0."""
    P = num_params(widths)
    basis = WeightSpace.unflatten(torch.eye(P * c_in, dtype=F64).reshape(P * c_in, P, c_in), widths)
    rows = []
    with torch.no_grad():
        for p in module.parameters():
            p.zero_()
        for p in params:
            for k in range(p.numel()):
                p.view(-1)[k] = 1.0
                out = module(basis)
                rows.append((out.flatten() if isinstance(out, WeightSpace) else out).reshape(-1).clone())
                p.view(-1)[k] = 0.0
    return torch.stack(rows)


def linear_layer(widths, c_in=1, c_out=1, blocks="all"):
    return DWSLayer(widths, c_in, c_out, pool="mean", blocks=blocks, bias=False).double()


@pytest.mark.parametrize("widths", ARCHS)
def test_independent_dimension_counts_agree(widths):
    """The two independent computations of dim(equivariant maps) agree with each other."""
    assert equivariant_dim_nullspace(widths) == round(character_average(widths, 2))
    assert fixed_point_dim(widths) == round(character_average(widths, 1))


@pytest.mark.parametrize("widths", ARCHS)
def test_layer_spans_all_equivariant_linear_maps(widths):
    layer = linear_layer(widths)
    maps = expressed_maps(layer, widths, 1, list(layer.parameters()))
    expected = equivariant_dim_nullspace(widths)
    assert rank(maps) == expected
    assert maps.shape[0] == expected  # and no redundant parameters: they form a basis


@pytest.mark.parametrize("widths", [(2, 3, 2), (1, 2, 2, 1)])
def test_multichannel_layer_spans_all_equivariant_maps(widths):
    layer = linear_layer(widths, c_in=2, c_out=2)
    maps = expressed_maps(layer, widths, 2, list(layer.parameters()))
    assert rank(maps) == maps.shape[0] == equivariant_dim_nullspace(widths, 2, 2) == 4 * equivariant_dim_nullspace(widths)


@pytest.mark.parametrize("widths", ARCHS)
def test_equivariant_bias_spans_all_fixed_points(widths):
    layer = DWSLayer(widths, 1, 1, pool="mean").double()
    consts = expressed_maps(layer, widths, 1, list(layer.slot_bias.values()))
    assert rank(consts) == consts.shape[0] == fixed_point_dim(widths)


@pytest.mark.parametrize("widths", ARCHS)
def test_invariant_layer_spans_all_invariant_functionals(widths):
    layer = DWSInvariantLayer(widths, 1, 1, pool="mean", bias=False).double()
    maps = expressed_maps(layer, widths, 1, [layer.linear.weight])
    assert rank(maps) == maps.shape[0] == fixed_point_dim(widths)


@pytest.mark.parametrize("widths", [(2, 3, 2), (1, 2, 3, 1), (2, 2, 2, 2, 1)])
def test_every_parameter_group_is_needed(widths):
    """Freezing any one fused group at zero loses dimensions: a missing block would be caught."""
    layer = linear_layer(widths)
    full = equivariant_dim_nullspace(widths)
    for k in range(len(layer.groups)):
        kept = [p for j, p in enumerate(layer.group_weights) if j != k]
        assert rank(expressed_maps(layer, widths, 1, kept)) < full, layer.groups[k]


@pytest.mark.parametrize("blocks", ["W2W", "B2B", "W2W+B2B", "diagonal"])
def test_ablations_span_strictly_less(blocks):
    widths = (1, 2, 3, 1)
    layer = linear_layer(widths, blocks=blocks)
    assert rank(expressed_maps(layer, widths, 1, list(layer.parameters()))) < equivariant_dim_nullspace(widths)
