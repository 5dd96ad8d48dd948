"""``--train-limit N`` / the loader's ``limit``: N networks spread over the train split (a fixed random
subset, stratified by label), not its first N, in every mode, count and report; runs begun when a
limit meant the first N are not resumed as if it meant this."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest
import torch
from click.testing import CliRunner

from cli import main
from test_resume import interrupted, without_seconds  # a kill right after a checkpoint write
from dws.stream import WeightStoreLoader
from dws.stream.memory import network_bytes
from dws.stream.rows import LIMIT_SELECTION, selected_mask
from dws.tasks.checkpoint import CHECKPOINTS, SETTINGS, CheckpointError
from dws.tasks.options import TrainOptions
from dws.tasks.prepare import LIMIT_SETTING, prepare_run
from dws.tasks import rundir
from dws.tasks.rundir import evaluate_run, finished_run
from dws.tasks.run import train_run
from zoo.fit.siren import SirenSpec
from zoo.store import WeightStore
from zoo.store.derive import write_store
from zoo.store.format import parameter_shapes

QUIET = dict(log=lambda *_: None)
CLASSES, PER_CLASS = 10, 24  # train split: 240 networks sorted by label, 24 of each digit
DIVERGED = (5, 100)  # train networks that did not train normally (status diverged)


def sorted_store(root, *, labelled: bool = True) -> WeightStore:
    """(2, 8, 8, 1) SIRENs laid out as a sorted source: train 240 (by label), val 30, test 30; chunks of 16.
    Each network's weights carry its label, so a classifier can learn it. ``labelled=False``: label -1."""
    rng = np.random.default_rng(0)
    counts = {"train": CLASSES * PER_CLASS, "val": 30, "test": 30}
    n = sum(counts.values())
    labels = np.concatenate([np.repeat(np.arange(CLASSES), PER_CLASS),
                             rng.integers(0, CLASSES, n - CLASSES * PER_CLASS)])
    spec = SirenSpec((2, 8, 8, 1))
    params = {name: (rng.normal(size=(n, *shape)) + labels.reshape(-1, *[1] * len(shape)) / CLASSES).astype(np.float32)
              for name, shape in parameter_shapes(spec.widths).items()}
    status = np.array(["ok"] * n, dtype=object)
    status[list(DIVERGED)] = "diverged"
    splits, start = {}, 0
    for name, count in counts.items():
        splits[name], start = {"start": start, "count": count, "items": count}, start + count
    rows = pa.table({
        "index": pa.array(np.arange(n), pa.int64()),
        "split": pa.array([s for s, c in counts.items() for _ in range(c)]),
        "label": pa.array(labels if labelled else np.full(n, -1), pa.int64()),
        "amplitude": pa.array(rng.uniform(0, 1, n).astype(np.float32)),
        "frequency": pa.array(rng.uniform(0, 1, n).astype(np.float32)),
        "status": pa.array(status.tolist()),
    })
    metadata = {"kind": "synthetic", "description": "label-sorted test store", "architecture": spec.to_manifest(),
                "targets": ["label"], "generation": {"seed": 0}, "source": {"kind": "image", "image_shape": [8, 8, 1]}}
    return WeightStore(write_store(root, widths=spec.widths, params=params, rows=rows, splits=splits,
                                   metadata=metadata, chunk_size=16))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return sorted_store(tmp_path_factory.mktemp("limit") / "sorted")


def labels_of(store: WeightStore, index: torch.Tensor) -> np.ndarray:
    return store.networks.column("label").to_numpy()[index.numpy()]


def epoch_index(loader) -> torch.Tensor:
    return torch.cat([b.index for b in loader])


def kept(store: WeightStore, limit: int | None, **kw) -> np.ndarray:
    start, stop = store.split_range("train")
    mask = selected_mask(store, start, stop, limit=limit, **kw)
    return start + np.flatnonzero(np.ones(stop - start, bool) if mask is None else mask)


# ------------------------------------------------------------------------------------ the subset
def test_a_limit_is_spread_over_a_sorted_split_stratified_and_nested(store):
    previous = np.array([], dtype=np.int64)
    for limit in (10, 20, 35, 100, 238):
        chosen = kept(store, limit)
        assert len(chosen) == limit
        assert not np.isin(DIVERGED, chosen).any()  # chosen among the networks that trained normally
        counts = np.bincount(store.networks.column("label").to_numpy()[chosen], minlength=CLASSES)
        share = limit * np.array([PER_CLASS - np.isin(DIVERGED, range(c * PER_CLASS, (c + 1) * PER_CLASS)).sum()
                                  for c in range(CLASSES)]) / 238
        assert (np.abs(counts - share) < 1 + 1e-9).all(), (limit, counts)  # every prefix proportional, up to one
        assert np.isin(previous, chosen).all()  # nested: the smaller subset is part of the larger
        previous = chosen
    assert not np.array_equal(kept(store, 20), np.arange(20))  # not the first N (those are digits 0 and 1)
    assert len(kept(store, 10_000)) == 238  # a limit above the split: every usable network


def test_without_labels_the_subset_is_a_plain_nested_random_one(tmp_path):
    store = sorted_store(tmp_path / "unlabelled", labelled=False)
    small, large = kept(store, 30), kept(store, 90)
    assert len(small) == 30 and len(large) == 90 and np.isin(small, large).all()
    assert np.ptp(small) > 150  # spread over the 240, not a block
    assert not np.isin(DIVERGED, large).any()


def test_a_limit_of_views_and_a_bad_limit(three_view_store):
    store = WeightStore(three_view_store)
    views = store.networks.column("view").to_numpy()
    chosen = kept(store, 9, views=2)
    assert len(chosen) == 9 and (views[chosen] < 2).all()
    with pytest.raises(ValueError, match="limit must be positive, got 0"):
        WeightStoreLoader(store, "train", limit=0)


# ------------------------------------------------------------------------------------ the loader
MODES = [dict(in_memory=True), dict(in_memory=False, buffer_chunks=2)]


def test_the_loader_reads_the_same_subset_in_every_mode_seed_and_variant(store):
    expected = torch.from_numpy(kept(store, 50))
    for mode in MODES:
        for seed in (0, 3):
            loader = WeightStoreLoader(store, "train", batch_size=8, seed=seed, limit=50, **mode)
            assert loader.num_networks == 50 and len(loader) == 7
            assert loader.split_bytes == 50 * network_bytes(store)  # budgeted as the subset
            index = epoch_index(loader)
            assert torch.equal(index.sort().values, expected), (mode, seed)
            assert not torch.equal(index, expected)  # shuffled
            assert torch.equal(loader.targets, torch.from_numpy(labels_of(store, expected)))
            probe = loader.variant(shuffle=False)
            assert torch.equal(epoch_index(probe), expected) and len(probe) == 7
            assert torch.equal(epoch_index(loader.variant(shuffle=True)).sort().values, expected)
    full = WeightStoreLoader(store, "train", batch_size=8, limit=None, in_memory=True)
    assert full.num_networks == 238  # no limit: every network that trained normally


@pytest.mark.parametrize("mode", MODES, ids=["memory", "stream"])
def test_a_limited_loader_resumes_where_it_stopped(store, mode):
    loader = WeightStoreLoader(store, "train", batch_size=8, seed=1, limit=40, **mode)
    epoch_index(loader)
    state = loader.state_dict()
    following = epoch_index(loader)
    again = WeightStoreLoader(store, "train", batch_size=8, seed=1, limit=40, **mode)
    again.load_state_dict(state)
    assert torch.equal(epoch_index(again), following)


# ------------------------------------------------------------------------------------ zoo train
def options(store: WeightStore, out, **kw) -> TrainOptions:
    return TrainOptions(**{**dict(store=str(store.root), model="dwsnet", hidden_channels=4, num_layers=2, epochs=2,
                                  lr=1e-3, batch_size=8, precise_bn=16, seeds=2, train_limit=40, progress=False,
                                  out=str(out), backend="plain"), **kw})


def test_a_run_counts_plans_and_trains_on_the_subset(store, tmp_path):
    lines = []
    run = prepare_run(options(store, tmp_path / "run", max_memory=2**30), log=lines.append)
    assert any(line.startswith("note: --train-limit 40: training on 40 of the 240 train networks") and
               "stratified by label" in line for line in lines), lines
    assert run.memory.splits["train"].held == 40 * network_bytes(store)
    loaders = run.loaders(seed=0)
    expected = torch.from_numpy(kept(store, 40))
    assert torch.equal(epoch_index(loaders["train"]).sort().values, expected)
    assert set(epoch_index(loaders["calibrate"]).tolist()) <= set(expected.tolist())
    assert loaders["val"].num_networks == 30  # val and test are never limited
    # a task on full batches counts the subset
    with pytest.raises(ValueError, match=r"full batches of --batch-size 64, and the train split has 40 networks "
                                         r"\(--train-limit\)"):
        prepare_run(options(store, tmp_path / "ssl", task="ssl", batch_size=64), **QUIET)


def test_train_resume_and_eval_end_to_end(store, tmp_path, monkeypatch):
    reference = CliRunner().invoke(main, ["train", str(store.root), "--out", str(tmp_path / "reference"),
                                          "--train-limit", "40", "--epochs", "2", "--lr", "1e-3", "--batch-size", "8",
                                          "--hidden-channels", "4", "--num-layers", "2", "--precise-bn", "16",
                                          "--seeds", "2", "--backend", "plain"])
    assert reference.exit_code == 0, reference.output
    assert "training on 40 of the 240 train networks" in reference.output
    opts = options(store, tmp_path / "run")
    interrupted(opts, monkeypatch, saves=1)
    settings = json.loads((tmp_path / "run" / CHECKPOINTS / SETTINGS).read_text())
    assert settings["--train-limit"] == 40 and settings[LIMIT_SETTING] == LIMIT_SELECTION
    lines = []
    resumed = train_run(opts, log=lines.append)
    assert "resuming lr 0.001, seed 0 after epoch 1 of 2" in lines
    metrics = json.loads((tmp_path / "reference" / "metrics.json").read_text())
    assert without_seconds(resumed)["history"] == metrics["history"]
    assert finished_run(opts)["run_dir"] == str(tmp_path / "run")
    evaluated = CliRunner().invoke(main, ["eval", str(tmp_path / "run"), str(store.root)])
    assert evaluated.exit_code == 0, evaluated.output
    assert '"networks": 30' in evaluated.output


# ------------------------------------------------------------------------------------ old runs
def test_an_old_run_with_a_limit_is_refused_and_one_without_resumes(store, tmp_path, monkeypatch):
    """A run saved when --train-limit kept the first N (no record of what it selects) is not resumed on
    another subset; a run without a limit saved then has the same settings as now and resumes."""
    opts = options(store, tmp_path / "old", seeds=1)
    interrupted(opts, monkeypatch, saves=1)
    path = tmp_path / "old" / CHECKPOINTS / SETTINGS
    settings = json.loads(path.read_text())
    del settings[LIMIT_SETTING]
    path.write_text(json.dumps(settings))
    with pytest.raises(CheckpointError, match="meant the train split's first 40 networks"):
        train_run(opts, **QUIET)
    result = CliRunner().invoke(main, ["train", str(store.root), "--out", str(tmp_path / "old"), "--train-limit", "40",
                                       "--epochs", "2", "--lr", "1e-3", "--batch-size", "8", "--hidden-channels", "4",
                                       "--num-layers", "2", "--precise-bn", "16", "--seeds", "1", "--backend", "plain"])
    error = result.output.strip().splitlines()[-1]  # after the run's notes, one line
    assert result.exit_code == 2 and error.startswith("error: ") and "--restart" in error, result.output
    assert (tmp_path / "old" / CHECKPOINTS).is_dir()  # nothing lost
    unlimited = replace(opts, train_limit=None, out=str(tmp_path / "unlimited"), epochs=2)
    interrupted(unlimited, monkeypatch, saves=1)
    assert LIMIT_SETTING not in json.loads((tmp_path / "unlimited" / CHECKPOINTS / SETTINGS).read_text())
    lines = []
    train_run(unlimited, log=lines.append)
    assert "resuming lr 0.001, seed 0 after epoch 1 of 2" in lines


def test_an_old_finished_run_with_a_limit_is_not_reused_but_still_evaluates(store, tmp_path):
    opts = options(store, tmp_path / "run", seeds=1, epochs=1)
    train_run(opts, **QUIET)
    assert finished_run(opts) is not None
    config_file = tmp_path / "run" / "config.json"
    config = json.loads(config_file.read_text())
    assert config["train_limit_selects"] == LIMIT_SELECTION
    del config["train_limit_selects"]  # as written before --train-limit spread its networks
    config_file.write_text(json.dumps(config))
    assert finished_run(opts) is None  # its networks were the first 40: trained again, not reused
    evaluated = CliRunner().invoke(main, ["eval", str(tmp_path / "run"), str(store.root), "--split", "val"])
    assert evaluated.exit_code == 0 and '"networks": 30' in evaluated.output, evaluated.output


def test_eval_probes_on_the_networks_the_run_trained_on(store, tmp_path, monkeypatch):
    """The SSL task's linear probe fits on the train networks: during training those of --train-limit,
    so ``zoo eval`` of the run fits it on the same subset and reproduces the recorded test metric."""
    opts = options(store, tmp_path / "ssl", task="ssl", seeds=1, epochs=1, precise_bn=0)
    train_run(opts, **QUIET)
    recorded = json.loads((tmp_path / "ssl" / "metrics.json").read_text())["test"][0]["probe_mse"]
    probed = []
    evaluate = rundir.evaluate
    monkeypatch.setattr(rundir, "evaluate", lambda model, task, loader, device, probe: (
        probed.append(probe.num_networks), evaluate(model, task, loader, device, probe))[1])
    evaluated = evaluate_run(tmp_path / "ssl", store.root)
    assert evaluated["networks"] == 30 and "note" not in evaluated
    assert probed == [40] and evaluated["probe_mse"] == pytest.approx(recorded, rel=1e-6)
    # without the limit the probe sees the whole split (238 usable networks)
    whole = tmp_path / "whole"
    shutil.copytree(tmp_path / "ssl", whole)
    best = torch.load(whole / "best.pt", weights_only=False)  # the run's config, as zoo eval reads it
    best["config"]["options"]["train_limit"] = None
    torch.save(best, whole / "best.pt")
    evaluate_run(whole, store.root)
    assert probed[-1] == CLASSES * PER_CLASS - len(DIVERGED)
    # a run whose limit kept the first networks gets a note: its probe's selection is not reproduced
    del best["config"]["train_limit_selects"]
    best["config"]["options"]["train_limit"] = 40
    torch.save(best, whole / "best.pt")
    assert "the probe now fits on the spread selection" in evaluate_run(whole, store.root)["note"]
