"""The store loader (order, determinism, normalization, targets, modes) and the augmentations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dws.stream import (
    Compose,
    GaussianNoise,
    Normalizer,
    RandomPermutation,
    RandomRotation,
    RandomScale,
    RandomTranslation,
    WeightDropout,
    WeightStoreLoader,
    denormalize,
    rotate_inr,
    rotation_matrix,
    scale_inr,
    translate_inr,
)
from dws.stream.batch import weightspace_from_arrays
from dws.stream.synthetic import write_synthetic_store
from dws.weightspace import WeightSpace
from zoo.fit.siren import forward
from zoo.inspect import coordinates, spec_of
from zoo.store import StoreError, WeightStore

MODES = [
    pytest.param(dict(in_memory=True), id="memory"),
    pytest.param(dict(in_memory=False, num_workers=0), id="stream-0"),
    pytest.param(dict(in_memory=False, num_workers=2), id="stream-2"),
]


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    """230 random (2, 8, 8, 1) networks in chunks of 16: splits 184/23/23, not chunk-aligned."""
    root = tmp_path_factory.mktemp("stream") / "synth"
    return WeightStore(write_synthetic_store(root, widths=(2, 8, 8, 1), num_networks=230, chunk_size=16, seed=3))


def collect(loader):
    batches = list(loader)
    return batches, torch.cat([b.index for b in batches] or [torch.zeros(0, dtype=torch.int64)])


def raw_weightspace(store: WeightStore, index: torch.Tensor) -> WeightSpace:
    arrays = {name: store.group[name].get_orthogonal_selection(index.numpy()) for name in store.parameter_names}
    return weightspace_from_arrays(arrays)


def assert_ws_close(a: WeightSpace, b: WeightSpace, **tol):
    for x, y in zip(a.weights + a.biases, b.weights + b.biases):
        torch.testing.assert_close(x, y, **tol)


# ------------------------------------------------------------------------------------ the loader
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("split", ["train", "val"])
def test_each_epoch_visits_the_split_once_in_a_new_order(synth, mode, split):
    loader = WeightStoreLoader(synth, split, batch_size=20, seed=7, **mode)
    start, stop = synth.split_range(split)
    orders = []
    for _ in range(2):
        batches, index = collect(loader)
        assert len(batches) == len(loader) == math.ceil((stop - start) / 20)
        assert all(len(b) == 20 for b in batches[:-1])
        assert torch.equal(index.sort().values, torch.arange(start, stop))  # no gap, no duplicate
        assert not torch.equal(index, torch.arange(start, stop))  # shuffled
        orders.append(index)
    assert not torch.equal(orders[0], orders[1])  # each epoch its own order


@pytest.mark.parametrize("mode", MODES)
def test_same_seed_same_batches_other_seed_other_order(synth, mode):
    aug = Compose(GaussianNoise(0.1), RandomRotation(30))
    a, b, c = (WeightStoreLoader(synth, batch_size=32, seed=s, augment=aug, **mode) for s in (1, 1, 2))
    for _ in range(2):  # two epochs
        (ba, ia), (bb, ib), (_, ic) = collect(a), collect(b), collect(c)
        assert torch.equal(ia, ib) and not torch.equal(ia, ic)
        for x, y in zip(ba, bb):
            assert_ws_close(x.ws, y.ws, rtol=0, atol=0)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_stream_is_identical_for_any_number_of_workers(synth):
    aug = Compose(RandomTranslation(0.2), WeightDropout(0.1))
    streams = [list(WeightStoreLoader(synth, batch_size=25, seed=4, augment=aug, in_memory=False,
                                      buffer_chunks=2, num_workers=w)) for w in (0, 2, 3)]
    for other in streams[1:]:
        assert len(other) == len(streams[0])
        for x, y in zip(streams[0], other):
            assert torch.equal(x.index, y.index) and torch.equal(x.target, y.target)
            assert_ws_close(x.ws, y.ws, rtol=0, atol=0)


def test_unshuffled_reads_in_index_order(synth):
    for in_memory in (True, False):
        _, index = collect(WeightStoreLoader(synth, "test", batch_size=7, shuffle=False, in_memory=in_memory))
        assert torch.equal(index, torch.arange(*synth.split_range("test")))


@pytest.mark.parametrize("mode", MODES)
def test_normalization_is_raw_minus_mean_over_std(synth, mode):
    stats = synth.stats()
    batch = next(iter(WeightStoreLoader(synth, batch_size=40, seed=5, **mode)))
    raw = raw_weightspace(synth, batch.index)
    for m in range(len(raw.weights)):
        for name, got, value in ((f"W{m + 1}", batch.ws.weights[m], raw.weights[m]),
                                 (f"b{m + 1}", batch.ws.biases[m], raw.biases[m])):
            mean, std = (torch.from_numpy(s) for s in stats[name])
            torch.testing.assert_close(got, (value - mean) / std)
    assert_ws_close(denormalize(batch.ws, synth), raw, rtol=1e-5, atol=1e-5)
    unnormalized = next(iter(WeightStoreLoader(synth, batch_size=40, seed=5, normalize=False, **mode)))
    assert_ws_close(unnormalized.ws, raw, rtol=0, atol=0)


@pytest.mark.parametrize("in_memory", [True, False])
def test_augmentation_sees_raw_weights_before_normalization(synth, in_memory):
    def add_one(ws, generator):
        return ws.map(lambda t: t + 1.0)

    batch = next(iter(WeightStoreLoader(synth, batch_size=30, augment=add_one, in_memory=in_memory)))
    raw = raw_weightspace(synth, batch.index)
    expected = Normalizer.from_store(synth).normalize(raw.map(lambda t: t + 1.0))
    assert_ws_close(batch.ws, expected)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("source_augments", [True, False])
@pytest.mark.parametrize("variant_augments", [True, False])
@pytest.mark.parametrize("shuffle", [True, False])
def test_a_variant_reads_like_a_fresh_loader_and_shares_memory(synth, mode, source_augments, variant_augments, shuffle):
    """``variant`` (e.g. un-augmented train batches beside the augmented training loader) yields
    exactly what a loader built with its options yields, and in memory it holds no second copy
    of the split unless it needs raw weights that the source only has normalized."""
    def noise(ws, generator):
        return ws.map(lambda t: t + 0.01 * torch.randn(t.shape, generator=generator))

    common = dict(batch_size=40, seed=7, limit=150, **mode)
    source = WeightStoreLoader(synth, augment=noise if source_augments else None, drop_last=True, **common)
    next(iter(source))  # the source has run an epoch; the variant still starts at epoch 0
    augment = noise if variant_augments else None
    variant = source.variant(shuffle=shuffle, augment=augment)
    fresh = WeightStoreLoader(synth, shuffle=shuffle, augment=augment, **common)
    for _ in range(2):  # two epochs: same order, same augmentation draws
        got, want = list(variant), list(fresh)
        assert [len(b.index) for b in got] == [len(b.index) for b in want]
        for g, w in zip(got, want):
            assert torch.equal(g.index, w.index) and torch.equal(g.target, w.target)
            assert_ws_close(g.ws, w.ws, rtol=1e-6, atol=1e-6)
    if mode["in_memory"]:
        shares = not (variant_augments and not source_augments)
        assert (variant._data is source._data) == shares


def test_channel_weights_denormalize(synth):
    norm = Normalizer.from_store(synth)
    raw = raw_weightspace(synth, torch.arange(5))
    back = norm.denormalize(norm.normalize(raw).with_channels())
    assert back.has_channels
    assert_ws_close(back.map(lambda t: t.squeeze(-1)), raw, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("target, dtype, shape", [
    ("label", torch.int64, ()), ("frequency", torch.float32, ()), ("amplitude,frequency", torch.float32, (2,)),
])
def test_targets_match_the_parquet_rows(synth, mode, target, dtype, shape):
    rows = synth.networks.to_pandas().set_index("index")
    for batch in WeightStoreLoader(synth, batch_size=50, target=target, **mode):
        assert batch.target.dtype == dtype and batch.target.shape == (len(batch), *shape)
        expected = rows.loc[batch.index.numpy(), target.split(",")].to_numpy()
        np.testing.assert_array_equal(batch.target.numpy(), expected.reshape(batch.target.shape))


def test_target_errors_name_the_columns(synth, tiny_store):
    with pytest.raises(ValueError, match="unknown target 'psnr2'.*'frequency'"):
        WeightStoreLoader(synth, target="psnr2")
    with pytest.raises(ValueError, match="'frequency' is missing.*targets: \\['label'\\]"):
        WeightStoreLoader(tiny_store, target="frequency")
    with pytest.raises(StoreError, match="no split 'dev'"):
        WeightStoreLoader(synth, "dev")


def test_memory_and_streaming_yield_the_same_networks(synth):
    def by_index(loader):
        batches = list(loader)
        index = torch.cat([b.index for b in batches])
        order = index.argsort()
        flat = torch.cat([b.ws.flatten() for b in batches])[order]
        return index[order], flat, torch.cat([b.target for b in batches])[order]

    memory = by_index(WeightStoreLoader(synth, batch_size=64, seed=1, in_memory=True))
    stream = by_index(WeightStoreLoader(synth, batch_size=64, seed=9, in_memory=False, num_workers=2))
    for a, b in zip(memory, stream):
        assert torch.equal(a, b)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("batch_size", [1, 23, 184, 500])
def test_drop_last_and_length(synth, mode, batch_size):
    loader = WeightStoreLoader(synth, batch_size=batch_size, drop_last=True, **mode)
    batches, index = collect(loader)
    assert len(batches) == len(loader) == 184 // batch_size
    assert all(len(b) == batch_size for b in batches)
    assert index.unique().numel() == index.numel() == len(batches) * batch_size


def test_mode_follows_the_ram_budget(synth):
    loader = WeightStoreLoader(synth, batch_size=8)
    assert loader.in_memory
    small = WeightStoreLoader(synth, batch_size=8, ram_budget=loader.split_bytes - 1)
    assert not small.in_memory
    assert WeightStoreLoader(synth, batch_size=8, ram_budget=loader.split_bytes).in_memory


def test_not_a_store_is_refused(tmp_path):
    with pytest.raises(StoreError, match="not a weight store"):
        WeightStoreLoader(tmp_path)


# ----------------------------------------------------------------------------- augmentations
@pytest.fixture(scope="module")
def inrs(tiny_store):
    """A few real digit INRs in float64 (exact identities to ~1e-10), their spec and grid."""
    store = WeightStore(tiny_store)
    ws = weightspace_from_arrays(store.read(0, 12)).map(lambda t: t.double())
    h, w = store.manifest["source"]["image_shape"][:2]
    axes = torch.linspace(-1, 1, h, dtype=torch.float64), torch.linspace(-1, 1, w, dtype=torch.float64)
    grid = torch.stack(torch.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 2)
    torch.testing.assert_close(grid.float(), coordinates(store))  # the store's own (y, x) convention
    return ws, spec_of(store), grid, (h, w)


def decode(spec, ws: WeightSpace, coords: torch.Tensor) -> torch.Tensor:
    """``[B, P]`` signals at ``coords`` ``[P, 2]`` (shared) or ``[B, P, 2]`` (one set per network)."""
    return forward(spec, list(ws.weights), list(ws.biases), coords)[..., 0]


def test_random_geometric_warps_resample_the_decoded_signal(inrs):
    ws, spec, grid, _ = inrs
    gen = torch.Generator().manual_seed(0)
    B = ws.batch_size
    angles = (torch.rand(B, generator=gen, dtype=torch.float64) - 0.5) * 2 * math.pi
    shifts = (torch.rand(B, 2, generator=gen, dtype=torch.float64) - 0.5) * 0.6
    scales = 0.5 + torch.rand(B, generator=gen, dtype=torch.float64)
    # the moved signal at p is the original at the inverse-moved point
    rotated_back = grid @ rotation_matrix(angles)  # rows: R^T p
    cases = [
        (rotate_inr(ws, angles), rotated_back),
        (translate_inr(ws, shifts), grid - shifts[:, None, :]),
        (scale_inr(ws, scales), grid / scales[:, None, None]),
    ]
    for moved, source_points in cases:
        torch.testing.assert_close(decode(spec, moved, grid), decode(spec, ws, source_points), rtol=1e-9, atol=1e-9)
        assert not torch.allclose(decode(spec, moved, grid), decode(spec, ws, grid), atol=1e-3)


def test_quarter_turns_and_pixel_shifts_move_the_image(inrs):
    ws, spec, grid, (h, w) = inrs
    image = decode(spec, ws, grid).reshape(-1, h, w)
    for k in (1, 2, 3):
        turned = decode(spec, rotate_inr(ws, torch.full((ws.batch_size,), k * math.pi / 2, dtype=torch.float64)), grid)
        torch.testing.assert_close(turned.reshape(-1, h, w), torch.rot90(image, k, dims=(1, 2)), rtol=1e-7, atol=1e-7)
    step = 2.0 / (w - 1)  # one pixel right, two down
    shifts = torch.tensor([2 * step, step], dtype=torch.float64).expand(ws.batch_size, 2)
    moved = decode(spec, translate_inr(ws, shifts), grid).reshape(-1, h, w)
    torch.testing.assert_close(moved[:, 2:, 1:], image[:, :-2, :-1], rtol=1e-7, atol=1e-7)


def test_random_augmentations_draw_per_network_and_reproducibly(inrs):
    ws, spec, grid, _ = inrs
    for aug in (RandomRotation(90), RandomTranslation(0.3), RandomScale((0.5, 2.0))):
        one = aug(ws, torch.Generator().manual_seed(1))
        again = aug(ws, torch.Generator().manual_seed(1))
        assert_ws_close(one, again, rtol=0, atol=0)
        # per network: the first-layer change differs between networks of the same batch
        ratio = (one.weights[0] - ws.weights[0]).norm(dim=(1, 2)) / ws.weights[0].norm(dim=(1, 2))
        assert ratio.std() > 1e-3 or not torch.equal(one.biases[0], ws.biases[0])
        assert_ws_close(WeightSpace(one.weights[1:], one.biases[1:]), WeightSpace(ws.weights[1:], ws.biases[1:]),
                        rtol=0, atol=0)  # only the first layer moves


def test_rotation_refuses_1d_inputs():
    ws = WeightSpace((torch.randn(3, 4, 1), torch.randn(3, 1, 4)), (torch.randn(3, 4), torch.randn(3, 1)))
    with pytest.raises(ValueError, match="rotation for 2-D inputs.*1-D"):
        RandomRotation(10)(ws)
    assert RandomScale()(ws).widths == ws.widths  # scaling and translation work in 1-D


def test_permutation_leaves_the_function_unchanged(inrs):
    ws, spec, grid, _ = inrs
    permuted = RandomPermutation()(ws, torch.Generator().manual_seed(2))
    assert not torch.equal(permuted.weights[1], ws.weights[1])
    torch.testing.assert_close(decode(spec, permuted, grid), decode(spec, ws, grid), rtol=1e-10, atol=1e-10)


def test_noise_and_dropout_statistics():
    gen = torch.Generator().manual_seed(3)
    ones = WeightSpace((torch.ones(400, 32, 2), torch.ones(400, 1, 32)), (torch.ones(400, 32), torch.ones(400, 1)))
    for sigma in torch.rand(3, generator=gen).tolist():
        noise = torch.cat([t.flatten() for t in GaussianNoise(sigma)(ones, gen).flatten().unbind(1)]) - 1
        assert abs(noise.mean()) < 0.05 * sigma and abs(noise.std() / sigma - 1) < 0.03
    spread = WeightSpace((torch.randn(400, 32, 2, generator=gen) * 5, torch.randn(400, 1, 32, generator=gen)),
                         (torch.randn(400, 32, generator=gen), torch.randn(400, 1, generator=gen)))
    noisy = GaussianNoise(0.2, relative=True)(spread, gen)
    assert all(torch.isfinite(t).all() for t in noisy.weights + noisy.biases)
    torch.testing.assert_close(noisy.biases[1], spread.biases[1])  # one entry: std 0, no noise
    rel = noisy.weights[0] - spread.weights[0]
    assert abs(rel.std() / (0.2 * spread.weights[0].std()) - 1) < 0.05
    for p in (0.1 + 0.4 * torch.rand(3, generator=gen)).tolist():
        dropped = WeightDropout(p)(ones, gen).flatten()
        assert abs((dropped == 0).float().mean() - p) < 0.02
        kept = dropped[dropped != 0]
        torch.testing.assert_close(kept, torch.full_like(kept, 1 / (1 - p)))
        assert abs(dropped.mean() - 1) < 0.03  # the mean survives
        assert (WeightDropout(p, rescale=False)(ones, gen).flatten().unique() == torch.tensor([0.0, 1.0])).all()


def test_limit_keeps_a_fixed_subset_spread_over_the_split(tiny_store):
    """Not the split's first networks (a sorted source's first N are a few classes): tests/test_train_limit.py."""
    from dws.stream import WeightStoreLoader

    subsets = []
    for in_memory, limit in ((True, 7), (False, 7), (True, 12)):
        loader = WeightStoreLoader(tiny_store, "train", batch_size=4, limit=limit, in_memory=in_memory, seed=3)
        subsets.append(set(i for b in loader for i in b.index.tolist()))
        assert len(subsets[-1]) == loader.num_networks == limit and len(loader) == -(-limit // 4)
    assert subsets[0] == subsets[1] < subsets[2]  # the same in both modes, nested across limits
    start, _ = loader.store.split_range("train")
    assert subsets[0] != set(range(start, start + 7))


def test_in_place_normalization_is_the_same_bits_in_the_same_memory(synth):
    """The loader normalizes the windows and splits it owns in place (half the memory of a copy)."""
    norm = Normalizer.from_store(synth)
    raw = raw_weightspace(synth, torch.randperm(synth.num_networks)[:9])
    copy = norm.normalize(raw)
    tensors = raw.weights + raw.biases
    pointers = [t.data_ptr() for t in tensors]
    in_place = norm.normalize(raw, in_place=True)
    assert [t.data_ptr() for t in in_place.weights + in_place.biases] == pointers
    assert_ws_close(in_place, copy, rtol=0, atol=0)
    assert_ws_close(raw, copy, rtol=0, atol=0)  # the input is what was overwritten


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("views", [1, 2, 3])
def test_views_keep_each_items_first_views(three_view_store, mode, views):
    from dws.stream import WeightStoreLoader

    store = WeightStore(three_view_store)
    table = store.networks.to_pydict()
    for split in ("train", "test"):
        start, stop = store.split_range(split)
        loader = WeightStoreLoader(store, split, batch_size=5, views=views, seed=1, **mode)
        batches, seen = collect(loader)
        expected = [i for i in range(start, stop) if table["view"][i] < views]
        assert sorted(seen.tolist()) == expected and loader.num_networks == len(expected)
        assert len(expected) == store.manifest["splits"][split]["items"] * views  # every item, K views each
        labels = torch.cat([b.target for b in batches])
        assert labels.tolist() == [table["label"][i] for i in seen.tolist()]  # targets follow the rows kept
        first = next(b for b in batches)
        assert_ws_close(Normalizer.from_store(store).denormalize(first.ws),
                        raw_weightspace(store, first.index), rtol=1e-5, atol=1e-5)


def test_views_beyond_the_store_or_without_a_view_column_are_refused(three_view_store, synth):
    from dws.stream import WeightStoreLoader

    with pytest.raises(StoreError, match=r"holds 3 view\(s\).*--views 4"):
        WeightStoreLoader(three_view_store, "train", views=4)
    with pytest.raises(StoreError, match="no 'view' column"):
        WeightStoreLoader(synth, "train", views=1)
    with pytest.raises(ValueError, match="at least 1"):
        WeightStoreLoader(three_view_store, "train", views=0)
