"""Baselines: interface, capacity matching, augmentation, alignment and the symmetries they keep."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dws.baselines import (
    BASELINES,
    AlignedMLP,
    INR2Vec,
    MLPBaseline,
    PermAugMLP,
    WeightTransformer,
    align,
    build_baseline,
    count_params,
    merge_many,
    random_permute,
    size_to_params,
    weight_matching,
)
from dws.baselines.mlp import inverse_perms
from dws_helpers import adam_losses
from dws.weightspace import WeightSpace, mlp_forward, random_group_element


def random_widths(gen: torch.Generator, layers=(2, 4), hidden=(2, 24)) -> tuple[int, ...]:
    """INR-like random architecture: small input/output widths, random hidden widths."""
    m = int(torch.randint(layers[0], layers[1] + 1, (), generator=gen))
    inner = torch.randint(hidden[0], hidden[1] + 1, (m - 1,), generator=gen).tolist()
    d_in, d_out = torch.randint(1, 4, (2,), generator=gen).tolist()
    return (d_in, *inner, d_out)


def random_ws(widths, batch: int, gen: torch.Generator, scale: float = 1.0) -> WeightSpace:
    pairs = list(zip(widths[:-1], widths[1:]))
    return WeightSpace(
        tuple(scale * torch.randn(batch, o, i, generator=gen) for i, o in pairs),
        tuple(scale * torch.randn(batch, o, generator=gen) for _, o in pairs),
    )


def repeat(ws: WeightSpace, batch: int) -> WeightSpace:
    return ws.map(lambda t: t.expand(batch, *t.shape[1:]))


def permuted_copies(widths, batch: int, gen: torch.Generator) -> tuple[WeightSpace, WeightSpace]:
    """A random network (batch 1) and ``batch`` randomly permuted copies of it."""
    base = random_ws(widths, 1, gen)
    perms = random_group_element(widths, batch_size=batch, generator=gen)
    return base, repeat(base, batch).permute(perms)


def max_abs_diff(a: WeightSpace, b: WeightSpace) -> torch.Tensor:
    """Per-sample largest entry of ``|a - b|``."""
    return (a.flatten() - b.flatten()).abs().amax(dim=1)


def distance(a: WeightSpace, b: WeightSpace) -> torch.Tensor:
    return (a.flatten() - b.flatten()).norm(dim=1)


def permute_rows_only(ws: WeightSpace, layer: int, perm: torch.Tensor) -> WeightSpace:
    """Reorder the neuron rows ``[W_m | b_m]`` of one layer without touching the next layer: not a
    symmetry of the networks, but the reordering a set/sequence model over rows may ignore."""
    weights, biases = list(ws.weights), list(ws.biases)
    weights[layer], biases[layer] = weights[layer][:, perm], biases[layer][:, perm]
    return WeightSpace(tuple(weights), tuple(biases))


SMALL = {"hidden": 16}  # fast models for behaviour tests


# ----------------------------------------------------------------------------- interface
@pytest.mark.parametrize("name", sorted(BASELINES))
def test_forward_shapes_on_random_architectures(name):
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        widths = random_widths(gen)
        out = int(torch.randint(1, 6, (), generator=gen))
        model = build_baseline(name, widths, out, **SMALL)
        ws = random_ws(widths, 5, gen)
        model.prepare(ws)
        model.eval()
        y = model(ws)
        assert y.shape == (5, out)
        assert torch.isfinite(y).all()
        # a trailing channel dim of size 1 is accepted and means the same input
        torch.testing.assert_close(model(ws.with_channels()), y)


@pytest.mark.parametrize("name", sorted(BASELINES))
@pytest.mark.parametrize("widths,target", [((2, 32, 32, 1), 550_000), ((1, 32, 32, 1), 15_000)])
def test_sized_to_target_params(name, widths, target):
    model = build_baseline(name, widths, 10, target_params=target)
    assert abs(count_params(model) - target) <= 0.1 * target
    assert isinstance(model, BASELINES[name])


def test_size_to_params_picks_closest_width_and_respects_multiple():
    def factory(hidden):
        return nn.Linear(10, hidden)  # 11 * hidden parameters

    model, n = size_to_params(factory, 1000)
    assert (model.out_features, n) == (91, 1001)  # 90 -> 990, 91 -> 1001
    model, n = size_to_params(factory, 1000, multiple_of=8)
    assert model.out_features == 88 and n == 968  # 88 -> 968 beats 96 -> 1056
    with pytest.raises(ValueError, match="even the smallest size .hidden=1. has 11 parameters"):
        size_to_params(factory, 5, rtol=0.1)  # the smallest model has 11 parameters
    with pytest.raises(ValueError, match="closest size has 88 parameters .hidden=8., 32% away from the target 130"):
        size_to_params(factory, 130, multiple_of=8, rtol=0.05)  # 8 -> 88, 16 -> 176


def test_clear_errors_for_wrong_inputs():
    gen = torch.Generator().manual_seed(1)
    model = MLPBaseline((2, 8, 1), 3, hidden=4)
    with pytest.raises(ValueError, match="built for widths"):
        model(random_ws((2, 9, 1), 2, gen))
    two_channels = random_ws((2, 8, 1), 2, gen).map(lambda t: t.unsqueeze(-1).expand(*t.shape, 2))
    with pytest.raises(ValueError, match="one channel"):
        model(two_channels)
    with pytest.raises(ValueError, match="widths must be"):
        MLPBaseline((4,), 3)
    with pytest.raises(ValueError, match="unknown baseline"):
        build_baseline("cnn", (2, 8, 1), 3)
    with pytest.raises(ValueError, match="multiple of num_heads"):
        WeightTransformer((2, 8, 1), 3, hidden=7, num_heads=2)
    with pytest.raises(RuntimeError, match="prepare"):
        AlignedMLP((2, 8, 1), 3, hidden=4)(random_ws((2, 8, 1), 2, gen))


# -------------------------------------------------------------------------- equivariant
def test_equivariant_mlp_outputs_a_weight_space():
    gen = torch.Generator().manual_seed(2)
    widths = random_widths(gen)
    model = MLPBaseline(widths, equivariant=True, hidden=8).eval()
    out = model.forward_weightspace(random_ws(widths, 3, gen))
    assert out.widths == widths and out.batch_size == 3
    with pytest.raises(ValueError, match="weight-space size"):
        MLPBaseline(widths, 3, equivariant=True)


def test_inverse_perms_undo_a_group_element():
    gen = torch.Generator().manual_seed(3)
    widths = random_widths(gen)
    ws = random_ws(widths, 4, gen)
    perms = random_group_element(widths, batch_size=4, generator=gen)
    assert max_abs_diff(ws.permute(perms).permute(inverse_perms(perms)), ws).max() == 0


# -------------------------------------------------------------------------- augmentation
def test_random_permutation_keeps_the_function_and_moves_the_weights():
    gen = torch.Generator().manual_seed(4)
    for _ in range(3):
        widths = random_widths(gen, hidden=(6, 24))
        ws = random_ws(widths, 8, gen)
        moved, perms = random_permute(ws, generator=gen)
        x = torch.randn(50, widths[0], generator=gen)
        torch.testing.assert_close(mlp_forward(moved, x), mlp_forward(ws, x))
        # 6+ neurons per hidden layer: drawing the identity everywhere is (almost) impossible
        assert (max_abs_diff(moved, ws) > 0).all()
        assert all(p.shape == (8, d) for p, d in zip(perms, widths[1:-1]))


def test_perm_aug_mlp_permutes_in_training_only():
    gen = torch.Generator().manual_seed(5)
    widths = (2, 12, 12, 1)
    ws = random_ws(widths, 6, gen)
    model = PermAugMLP(widths, 1, hidden=8)
    seen, perms = model.transform_input(ws)
    assert perms is not None and (max_abs_diff(seen, ws) > 0).all()
    model.eval()
    seen, perms = model.transform_input(ws)
    assert perms is None and seen is ws


# ----------------------------------------------------------------------------- alignment
def test_alignment_recovers_a_permuted_copy_exactly():
    gen = torch.Generator().manual_seed(6)
    for _ in range(6):
        widths = random_widths(gen, hidden=(2, 32))
        ref, copies = permuted_copies(widths, 8, gen)
        aligned = align(copies, ref, generator=gen)
        assert max_abs_diff(aligned, repeat(ref, 8)).max() < 1e-6, widths


def test_alignment_never_moves_away_and_keeps_the_function():
    gen = torch.Generator().manual_seed(7)
    for _ in range(4):
        widths = random_widths(gen, hidden=(2, 20))
        ref, ws = random_ws(widths, 1, gen), random_ws(widths, 16, gen)
        aligned = ws.permute(weight_matching(ws, ref, generator=gen))
        assert (distance(aligned, ref) <= distance(ws, ref) + 1e-5).all()
        x = torch.randn(30, widths[0], generator=gen)
        torch.testing.assert_close(mlp_forward(aligned, x), mlp_forward(ws, x))


def test_merge_many_of_permuted_copies_is_a_permutation_of_the_network():
    gen = torch.Generator().manual_seed(8)
    widths = random_widths(gen, layers=(3, 3), hidden=(8, 16))
    base, copies = permuted_copies(widths, 12, gen)
    ref = merge_many(copies, subsample=10, generator=gen)
    assert ref.batch_size == 1
    assert max_abs_diff(align(base, ref, generator=gen), ref).max() < 1e-5


def test_aligned_mlp_is_invariant_on_copies_and_precomputing_matches():
    gen = torch.Generator().manual_seed(9)
    widths = (2, 10, 10, 1)
    _, train = permuted_copies(widths, 6, gen)
    live = AlignedMLP(widths, 2, hidden=8, subsample=4).eval()
    live.prepare(train)
    out = live(train)
    torch.testing.assert_close(out, out[:1].expand_as(out))  # copies align to the same input
    # the reference travels in the state_dict; aligning once up front gives the same outputs
    precomputed = AlignedMLP(widths, 2, hidden=8, align_in_forward=False).eval()
    precomputed.load_state_dict(live.state_dict())
    torch.testing.assert_close(precomputed(live.align(train)), out)


def test_aligned_mlp_equivariant_output_follows_the_input_permutation():
    gen = torch.Generator().manual_seed(10)
    widths = (2, 10, 10, 1)
    _, train = permuted_copies(widths, 6, gen)
    model = AlignedMLP(widths, equivariant=True, hidden=8, subsample=4).eval()
    model.prepare(train)
    perms = random_group_element(widths, batch_size=6, generator=gen)
    torch.testing.assert_close(
        model.forward_weightspace(train.permute(perms)).flatten(),
        model.forward_weightspace(train).permute(perms).flatten(),
    )


# ----------------------------------------------------------------- set / sequence models
def _row_model_cases():
    return [
        ("inr2vec", lambda w: INR2Vec(w, 3, hidden=16)),
        ("transformer-cls", lambda w: WeightTransformer(w, 3, hidden=16, positional=False)),
        ("transformer-mean", lambda w: WeightTransformer(w, 3, hidden=16, positional=False,
                                                         pooling="mean")),
    ]


@pytest.mark.parametrize("label,make", _row_model_cases())
def test_row_models_ignore_row_order_within_a_layer(label, make):
    gen = torch.Generator().manual_seed(10)
    for _ in range(3):
        widths = random_widths(gen, hidden=(4, 16))
        model = make(widths).eval()
        ws = random_ws(widths, 4, gen)
        layer = int(torch.randint(0, len(widths) - 1, (), generator=gen))
        perm = torch.randperm(widths[layer + 1], generator=gen)
        torch.testing.assert_close(model(permute_rows_only(ws, layer, perm)), model(ws))


@pytest.mark.parametrize("label,make", _row_model_cases())
def test_row_models_are_not_invariant_to_the_weight_space_symmetry(label, make):
    """What they do not claim: a group element also reorders entries inside next-layer rows."""
    gen = torch.Generator().manual_seed(11)
    widths = (2, 12, 12, 1)
    model = make(widths).eval()
    ws = random_ws(widths, 4, gen)
    moved = ws.permute(random_group_element(widths, batch_size=4, generator=gen))
    assert (model(moved) - model(ws)).abs().max() > 1e-4


def test_positional_transformer_sees_row_order():
    gen = torch.Generator().manual_seed(12)
    widths = (2, 12, 12, 1)
    model = WeightTransformer(widths, 3, hidden=16).eval()
    ws = random_ws(widths, 4, gen)
    moved = permute_rows_only(ws, 0, torch.randperm(12, generator=gen))
    assert (model(moved) - model(ws)).abs().max() > 1e-4


# ------------------------------------------------------------------------------ training
@pytest.mark.parametrize("name", sorted(BASELINES))
def test_a_few_training_steps_reduce_the_loss(name):
    torch.manual_seed(13)
    gen = torch.Generator().manual_seed(13)
    widths = (2, 8, 8, 1)
    ws = random_ws(widths, 32, gen)
    # an invariant target (output bias and output weight norm), so augmentation keeps it valid
    target = torch.cat([ws.biases[-1], ws.weights[-1].flatten(1).norm(dim=1, keepdim=True)], 1)
    kw = {"subsample": 8, "max_iter": 3} if name == "mlp-align" else {}
    model = build_baseline(name, widths, 2, hidden=32, **kw)
    model.prepare(ws)
    losses = adam_losses(model, ws, target, steps=60, lr=3e-3, loss=nn.functional.mse_loss)
    assert sum(losses[-5:]) < 0.5 * sum(losses[:5])
