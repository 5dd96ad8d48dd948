"""``zoo train --workers 2``: Ray Train data-parallel training matches single-process training, also
when the run is killed mid-training and resumed."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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

COMMON = dict(model="dwsnet", epochs=3, lr=1e-3, batch_size=16, hidden_channels=8, bn=False, augment=True,
              progress=False)
ROOT = Path(__file__).resolve().parent.parent


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it (Linux ``/proc``): the driver, Ray's daemons, the workers."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo += children.get(tree[-1], [])
    return tree


def kill_data_parallel_run_mid_training(store, out: Path) -> int:
    """Start ``zoo train --workers 2`` and SIGKILL all its processes at once (a lost node) after the
    first epoch's checkpoint; the epoch it was saved after."""
    command = [sys.executable, "-m", "cli", "train", str(store), "--out", str(out), "--epochs", str(COMMON["epochs"]),
               "--lr", "1e-3", "--batch-size", "16", "--hidden-channels", "8", "--no-bn", "--workers", "2"]
    run = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    saved = out / "checkpoints" / "lr0.001-seed0.pt"
    while not saved.exists():
        assert run.poll() is None, "the data-parallel run ended before it could be killed"
        time.sleep(0.01)
    for pid in process_tree(run.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    run.wait()
    state = torch.load(saved, weights_only=False)
    assert state["status"] == "training" and len(state["random"]) == 2  # both workers' generators
    return state["values"]["epoch"]


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


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the run's processes in /proc")
def test_two_ray_workers_killed_and_resumed_match_single_process_training(tiny_store, tmp_path, monkeypatch):
    single = train_run(TrainOptions(store=str(tiny_store), out=str(tmp_path / "single"), **COMMON), log=lambda *_: None)
    out = tmp_path / "ddp"
    epoch = kill_data_parallel_run_mid_training(tiny_store, out)
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:9")  # another cluster named (nothing there): a local one starts
    t0 = time.perf_counter()
    dist = train_run(TrainOptions(store=str(tiny_store), out=str(out), workers=2, **COMMON), log=lambda *_: None)
    seconds = time.perf_counter() - t0
    print(f"2 Ray Train workers, resumed after epoch {epoch}: {seconds:.0f} s")
    if epoch < COMMON["epochs"]:
        assert f"resuming lr 0.001, seed 0 after epoch {epoch} of {COMMON['epochs']}" in (out / "train.log").read_text()
    assert not (out / "checkpoints").exists()

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


def _diverging_worker(rank: int, world: int, port: int, results) -> None:
    """One gloo worker of ``train(shard=...)`` on a batch whose first network is NaN: only rank 0's shard
    (rows ``0::2``) holds it, so only rank 0's loss is not finite."""
    import datetime

    import torch.distributed as dist

    from dws.tasks.objectives import get_task
    from dws.tasks.trainer import Diverged, TrainConfig, train

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=20))
    try:
        torch.manual_seed(0)

        class Flat(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = torch.nn.Linear(6, 3)

            def forward(self, ws):
                return self.linear(ws.weights[0].flatten(1))

        model = torch.nn.parallel.DistributedDataParallel(Flat())
        weights = torch.randn(8, 2, 3)
        weights[0] = float("nan")
        batch = Batch(WeightSpace((weights,), (torch.randn(8, 2),)), torch.arange(8) % 3, torch.arange(8))
        loaders = {"train": [batch], "val": [batch], "test": [batch]}
        try:
            train(model, get_task("classify", None), loaders, TrainConfig(epochs=1, progress=False),
                  shard=(rank, world))
            results.put((rank, "trained", ""))
        except Diverged as e:
            results.put((rank, "diverged", str(e)))
        except Exception as e:  # noqa: BLE001 (a gloo timeout: the other worker stopped alone)
            results.put((rank, type(e).__name__, str(e)))
    finally:
        dist.destroy_process_group()


def test_a_loss_that_diverges_on_one_worker_stops_every_worker():
    """Before, the worker whose shard gave a NaN loss raised alone and the other waited in DDP's gradient
    all-reduce (until gloo's timeout, 30 min by default); the lr search could not go on."""
    import multiprocessing
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    workers = [ctx.Process(target=_diverging_worker, args=(rank, 2, port, results)) for rank in range(2)]
    for w in workers:
        w.start()
    outcome = dict((rank, (kind, message)) for rank, kind, message in (results.get(timeout=120) for _ in workers))
    for w in workers:
        w.join(timeout=30)
    assert outcome[0][0] == "diverged" and "training loss is nan" in outcome[0][1], outcome
    assert outcome[1][0] == "diverged" and "not finite on another worker" in outcome[1][1], outcome
