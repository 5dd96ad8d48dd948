"""``--normalize orbit``: statistics pooled over the claimed symmetry, so normalize-then-model is invariant.

Unit level: orbit normalization commutes with random group elements on random architectures (and
per-entry normalization does not). Pipeline level: a run trained on a store reports the same metrics
under ``zoo eval`` on a copy of that store whose every network was moved by its own random group
element, for every model that claims the symmetry; with ``--normalize entry`` it does not.
"""

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from cli import main
from dws.stream import Normalizer
from dws.stream.group_copy import write_group_copy
from dws.stream.orbit import normalization_statistics, orbit_statistics
from dws.stream.synthetic import write_synthetic_store
from dws.tasks.options import CLAIMED_SYMMETRY, MODELS, TrainOptions, check_options, with_task_defaults
from dws.tasks.run import train_run
from dws.weightspace import (ACTIVATION_SCALES, WeightSpace, mlp_forward, random_group_element,
                             random_neuron_scales)
from zoo.store import WeightStore
from zoo.store.format import arrays_from_layers

from dws_helpers import random_widths, random_ws

CLAIMS = ("permutation", "permutation+scale")


def random_stats(widths, seed: int) -> dict:
    """Per-entry ``(mean, std)`` with every entry different, as a store's are."""
    rng = np.random.default_rng(seed)
    pair = lambda *shape: (rng.normal(size=shape).astype(np.float32), rng.uniform(0.5, 2, shape).astype(np.float32))
    return arrays_from_layers([pair(o, i) for i, o in zip(widths[:-1], widths[1:])], [pair(o) for o in widths[1:]])


def act(ws: WeightSpace, claim: str, scale_kind: str, generator) -> WeightSpace:
    """One random group element per network: permutations, and neuron scales where ``claim`` has them."""
    ws = ws.permute(random_group_element(ws.widths, ws.batch_size, generator))
    if claim == "permutation+scale":
        ws = ws.scale_neurons(random_neuron_scales(ws.widths, ws.batch_size, scale_kind, generator))
    return ws


def close(a: WeightSpace, b: WeightSpace, rtol: float = 1e-5) -> bool:
    return torch.allclose(a.flatten(), b.flatten(), rtol=rtol, atol=1e-5)


def test_every_model_claims_a_symmetry_or_none():
    assert set(MODELS) <= set(CLAIMED_SYMMETRY), set(MODELS) - set(CLAIMED_SYMMETRY)
    assert set(CLAIMED_SYMMETRY.values()) <= {None, *CLAIMS}
    assert CLAIMED_SYMMETRY["dwsnet"] == "permutation" and CLAIMED_SYMMETRY["mlp"] is None


@pytest.mark.parametrize("claim,scale_kind", [("permutation", None), ("permutation+scale", "sign"),
                                              ("permutation+scale", "positive")])
@pytest.mark.parametrize("seed", range(6))
def test_orbit_normalization_commutes_with_random_group_elements(claim, scale_kind, seed):
    widths = random_widths(seed, min_layers=1, max_layers=4, max_width=5)
    stats = random_stats(widths, seed)
    g = torch.Generator().manual_seed(seed)
    ws = random_ws(widths, batch=7, seed=seed, dtype=torch.float32)
    moved = act(ws, claim, scale_kind, g)
    orbit = Normalizer.from_stats(normalization_statistics(stats, "orbit", claim))
    g = torch.Generator().manual_seed(seed)  # the same group elements, applied after normalizing
    assert close(orbit.normalize(moved), act(orbit.normalize(ws), claim, scale_kind, g))
    # the control: per-entry statistics do not commute wherever a hidden neuron can move
    entry = Normalizer.from_stats(stats)
    g = torch.Generator().manual_seed(seed)
    commutes = close(entry.normalize(moved), act(entry.normalize(ws), claim, scale_kind, g))
    assert commutes == (len(widths) == 2 or (claim == "permutation" and max(widths[1:-1]) == 1))


def test_centering_breaks_the_scale_symmetry():
    """Permutation-only orbit statistics (centered) do not commute with sign flips."""
    widths, g = (3, 4, 4, 2), torch.Generator().manual_seed(0)
    stats, ws = random_stats(widths, 1), random_ws(widths, batch=5, dtype=torch.float32)
    pooled = Normalizer.from_stats(orbit_statistics(stats, scale=False))
    flips = random_neuron_scales(widths, 5, "sign", g)
    assert not close(pooled.normalize(ws.scale_neurons(flips)), pooled.normalize(ws).scale_neurons(flips))


@pytest.mark.parametrize("scale", [False, True])
def test_orbit_statistics_are_the_moments_of_the_pooled_entries(scale):
    """Pooled from per-entry moments == the moments of the raw values of each orbit, exactly."""
    widths, rng = (3, 4, 5, 2), np.random.default_rng(2)
    values = [rng.normal(rng.normal(), rng.uniform(0.5, 2), size=(50, o, i)) for i, o in zip(widths[:-1], widths[1:])]
    biases = [rng.normal(rng.normal(), 1, size=(50, o)) for o in widths[1:]]
    stats = arrays_from_layers([(v.mean(0), v.std(0)) for v in values], [(b.mean(0), b.std(0)) for b in biases])
    pooled = orbit_statistics(stats, scale=scale)
    # W2 is hidden on both sides: one orbit; W1's input columns and W3's output rows are their own
    for name, orbit in (("W2", values[1].reshape(-1)), ("W1", values[0][:, :, 1]), ("W3", values[2][:, 1, :]),
                        ("b1", biases[0].reshape(-1)), ("b3", biases[2][:, 1])):
        mean, std = pooled[name]
        entry = (0, 1) if name == "W1" else (1, 0) if name == "W3" else (0, 0) if name[0] == "W" else (1,)
        centered = not scale or name == "b3"  # the last bias is neither flipped nor scaled
        expected_mean = orbit.mean() if centered else 0.0
        expected_std = orbit.std() if centered else np.sqrt((orbit**2).mean())
        assert mean[entry] == pytest.approx(expected_mean, abs=1e-5)
        assert std[entry] == pytest.approx(expected_std, rel=1e-5)


@pytest.mark.parametrize("activation,kind", [("sine", "sign"), ("tanh", "sign"), ("relu", "positive")])
def test_neuron_scales_keep_each_networks_function(activation, kind):
    assert ACTIVATION_SCALES[activation] == kind
    fn = {"sine": torch.sin, "tanh": torch.tanh, "relu": torch.relu}[activation]
    widths = (3, 5, 4, 2)
    ws, g = random_ws(widths, batch=6, seed=3), torch.Generator().manual_seed(3)
    x = torch.randn(10, 3, dtype=torch.float64)
    moved = ws.permute(random_group_element(widths, 6, g)).scale_neurons(random_neuron_scales(widths, 6, kind, g))
    assert not close(moved, ws)
    assert torch.allclose(mlp_forward(moved, x, fn), mlp_forward(ws, x, fn), atol=1e-10)


def test_default_is_orbit_for_claimed_symmetries_and_entry_otherwise(tmp_path):
    store = str(write_synthetic_store(tmp_path / "s", widths=(2, 3, 1), num_networks=20, chunk_size=10))
    assert with_task_defaults(TrainOptions(store=store)).normalize == "orbit"
    assert with_task_defaults(TrainOptions(store=store, model="mlp")).normalize == "entry"
    assert with_task_defaults(TrainOptions(store=store, normalize="entry")).normalize == "entry"


@pytest.mark.parametrize("opts,match", [
    (dict(model="mlp", normalize="orbit"), "claims none"),
    (dict(task="adapt", normalize="entry"), "does not apply to --task adapt"),
    (dict(normalize="per-layer"), "not one of entry, orbit"),
])
def test_normalizations_that_cannot_apply_are_refused(opts, match):
    with pytest.raises(ValueError, match=match):
        check_options(TrainOptions(store="unused", device="cpu", **opts))


def test_a_loader_normalizes_with_the_statistics_it_is_given_and_so_do_its_variants(tmp_path):
    from dws.stream import WeightStoreLoader

    store = WeightStore(write_synthetic_store(tmp_path / "s", widths=(2, 4, 3, 1), num_networks=30, chunk_size=10))
    orbit = Normalizer.from_stats(orbit_statistics(store.stats(), scale=True))
    raw = next(iter(WeightStoreLoader(store, "train", shuffle=False, normalize=False))).ws
    expected = orbit.normalize(raw).flatten()
    for in_memory in (True, False):
        loader = WeightStoreLoader(store, "train", shuffle=False, normalize=orbit, in_memory=in_memory)
        for each in (loader, loader.variant(shuffle=False, augment=lambda ws, generator: ws)):
            assert torch.allclose(next(iter(each)).ws.flatten(), expected, atol=1e-6)


# ------------------------------------------------------------------------------------------ pipeline level
@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """A tiny SIREN store (sine: sign flips are a symmetry) and, per claim, its copy with every network
    moved by its own random group element; the copies' statistics are their own, as for any store."""
    root = tmp_path_factory.mktemp("orbit")
    store = write_synthetic_store(root / "store", widths=(2, 6, 5, 1), num_networks=80, chunk_size=40, seed=1)
    scale = ACTIVATION_SCALES[WeightStore(store).manifest["architecture"]["activation"]]
    copies = {claim: write_group_copy(WeightStore(store), root / claim, scale=scale if "scale" in claim else None,
                                      seed=5) for claim in CLAIMS}
    return store, copies


def zoo_eval(run_dir, store) -> dict:
    """``zoo eval RUN STORE``: the command, as a user runs it (the run's checkpoint normalizes)."""
    result = CliRunner().invoke(main, ["eval", str(run_dir), str(store)])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


# the DWSNet a model is sized to: 8 channels, or the smallest its sizing reaches on these networks
CHANNELS = {"ng-transformer": 16}


def train_tiny(store, out, model: str, normalize: str | None = None) -> None:
    train_run(TrainOptions(store=str(store), model=model, epochs=1, lr=1e-3, batch_size=16,
                           hidden_channels=CHANNELS.get(model, 8),
                           num_layers=2, precise_bn=0, augment=False, normalize=normalize, out=str(out),
                           progress=False, device="cpu"), log=lambda *_: None)


CLAIMED = [name for name, claim in CLAIMED_SYMMETRY.items() if claim]


@pytest.mark.parametrize("model", CLAIMED)
def test_zoo_eval_reports_the_same_metrics_on_a_group_moved_copy(model, stores, tmp_path):
    if model not in MODELS:
        pytest.skip(f"--model {model} is not registered in dws/tasks/options.py MODELS yet")
    store, copies = stores
    train_tiny(store, tmp_path / "run", model)
    original, moved = zoo_eval(tmp_path / "run", store), zoo_eval(tmp_path / "run", copies[CLAIMED_SYMMETRY[model]])
    assert moved["networks"] == original["networks"] > 0
    assert moved["accuracy"] == original["accuracy"]
    assert moved["loss"] == pytest.approx(original["loss"], rel=1e-5)
    # the run recorded the normalization, and its checkpoint holds the statistics it normalized with
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["options"]["normalize"] == "orbit"
    saved = torch.load(tmp_path / "run" / "best.pt", weights_only=False)["stats"]
    pooled = orbit_statistics(WeightStore(store).stats(), scale=CLAIMED_SYMMETRY[model] == "permutation+scale")
    assert all(np.array_equal(saved[k][1], pooled[k][1]) for k in pooled)


def test_with_per_entry_statistics_the_moved_copy_scores_differently(stores, tmp_path):
    """The control: the same model and test, normalized per entry, is not invariant (the test can fail)."""
    store, copies = stores
    train_tiny(store, tmp_path / "run", "dwsnet", normalize="entry")
    original, moved = zoo_eval(tmp_path / "run", store), zoo_eval(tmp_path / "run", copies["permutation"])
    assert moved["loss"] != pytest.approx(original["loss"], rel=1e-3)
