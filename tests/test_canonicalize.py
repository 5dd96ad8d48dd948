"""Canonicalization under the networks' symmetries (``dws.canonical``, ``zoo derive --canonicalize``).

A canonical form keeps every network's function, is idempotent, and maps a network and any of its
symmetric copies (random hidden-neuron permutations and, for odd activations, random sign flips; for
ReLU, random positive scalings) to the same weights. Checked on random architectures and on stores: the tiny SIREN store of real digits
and small synthetic classifier stores (ReLU, tanh).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch
from click.testing import CliRunner

from dws.canonical import (
    canonical_flips,
    canonical_neuron_scales,
    canonical_order,
    canonical_scales,
    canonical_signs,
    canonicalizer,
    derive_canonical_store,
    flip_signs,
    parse_transforms,
)
from dws.canonical.scale import neuron_norms
from dws.canonical.sign import sign_keys
from dws.stream.batch import weightspace_from_arrays
from dws.weightspace import WeightSpace, mlp_forward, random_group_element, random_neuron_scales
from dws_helpers import random_widths, random_ws
from zoo.store import StoreError, WeightStore, verify_store
from zoo.store.derive import write_store

SEEDS = range(8)


def sign_then_sort(ws: WeightSpace) -> WeightSpace:
    return canonical_order(canonical_signs(ws))


def scale_then_sort(ws: WeightSpace) -> WeightSpace:
    return canonical_order(canonical_scales(ws))


def hidden_at_least_two(seed: int) -> tuple[int, ...]:
    """A random architecture with 2-4 layers whose hidden layers have 2..6 neurons (so that
    permutations and flips move something)."""
    widths = random_widths(seed, min_layers=2, max_layers=4, max_width=6)
    return (widths[0], *(max(2, w) for w in widths[1:-1]), widths[-1])


def assert_same_bits(a: WeightSpace, b: WeightSpace) -> None:
    assert all(torch.equal(x, y) for x, y in zip(a.weights + a.biases, b.weights + b.biases))


def symmetric_copy(ws: WeightSpace, seed: int, flips: bool) -> WeightSpace:
    """``ws`` moved by a random permutation of every hidden layer (per network) and, with ``flips``,
    random sign flips first."""
    g = torch.Generator().manual_seed(1000 + seed)
    if flips:
        ws = flip_signs(ws, [s < 0 for s in random_neuron_scales(ws.widths, ws.batch_size, "sign", g)])
    return ws.permute(random_group_element(ws.widths, ws.batch_size, g))


# ------------------------------------------------------------------------------ random architectures
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("transform, activation", [(canonical_signs, torch.sin), (canonical_signs, torch.tanh),
                                                   (canonical_order, torch.relu), (sign_then_sort, torch.sin),
                                                   (canonical_scales, torch.relu), (scale_then_sort, torch.relu)])
def test_transforms_keep_every_function_and_are_idempotent(seed, transform, activation):
    widths = random_widths(seed, min_layers=2, max_layers=4, max_width=6)
    ws = random_ws(widths, batch=6, seed=seed, dtype=torch.float32)
    x = torch.randn(9, widths[0], generator=torch.Generator().manual_seed(seed))
    once = transform(ws)
    torch.testing.assert_close(mlp_forward(once, x, activation), mlp_forward(ws, x, activation), rtol=1e-5, atol=1e-5)
    assert_same_bits(transform(once), once)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("zero_biases", [False, True])
def test_sign_leaves_no_negative_key(seed, zero_biases):
    ws = random_ws(hidden_at_least_two(seed), batch=5, seed=seed, dtype=torch.float32)
    if zero_biases:  # every key falls back to the sum of the incoming weights
        ws = WeightSpace(ws.weights, tuple(torch.zeros_like(b) for b in ws.biases[:-1]) + ws.biases[-1:])
    out = canonical_signs(ws)
    assert any(f.any() for f in canonical_flips(ws))  # something was flipped
    for k in range(ws.num_layers - 1):
        assert (sign_keys(out.weights[k], out.biases[k]) >= 0).all()
    assert not any(f.any() for f in canonical_flips(out))


@pytest.mark.parametrize("seed", SEEDS)
def test_sort_orders_every_hidden_layer_by_bias(seed):
    ws = random_ws(hidden_at_least_two(seed), batch=5, seed=seed, dtype=torch.float32)
    out = canonical_order(ws)
    assert all((b[:, 1:] >= b[:, :-1]).all() for b in out.biases[:-1])
    assert any((b[:, 1:] < b[:, :-1]).any() for b in ws.biases[:-1])  # the input was not sorted


@pytest.mark.parametrize("seed", SEEDS)
def test_sign_then_sort_is_one_representative_per_orbit(seed):
    ws = random_ws(hidden_at_least_two(seed), batch=6, seed=seed, dtype=torch.float32)
    moved = symmetric_copy(ws, seed, flips=True)
    assert not torch.equal(moved.flatten(), ws.flatten())
    assert_same_bits(sign_then_sort(moved), sign_then_sort(ws))
    perms = random_group_element(ws.widths, ws.batch_size, torch.Generator().manual_seed(seed))
    assert_same_bits(canonical_signs(ws.permute(perms)), canonical_signs(ws).permute(perms))  # equivariant


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("tied_biases", [False, True])
def test_sort_alone_is_one_representative_per_permutation_orbit(seed, tied_biases):
    ws = random_ws(hidden_at_least_two(seed), batch=6, seed=seed, dtype=torch.float32)
    if tied_biases:  # all biases equal: the incoming weights decide the order
        ws = WeightSpace(ws.weights, tuple(torch.full_like(b, 0.5) for b in ws.biases))
    moved = symmetric_copy(ws, seed, flips=False)
    assert not torch.equal(moved.flatten(), ws.flatten())
    assert_same_bits(canonical_order(moved), canonical_order(ws))


def test_sign_is_one_representative_per_sign_orbit():
    ws = random_ws((3, 5, 4, 2), batch=8, seed=3, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    flipped = flip_signs(ws, [s < 0 for s in random_neuron_scales(ws.widths, 8, "sign", g)])
    assert not torch.equal(flipped.flatten(), ws.flatten())
    assert_same_bits(canonical_signs(flipped), canonical_signs(ws))


def scaled_copy(ws: WeightSpace, seed: int) -> WeightSpace:
    """``ws`` with every hidden neuron scaled by a random positive number (log-uniform in [1/2, 2])."""
    g = torch.Generator().manual_seed(2000 + seed)
    return ws.scale_neurons(random_neuron_scales(ws.widths, ws.batch_size, "positive", g))


@pytest.mark.parametrize("seed", SEEDS)
def test_scale_gives_every_hidden_neuron_norm_one_and_leaves_dead_ones(seed):
    ws = random_ws(hidden_at_least_two(seed), batch=5, seed=seed, dtype=torch.float32)
    dead = ws.weights[0].clone()
    dead[0, 1] = 0  # network 0's second neuron of the first hidden layer: no incoming weight, no bias
    first_biases = ws.biases[0].clone()
    first_biases[0, 1] = 0
    ws = WeightSpace((dead, *ws.weights[1:]), (first_biases, *ws.biases[1:]))
    out = canonical_scales(ws)
    for k in range(ws.num_layers - 1):
        norms = neuron_norms(out.weights[k], out.biases[k])
        alive = neuron_norms(ws.weights[k], ws.biases[k]) > 0 if k == 0 else torch.ones_like(norms, dtype=torch.bool)
        torch.testing.assert_close(norms[alive], torch.ones_like(norms[alive]), rtol=0, atol=1e-6)
        assert (norms[~alive] == 0).all()
    assert not torch.isclose(neuron_norms(ws.weights[0], ws.biases[0]), torch.ones(1, dtype=torch.float64)).all()
    assert canonical_neuron_scales(ws)[0][0, 1] == 1  # the dead neuron's outgoing weights are not divided by 0


@pytest.mark.parametrize("seed", SEEDS)
def test_scale_then_sort_is_one_representative_per_orbit_up_to_rounding(seed):
    ws = random_ws(hidden_at_least_two(seed), batch=6, seed=seed, dtype=torch.float32)
    moved = symmetric_copy(scaled_copy(ws, seed), seed, flips=False)
    assert not torch.allclose(moved.flatten(), ws.flatten())
    torch.testing.assert_close(scale_then_sort(moved).flatten(), scale_then_sort(ws).flatten(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(canonical_scales(scaled_copy(ws, seed)).flatten(), canonical_scales(ws).flatten(),
                               rtol=1e-5, atol=1e-6)
    # a control: sorting alone does not undo the scaling
    assert not torch.allclose(canonical_order(moved).flatten(), canonical_order(ws).flatten(), rtol=1e-3)


def test_transform_names_are_checked_before_anything_runs():
    assert parse_transforms("sign, sort") == ("sign", "sort")
    assert parse_transforms("scale,sort") == ("scale", "sort")
    with pytest.raises(ValueError, match="unknown transform 'flip'"):
        parse_transforms("sign,flip")
    with pytest.raises(ValueError, match="twice"):
        parse_transforms("sort,sort")


# ---------------------------------------------------------------------------------------- stores
def classifier_store(root, widths, n=24, activation="relu", column=None, seed=0):
    """A small synthetic classifier store of random networks (``column``: a per-network ``activation``
    column, as ``--diversity`` zoos have)."""
    ws = random_ws(widths, batch=n, seed=seed, dtype=torch.float32)
    params = {f"{kind}{m + 1}": t.numpy() for m, (w, b) in enumerate(zip(ws.weights, ws.biases))
              for kind, t in (("W", w), ("b", b))}
    counts = {"train": n - 8, "val": 4, "test": 4}
    splits, start = {}, 0
    for name, count in counts.items():
        splits[name], start = {"start": start, "count": count}, start + count
    columns = {"index": np.arange(n), "split": [s for s, c in counts.items() for _ in range(c)], "status": ["ok"] * n}
    if column is not None:
        columns["activation"] = column
    arch = {"family": "mlp-classifier", "widths": list(widths),
            "activation": "per network: column activation" if column is not None else activation}
    return write_store(root, widths=widths, params=params, rows=pa.table(columns), splits=splits,
                       metadata={"kind": "synthetic-classifiers", "architecture": arch, "targets": []}, chunk_size=7)


def all_networks(path) -> WeightSpace:
    store = WeightStore(path)
    return weightspace_from_arrays(store.read(0, store.num_networks))


def test_derive_sign_sort_on_a_siren_store(tiny_store, tmp_path):
    from zoo.inspect.inrs import decode
    from zoo.store.card import card_text

    source = WeightStore(tiny_store)
    made = derive_canonical_store(tiny_store, tmp_path / "canon", ("sign", "sort"), log=lambda *_: None)
    derived = WeightStore(tmp_path / "canon")
    everyone = range(source.num_networks)
    np.testing.assert_allclose(decode(derived, everyone), decode(source, everyone), rtol=0, atol=2e-5)
    manifest = derived.manifest
    assert manifest["derived_from"]["content_id"] == source.manifest["content_id"] == made["derived_from"]["content_id"]
    assert manifest["canonicalize"] == ["sign", "sort"] and set(manifest["canonicalization"]) == {"sign", "sort"}
    assert all(manifest[k] == source.manifest[k] for k in ("architecture", "splits", "generation", "kind"))
    assert manifest["content_id"] not in (None, source.manifest["content_id"])
    card = card_text(tmp_path / "canon")
    assert "canonicalized (sign then sort)" in card and source.manifest["content_id"] in card
    assert manifest["command"][:5] == ["zoo", "derive", str(tiny_store.resolve()), "--canonicalize", "sign,sort"]
    assert " ".join(manifest["command"]) in card
    assert derived.networks.to_pandas().equals(source.networks.to_pandas())  # the same rows (NaN columns too)
    assert verify_store(tmp_path / "canon").ok
    ws = all_networks(tmp_path / "canon")
    assert all((b >= 0).all() and (b[:, 1:] >= b[:, :-1]).all() for b in ws.biases[:-1])
    derive_canonical_store(tmp_path / "canon", tmp_path / "again", ("sign", "sort"), log=lambda *_: None)
    assert_same_bits(all_networks(tmp_path / "again"), ws)  # idempotent, store to store


def test_derive_align_writes_the_networks_mlp_align_trains_on(tiny_store, tmp_path):
    from dws.baselines.align import AlignedMLP
    from zoo.inspect.inrs import decode

    source = WeightStore(tiny_store)
    derive_canonical_store(tiny_store, tmp_path / "aligned", ("align",), seed=3, log=lambda *_: None)
    derived = WeightStore(tmp_path / "aligned")
    trained_on = AlignedMLP(source.widths, 10, n_layers=0, seed=3).prepare_store(source, tmp_path / "run",
                                                                                 log=lambda *_: None)
    assert_same_bits(all_networks(tmp_path / "aligned"), all_networks(trained_on.root))
    record = derived.manifest["canonicalization"]["align"]
    assert record["seed"] == 3 and record["reference"] == trained_on.manifest["generation"]["alignment"]["reference"]
    everyone = range(source.num_networks)
    np.testing.assert_allclose(decode(derived, everyone), decode(source, everyone), rtol=0, atol=2e-5)
    assert not np.array_equal(derived.read(0, 8)["W2"], source.read(0, 8)["W2"])  # networks were moved


@pytest.mark.parametrize("seed", range(3))
def test_sort_and_align_keep_a_relu_classifier_store_s_functions(tmp_path, seed):
    widths = random_widths(seed, min_layers=2, max_layers=4, max_width=6)
    classifier_store(tmp_path / "source", widths, seed=seed)
    derive_canonical_store(tmp_path / "source", tmp_path / "out", ("sort", "align"), log=lambda *_: None)
    x = torch.randn(11, widths[0], generator=torch.Generator().manual_seed(seed))
    before, after = all_networks(tmp_path / "source"), all_networks(tmp_path / "out")
    torch.testing.assert_close(mlp_forward(after, x), mlp_forward(before, x), rtol=1e-5, atol=1e-5)
    assert WeightStore(tmp_path / "out").manifest["canonicalize"] == ["sort", "align"]


def test_align_after_sign_builds_its_reference_from_canonical_networks(tmp_path):
    classifier_store(tmp_path / "source", (3, 5, 4, 2), activation="tanh")
    store = WeightStore(tmp_path / "source")
    transform, record = canonicalizer(store, ("sign", "align"), log=lambda *_: None)
    ws = all_networks(tmp_path / "source")
    x = torch.randn(7, 3, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(mlp_forward(transform(ws), x, torch.tanh), mlp_forward(ws, x, torch.tanh),
                               rtol=1e-5, atol=1e-5)
    reference = WeightSpace.unflatten(torch.tensor([record["align"]["reference"]]), ws.widths)
    assert (reference.biases[0] >= 0).all()  # the mean of sign-canonical networks: no negative first bias


@pytest.mark.parametrize("transform, activation, column, refused", [
    ("sign", "relu", None, "relu"), ("sign", "tanh", None, None),
    ("sign", None, ["tanh"] * 24, None), ("sign", None, ["tanh"] * 20 + ["relu"] * 4, "relu"),
    ("scale", "relu", None, None), ("scale", "tanh", None, "tanh"), ("scale", "sine", None, "sine"),
    ("scale", None, ["relu"] * 20 + ["gelu"] * 4, "gelu")])
def test_sign_and_scale_need_their_activations_and_leave_nothing_when_refused(tmp_path, transform, activation,
                                                                              column, refused):
    classifier_store(tmp_path / "source", (3, 4, 2), activation=activation, column=column)
    out = tmp_path / "derived"
    if refused is None:
        derive_canonical_store(tmp_path / "source", out, (transform,), log=lambda *_: None)
        assert WeightStore(out).manifest["canonicalize"] == [transform]
        return
    kind = {"sign": "an odd activation", "scale": "a positively homogeneous activation"}[transform]
    with pytest.raises(ValueError, match=f"canonicalize {transform} needs {kind}.*has {refused}"):
        derive_canonical_store(tmp_path / "source", out, (transform, "sort"), log=lambda *_: None)
    assert not out.exists()


@pytest.mark.parametrize("seed", range(3))
def test_derive_scale_sort_keeps_a_relu_store_s_functions_and_is_idempotent(tmp_path, seed):
    widths = random_widths(seed, min_layers=2, max_layers=4, max_width=6)
    classifier_store(tmp_path / "source", widths, seed=seed)
    derive_canonical_store(tmp_path / "source", tmp_path / "once", ("scale", "sort"), log=lambda *_: None)
    derive_canonical_store(tmp_path / "once", tmp_path / "twice", ("scale", "sort"), log=lambda *_: None)
    x = torch.randn(11, widths[0], generator=torch.Generator().manual_seed(seed))
    before, once = all_networks(tmp_path / "source"), all_networks(tmp_path / "once")
    torch.testing.assert_close(mlp_forward(once, x), mlp_forward(before, x), rtol=1e-5, atol=1e-5)
    assert_same_bits(all_networks(tmp_path / "twice"), once)
    manifest = WeightStore(tmp_path / "once").manifest
    assert manifest["canonicalize"] == ["scale", "sort"] and "norm 1" in manifest["canonicalization"]["scale"]["rule"]


def test_out_is_refused_unless_overwrite_and_an_error_leaves_the_old_store(tmp_path, monkeypatch):
    import dws.canonical.store as canonical_store

    classifier_store(tmp_path / "source", (3, 4, 2))
    out = tmp_path / "sorted"
    derive_canonical_store(tmp_path / "source", out, ("sort",), log=lambda *_: None)
    first = WeightStore(out).manifest["content_id"]
    with pytest.raises(StoreError, match="--overwrite"):
        derive_canonical_store(tmp_path / "source", out, ("sort",), log=lambda *_: None)
    (tmp_path / "not-a-store").mkdir()
    (tmp_path / "not-a-store" / "notes.txt").write_text("mine")
    with pytest.raises(StoreError, match="not a store"):
        derive_canonical_store(tmp_path / "source", tmp_path / "not-a-store", ("sort",), overwrite=True,
                               log=lambda *_: None)

    calls = []

    def fail_on_the_third_chunk(ws):
        calls.append(ws.batch_size)
        if len(calls) == 3:
            raise RuntimeError("disk gone")
        return canonical_order(ws)

    monkeypatch.setattr(canonical_store, "canonical_order", fail_on_the_third_chunk)
    for target, overwrite in ((tmp_path / "fresh", False), (out, True)):
        calls.clear()
        with pytest.raises(RuntimeError, match="disk gone"):
            derive_canonical_store(tmp_path / "source", target, ("sort",), overwrite=overwrite, log=lambda *_: None)
    assert not (tmp_path / "fresh").exists() and WeightStore(out).manifest["content_id"] == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-a-store", "sorted", "source"]  # no staging left


def test_the_derive_command(tmp_path):
    from cli import main

    classifier_store(tmp_path / "source", (3, 4, 2))
    runner = CliRunner()
    done = runner.invoke(main, ["derive", str(tmp_path / "source"), "--canonicalize", "sort,align",
                                "--out", str(tmp_path / "out")])
    assert done.exit_code == 0, done.output
    assert "24 networks, sort then align" in done.output and WeightStore(tmp_path / "out").num_networks == 24
    refused = runner.invoke(main, ["derive", str(tmp_path / "source"), "--canonicalize", "sign",
                                   "--out", str(tmp_path / "signed")])
    assert refused.exit_code == 2 and "odd activation" in refused.output and len(refused.output.splitlines()) == 1
    assert not (tmp_path / "signed").exists()
