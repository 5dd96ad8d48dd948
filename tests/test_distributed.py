"""``zoo train --workers 2``: Ray Train data-parallel training matches single-process training."""

import json
import time

import numpy as np
import pytest
import torch

from dws.stream.batch import Batch
from dws.tasks.options import TrainOptions
from dws.tasks.run import train_run
from dws.tasks.rundir import evaluate_run
from dws.tasks.trainer import shard_batch
from dws.weightspace import WeightSpace

pytest.importorskip("ray.train.torch")

COMMON = dict(model="dwsnet", epochs=2, lr=1e-3, batch_size=16, hidden_channels=8, bn=False, augment=True,
              progress=False)


def test_shards_weight_to_the_whole_batch_mean():
    n, world = 7, 3
    batch = Batch(WeightSpace((torch.randn(n, 2, 3),), (torch.randn(n, 2),)), torch.arange(n), torch.arange(n))
    shards = [shard_batch(batch, r, world) for r in range(world)]
    assert sorted(torch.cat([s.index for s, _ in shards]).tolist()) == list(range(n))
    values = torch.randn(n)
    # the mean over workers of weighted shard means is the batch mean
    mean = sum(w * values[s.index].mean() for s, w in shards) / world
    assert mean.item() == pytest.approx(values.mean().item(), abs=1e-6)
    assert shard_batch(batch.take(torch.arange(2)), 2, world) == (None, 0.0)


def test_two_ray_workers_match_single_process_training(tiny_store, tmp_path):
    single = train_run(TrainOptions(store=str(tiny_store), out=str(tmp_path / "single"), **COMMON), log=lambda *_: None)
    t0 = time.perf_counter()
    dist = train_run(TrainOptions(store=str(tiny_store), out=str(tmp_path / "ddp"), workers=2, **COMMON),
                     log=lambda *_: None)
    seconds = time.perf_counter() - t0
    print(f"2 Ray Train workers: {seconds:.0f} s")

    out = tmp_path / "ddp"
    for name in ("config.json", "metrics.json", "best.pt", "curve.png"):
        assert (out / name).stat().st_size > 0
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["test"] == dist["test"]

    # same per-epoch train losses and validation metrics, same selected epoch
    for a, b in zip(single["history"][0], dist["history"][0], strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-4)
    assert single["best_epoch"] == dist["best_epoch"]
    assert single["test"][0]["accuracy"] == pytest.approx(dist["test"][0]["accuracy"], abs=1e-6)

    # the same parameters, saved without DDP's "module." prefix
    a = torch.load(tmp_path / "single" / "best.pt", weights_only=False)["state_dict"]
    b = torch.load(out / "best.pt", weights_only=False)["state_dict"]
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k].numpy(), b[k].numpy(), rtol=1e-4, atol=1e-5, err_msg=k)

    again = evaluate_run(out, tiny_store)
    assert again["accuracy"] == pytest.approx(dist["test"][0]["accuracy"], abs=1e-6)
