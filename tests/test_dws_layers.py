"""Equivariance, agreement with the block-by-block reference, shapes and errors of the DWS layers,
plain and accelerated (``dws.nn.fast``, PyTorch backend: the native kernels take float32 only,
see ``test_dws_native.py``)."""

from __future__ import annotations

import random

import pytest
import torch

from dws import DWSInvariantLayer, DWSLayer, WeightSpace, random_group_element
from dws.nn.fast import accelerate
from dws.nn.reference import block_by_block_forward
from dws_helpers import max_abs_diff, random_widths, random_ws

SEEDS = range(8)
POOLS = ("max", "mean", "sum")
BACKENDS = ("plain", "pytorch")  # the plain layer and the accelerated one


def make_layer(seed: int, pool: str, blocks: str = "all", backend: str = "plain", **kw):
    rng = random.Random(1000 + seed)
    widths = random_widths(seed)
    layer = DWSLayer(widths, rng.randint(1, 3), rng.randint(1, 3), pool=pool, blocks=blocks, **kw).double()
    with torch.no_grad():
        for b in (layer.slot_bias or {}).values():
            b.normal_()  # non-zero equivariant biases so they are tested too
    return accelerate(layer, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("seed", SEEDS)
def test_layer_is_equivariant(seed, pool, backend):
    layer = make_layer(seed, pool, backend=backend)
    ws = random_ws(layer.widths, batch=4, channels=layer.in_channels, seed=seed)
    perms = random_group_element(layer.widths, batch_size=4, generator=torch.Generator().manual_seed(seed))
    out = layer(ws)
    assert out.flatten().abs().max() > 0
    assert max_abs_diff(layer(ws.permute(perms)), out.permute(perms)) < 1e-10


@pytest.mark.parametrize("seed", SEEDS)
def test_layer_is_not_trivially_symmetric(seed):
    """Sanity check of the equivariance test: permuting the output only (not the input) must differ."""
    layer = make_layer(seed, "mean")
    if all(d == 1 for d in layer.widths[1:-1]):
        pytest.skip("trivial group")
    ws = random_ws(layer.widths, batch=2, channels=layer.in_channels, seed=seed)
    g = torch.Generator().manual_seed(seed)
    perms = random_group_element(layer.widths, batch_size=2, generator=g)
    while all(bool((p == torch.arange(p.shape[1])).all()) for p in perms):
        perms = random_group_element(layer.widths, batch_size=2, generator=g)
    assert max_abs_diff(layer(ws), layer(ws).permute(perms)) > 1e-6


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("blocks", ("all", "W2W", "B2B", "W2W+B2B", "diagonal"))
@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("seed", SEEDS)
def test_layer_matches_block_by_block_reference(seed, pool, blocks, backend):
    layer = make_layer(seed, pool, blocks, backend)
    ws = random_ws(layer.widths, batch=3, channels=layer.in_channels, seed=seed)
    fused, ref = layer(ws), block_by_block_forward(layer, ws)
    assert fused.widths == ref.widths == layer.widths
    assert max_abs_diff(fused, ref) < 1e-10


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("blocks", ("W2W", "B2B", "W2W+B2B", "diagonal"))
@pytest.mark.parametrize("seed", SEEDS)
def test_ablated_layer_is_equivariant(seed, blocks, backend):
    layer = make_layer(seed, "max", blocks, backend)
    ws = random_ws(layer.widths, batch=3, channels=layer.in_channels, seed=seed)
    perms = random_group_element(layer.widths, batch_size=3, generator=torch.Generator().manual_seed(seed))
    assert max_abs_diff(layer(ws.permute(perms)), layer(ws).permute(perms)) < 1e-10


def test_ablations_drop_the_right_blocks():
    layer = DWSLayer((2, 3, 4, 2), 1, 1, blocks="W2W+B2B")
    w1, b2 = layer.slots[0], layer.slots[4]
    assert layer.block_weight(w1, b2, ()) is None and layer.block_weight(b2, w1, ()) is None
    assert layer.block_weight(layer.slots[0], layer.slots[2], ()) is not None  # W1 -> W3
    diag = DWSLayer((2, 3, 4, 2), 1, 1, blocks="diagonal")
    assert diag.block_weight(layer.slots[0], layer.slots[1], ()) is None  # W1 -> W2
    assert diag.block_weight(layer.slots[1], layer.slots[4], (2,)) is not None  # W2 -> b2


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("pool", POOLS)
def test_invariant_layer_is_invariant(seed, pool):
    widths = random_widths(seed)
    layer = DWSInvariantLayer(widths, 2, 5, pool=pool).double()
    ws = random_ws(widths, batch=4, channels=2, seed=seed)
    perms = random_group_element(widths, batch_size=4, generator=torch.Generator().manual_seed(seed))
    out = layer(ws)
    assert out.shape == (4, 5)
    assert torch.allclose(layer(ws.permute(perms)), out, atol=1e-12)


@pytest.mark.parametrize("widths", [(3, 1), (2,), ()])
def test_too_shallow_architectures_are_rejected(widths):
    with pytest.raises(ValueError, match="M >= 2"):
        DWSLayer(widths, 1, 1)


def test_wrong_inputs_are_rejected_with_clear_errors():
    layer = DWSLayer((2, 4, 4, 1), 2, 3)
    with pytest.raises(ValueError, match="widths"):
        layer(random_ws((2, 5, 4, 1), batch=2, channels=2, dtype=torch.float32))
    with pytest.raises(ValueError, match="channels"):
        layer(random_ws((2, 4, 4, 1), batch=2, channels=3, dtype=torch.float32))
    with pytest.raises(ValueError, match="channel axis"):
        layer(random_ws((2, 4, 4, 1), batch=2, dtype=torch.float32))
    with pytest.raises(ValueError, match="pool"):
        DWSLayer((2, 4, 1), 1, 1, pool="median")
    with pytest.raises(ValueError, match="blocks"):
        DWSLayer((2, 4, 1), 1, 1, blocks="W2B")


@pytest.mark.parametrize("widths", [(2, 3, 1), (1, 5, 2), (3, 2, 4, 2), (2, 4, 3, 5, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shapes_dtype_and_finiteness(widths, dtype):
    layer = DWSLayer(widths, 1, 7).to(dtype)
    ws = random_ws(widths, batch=5, dtype=dtype)  # no channel axis: accepted for in_channels=1
    out = layer(ws)
    assert out.widths == tuple(widths) and out.has_channels
    for x, t in zip(out.weights + out.biases, ws.weights + ws.biases):
        assert x.shape == t.shape + (7,) and x.dtype == dtype
        assert torch.isfinite(x).all()


def test_small_M_cases_couple_first_and_last_layer():
    """M = 2: W_1 -> W_2 is the footnoted block (both indices free or shared) with 2 d_0 d_M params;
    M = 3: no middle layers, yet W_1 and W_3 still talk through the hidden indices."""
    two = DWSLayer((3, 4, 2), 1, 1)
    w1, w2 = two.slots[0], two.slots[1]
    assert sum(two.block_weight(w1, w2, k).numel() for k in [(), (1,)]) == 2 * 3 * 2
    three = DWSLayer((3, 4, 5, 2), 1, 1, pool="sum").double()
    ws = random_ws((3, 4, 5, 2), batch=1)
    bumped = WeightSpace((ws.weights[0] + 1.0,) + ws.weights[1:], ws.biases)
    assert max_abs_diff(three(ws).map(lambda t: t[..., 0]), three(bumped).map(lambda t: t[..., 0])) > 0
    assert (three(ws).weights[2] - three(bumped).weights[2]).abs().max() > 0


def test_pooling_choices_and_normalization():
    widths = (2, 16, 16, 1)
    ws = random_ws(widths, batch=8, channels=4, seed=3).map(lambda t: t + 1.0)  # non-centred input
    outs = {}
    for pool in POOLS:
        torch.manual_seed(0)
        outs[pool] = DWSLayer(widths, 4, 4, pool=pool).double()(ws)
    assert max_abs_diff(outs["max"], outs["mean"]) > 1e-3
    # "sum" is normalized by the set size: the same map as "mean", O(1) for O(1) inputs
    assert max_abs_diff(outs["mean"], outs["sum"]) < 1e-12
    assert outs["sum"].flatten().abs().max() < 50


def test_deep_stack_stays_numerically_stable():
    """Ten layers with ReLU and no normalization: activations neither explode nor vanish."""
    widths = (2, 32, 32, 1)
    torch.manual_seed(0)
    x = random_ws(widths, batch=16, channels=1, dtype=torch.float32)
    for pool in POOLS:
        h = x
        for k in range(10):
            h = DWSLayer(widths, 1 if k == 0 else 16, 16, pool=pool)(h).map(torch.relu)
        std = h.flatten().std().item()
        assert 1e-2 < std < 1e2, (pool, std)


def test_gradients_reach_every_parameter():
    layer = DWSLayer((2, 3, 4, 2), 2, 3)
    with torch.no_grad():
        for b in layer.slot_bias.values():
            b.normal_()
    ws = random_ws((2, 3, 4, 2), batch=4, channels=2, dtype=torch.float32)
    layer(ws).flatten().pow(2).sum().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pool", POOLS)
def test_layer_gradients_match_finite_differences(pool, backend):
    """Includes the accelerator's custom max-pool backward (no ties in random float64 input)."""
    layer = make_layer(2, pool, backend=backend)
    ws = random_ws(layer.widths, batch=2, channels=layer.in_channels, seed=5)
    tensors = [t.clone().requires_grad_() for t in ws.weights + ws.biases]
    M = ws.num_layers

    def f(*ts):
        return layer(WeightSpace(ts[:M], ts[M:])).flatten()

    assert torch.autograd.gradcheck(f, tuple(tensors), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("seed", SEEDS)
def test_layer_gradients_match_block_by_block_reference(seed, pool, backend):
    """The layer (accelerated: its in-place assembly and shared multi-pool backward) gives the
    reference's gradients w.r.t. the input and every parameter."""
    layer = make_layer(seed, pool, backend=backend)
    ws = random_ws(layer.widths, batch=3, channels=layer.in_channels, seed=seed)
    ws = ws.map(lambda t: t.detach().requires_grad_())
    cot = random_ws(layer.widths, batch=3, channels=layer.out_channels, seed=seed + 100)

    def grads(fn):
        out = fn(layer, ws)
        loss = sum((o * c).sum() for o, c in zip(out.weights + out.biases, cot.weights + cot.biases))
        inputs = list(ws.weights + ws.biases) + list(layer.parameters())
        return torch.autograd.grad(loss, inputs)

    fused = grads(lambda m, x: m(x))
    ref = grads(block_by_block_forward)
    for a, b in zip(fused, ref):
        assert (a - b).abs().max().item() < 1e-9


@pytest.mark.parametrize("depth", [3, 4, 5])
def test_unpooled_features_of_a_hidden_weight_are_the_tensor_itself(depth):
    """A hidden weight's identity-term features are its own tensor, not a view of it: with a view,
    autograd sums that tensor's gradients (identity product + max pools) out of place, one extra
    full-size pass and allocation per layer."""
    from dws.nn.layout import to_features
    from dws.nn.structure import make_slots

    widths = (2,) + (5,) * (depth - 1) + (1,)
    hidden = [s for s in make_slots(widths) if len(s.set_axes) == 2]
    assert hidden
    for slot in hidden:
        x = torch.randn(3, *(widths[a] for a in slot.axes), 4)
        assert to_features(x, slot, slot.set_axes) is x
