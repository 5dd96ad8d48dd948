"""Data-parallel ``zoo train --workers N`` on Ray Train (``TorchTrainer``, DDP; gloo on CPU, NCCL on GPU).

Every worker prepares the run and runs the whole protocol (:func:`dws.tasks.protocol.fit_run`: lr search,
seeds, early stopping) with the same seed, so each builds the same model and iterates the same
deterministic batch order (and augmentation draws) as ``--workers 1``. The model is wrapped in
DDP by ``ray.train.torch.prepare_model``; worker ``rank`` trains on rows ``rank::N`` of every batch,
its shard-mean loss weighted by ``rows * N / batch`` so that DDP's gradient average is exactly the
whole batch's mean-loss gradient (:func:`dws.tasks.trainer.shard_batch`). Parameters therefore stay
equal to single-process training up to float reduction order. Every worker evaluates the full
validation and test splits (the parameters are the same everywhere), so model selection agrees
without communication; rank 0 writes the run directory with :func:`dws.tasks.rundir.write_run`, the
state dict unwrapped from DDP. The driver prepares the run once before the workers start, so what
:mod:`dws.tasks.prepare` refuses is refused before anything is written, and a model's derived store
(``mlp-align``) is made once.

Not equivalent to single-process training: batch-norm statistics are per shard (as in standard
DDP; ``SyncBatchNorm`` is refused by DDP on CPU, and the DWSNet's fused BN+ReLU does not go
through ``nn.BatchNorm`` modules anyway), dropout masks, SSL's NT-Xent (negatives come from the
shard only), and batches shorter than ``N`` rows, which are skipped.

An interrupted run resumes like a single-process one (:mod:`dws.tasks.checkpoint`): rank 0 writes
each training's checkpoint after every epoch (every rank's random generators gathered into it),
every rank loads it on the rerun. The driver checks the settings and, with ``--restart``, discards
the old checkpoints before any worker starts; the workers then only resume.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from zoo.store.location import store_root

from .options import TrainOptions, default_run_dir
from .prepare import prepare_run
from .protocol import fit_run, format_report
from .rundir import write_run
from .trainer import train


def _worker(config: dict) -> None:
    """Ray Train's per-worker loop."""
    import ray.train
    import ray.train.torch

    torch.set_num_threads(1)
    opts: TrainOptions = config["opts"]
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    log_path = Path(opts.out) / "train.log"

    def log(line: str) -> None:  # worker output does not reach the driver (log_to_driver=False)
        if rank == 0:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "a") as f:
                f.write(f"{line}\n")

    def ddp_train(model, task, loaders, cfg, **kw):
        # some models leave parameters unused (the DWSNet's B2B / W2W ablations), which plain DDP refuses
        model = ray.train.torch.prepare_model(model, parallel_strategy_kwargs={"find_unused_parameters": True})
        result = train(model, task, loaders, replace(cfg, device=str(device), progress=False), shard=(rank, world),
                       **kw)
        result.state_dict = {k.removeprefix("module."): v for k, v in result.state_dict.items()}
        return result

    run = prepare_run(replace(opts, progress=False), log)
    outcome = fit_run(run, log, train_fn=ddp_train, shard=(rank, world))
    if rank == 0:
        write_run(run, outcome, log)


def train_distributed(opts: TrainOptions, log=print) -> dict:
    """``train_run`` with ``opts.workers`` Ray Train workers (joining ``opts.address`` if given)."""
    if opts.workers < 2:
        raise ValueError(f"train_distributed needs workers >= 2, got {opts.workers}")
    # the workers' working directory is Ray's, not ours: absolute paths only
    run_dir = Path(opts.out or default_run_dir(opts)).resolve()
    opts = replace(opts, store=str(store_root(opts.store).resolve()), out=str(run_dir))
    run = prepare_run(opts, log)  # refusals before anything is written; a derived store (mlp-align) made once
    if not opts.resume:  # start over here, once: the workers only resume what the driver kept
        run.checkpoints.clear()
        opts = replace(opts, resume=True)

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig, TrainingFailedError
    from ray.train.torch import TorchConfig, TorchTrainer

    if not run.checkpoints.unfinished():  # a resumed run's worker log goes on
        (run_dir / "train.log").unlink(missing_ok=True)
    (run_dir / "metrics.json").unlink(missing_ok=True)  # so a stale one is never mistaken for this run's

    use_gpu = torch.cuda.is_available()
    started = False
    if not ray.is_initialized():
        quiet = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
        if opts.address:
            ray.init(address=opts.address, **quiet)
        else:  # a local single-node cluster of its own ("local": not one RAY_ADDRESS or a `ray start` names)
            # on loopback, with a CPU slot per worker even on small machines
            ray.init(address="local", num_cpus=max(os.cpu_count() or 1, opts.workers), _node_ip_address="127.0.0.1",
                     **quiet)
        started = True
    log(f"data-parallel training on {opts.workers} Ray Train workers ({'nccl, GPU' if use_gpu else 'gloo, CPU'}); "
        f"worker log: {run_dir / 'train.log'}")
    t0 = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="zoo-ray-train-") as storage:
            trainer = TorchTrainer(
                _worker,
                train_loop_config={"opts": opts},
                scaling_config=ScalingConfig(num_workers=opts.workers, use_gpu=use_gpu),
                torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
                run_config=RunConfig(name=f"zoo-train-{run_dir.name}", storage_path=storage,
                                     failure_config=FailureConfig(max_failures=0)),
            )
            try:
                trainer.fit()
            except TrainingFailedError as e:
                raise RuntimeError(f"data-parallel training on {opts.workers} workers failed "
                                   f"(worker log: {run_dir / 'train.log'}):\n{e}") from e
    finally:
        if started:
            ray.shutdown()
    metrics_path = run_dir / "metrics.json"
    if not metrics_path.exists():
        raise RuntimeError(f"the workers finished but rank 0 wrote no {metrics_path} (on a multi-node cluster, "
                           f"--out must be a folder every node shares)")
    metrics = json.loads(metrics_path.read_text())
    log(f"{opts.model} on {Path(opts.store).name} ({opts.task}, {opts.workers} workers, "
        f"{time.perf_counter() - t0:.0f} s): test {format_report(run.task, metrics['test'])} -> {run_dir}")
    return {"run_dir": str(run_dir), **metrics}
