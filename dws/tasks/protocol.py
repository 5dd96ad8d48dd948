"""The paper's protocol: pick the learning rate on validation, then report mean ± std over seeds.

:func:`fit_run` applies it to a prepared run with any training function (the plain loop, or a
data-parallel worker's); writing the outcome is :mod:`dws.tasks.rundir`'s. Every (lr, seed)
training has its checkpoint in the run directory (:class:`dws.tasks.checkpoint.RunCheckpoints`):
a rerun of an interrupted run reuses the trainings that finished and continues the one that was
cut off after its last completed epoch.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np
import torch

from .allocator import retain_freed_memory
from .objectives import Task
from .prepare import PreparedRun
from .trainer import Diverged, TrainConfig, TrainResult, train

PAPER_LRS = (5e-3, 1e-3, 5e-4, 1e-4)


def run_protocol(
    fit: Callable[[TrainConfig], TrainResult],
    task: Task,
    config: TrainConfig,
    lrs=PAPER_LRS,
    seeds: int = 3,
    log: Callable[[str], None] = print,
) -> dict:
    """``fit(config)`` trains one model; returns the search, per-seed results and the summary.

    A candidate lr whose training diverges (a non-finite loss) is out of the search, recorded as None,
    and the others go on; only if every candidate diverges is the run refused."""
    search = {}
    best_lr, best_val, best_result = None, None, None
    for lr in lrs:
        try:
            result = fit(replace(config, lr=lr, seed=config.seed))
        except FloatingPointError as e:
            search[str(lr)] = None
            log(f"lr {lr:g}: diverged ({e}); left out of the search")
            continue
        val = result.best_val[task.metric]
        search[str(lr)] = val
        log(f"lr {lr:g}: val {task.metric} {val:.4f}")
        if task.better(val, best_val):
            best_lr, best_val, best_result = lr, val, result
    if best_result is None:
        raise ValueError(f"every candidate learning rate ({', '.join(f'{lr:g}' for lr in lrs)}) diverged; "
                         f"pass a smaller --lr")
    runs = [best_result] + [fit(replace(config, lr=best_lr, seed=config.seed + s)) for s in range(1, seeds)]
    return summarize(task, best_lr, config.seed, runs, search)


def fit_run(run: PreparedRun, log=print, train_fn=train, shard: tuple[int, int] = (0, 1)) -> dict:
    """Train ``run`` with ``train_fn`` (its lr search or fixed lr, its seeds): :func:`summarize`'s outcome.

    ``train_fn(model, task, loaders, config, log=, checkpoint=)`` trains one model;
    ``shard=(rank, world)``: this process among data-parallel workers (rank 0 writes checkpoints).
    """
    opts, task = run.opts, run.task
    if torch.device(run.device).type == "cpu":
        retain_freed_memory()  # ~20% faster DWSNet steps: no page faults for re-allocated activations
    rank, world = shard
    resumed = run.checkpoints.unfinished()
    if resumed:
        log(f"resuming the unfinished run in {run.run_dir} ({len(resumed)} training(s) saved; "
            f"--restart starts over)")
    run.checkpoints.begin(writer=rank == 0)
    # every training's (seconds, completed epochs), lr search included, across resumes (checkpoints keep them)
    spent: list[tuple[float, int]] = []

    def fit(config: TrainConfig) -> TrainResult:
        try:
            result = fit_one(config)
        except Diverged as e:
            spent.append((e.seconds, len(e.history)))
            raise
        spent.append((result.seconds, len(result.history)))
        return result

    def fit_one(config: TrainConfig) -> TrainResult:
        checkpoint = run.checkpoints.training(config.lr, config.seed, rank, world)
        outcome = checkpoint.outcome()
        if outcome is not None and "diverged" in outcome:
            log(f"{checkpoint.label}: diverged before the interruption, not trained again")
            raise Diverged(outcome["diverged"], outcome["history"], outcome["seconds"])
        if outcome is not None:
            result = TrainResult(**outcome)
            log(f"{checkpoint.label}: finished before the interruption, reused (val {task.metric} "
                f"{result.best_val[task.metric]:.4f} at epoch {result.best_epoch + 1})")
            return result
        torch.manual_seed(config.seed)
        model, desc = run.build_model(log)
        log(f"{opts.model}: {desc['params']:,} parameters; lr {config.lr:g}, seed {config.seed}")
        try:
            result = train_fn(model, task, run.loaders(config.seed), config, log=log, checkpoint=checkpoint)
        except Diverged as e:  # its outcome: what it did before diverging
            checkpoint.finish({"diverged": str(e), "history": e.history, "seconds": e.seconds})
            raise
        result.description = desc
        checkpoint.finish(vars(result))
        return result

    base = TrainConfig(epochs=opts.epochs, lr=opts.lr or PAPER_LRS[0], seed=opts.seed, device=run.device,
                       patience=opts.patience, progress=opts.progress, compile=opts.compile,
                       precision=opts.precision, weight_decay=opts.weight_decay, warmup_steps=opts.warmup_steps,
                       clip_grad=opts.clip_grad, amsgrad=opts.amsgrad, checkpoint_minutes=opts.checkpoint_minutes)
    if opts.lr is None:
        outcome = run_protocol(fit, task, base, seeds=opts.seeds, log=log)
    else:
        outcome = summarize(task, opts.lr, opts.seed,
                            [fit(replace(base, seed=opts.seed + s)) for s in range(opts.seeds)], None)
    return {**outcome, "training_seconds": sum(s for s, _ in spent), "training_epochs": sum(e for _, e in spent)}


def summarize(task: Task, lr: float, first_seed: int, runs: list[TrainResult], search: dict | None) -> dict:
    """Per-seed validation/test metrics and their mean ± std (runs use seeds first_seed, +1, ...)."""
    tests = np.array([r.test[task.metric] for r in runs])
    return {
        "lr": lr,
        "lr_search": search,
        "seeds": [first_seed + s for s in range(len(runs))],
        "test": [r.test for r in runs],
        "val": [r.best_val for r in runs],
        "summary": {task.metric: {"mean": float(tests.mean()), "std": float(tests.std())}},
        "results": runs,
    }


def format_report(task: Task, per_seed: list[dict]) -> str:
    """The task's reported metrics (:meth:`Task.reported`, the paper's units) over seed runs, e.g.
    ``100×MSE 2.4620 ± 0.1000, Kendall τ 0.7780 ± 0.0100 (3 seeds)``; mean and std as :func:`summarize`."""
    parts = []
    for r in task.reported():
        values = np.array([r.of(m) for m in per_seed if r.key in m], dtype=float)
        if len(values):
            text = format_summary({"mean": float(values.mean()), "std": float(values.std())}, len(values))
            parts.append(f"{r.label} {text.rsplit(' (', 1)[0]}")
    seeds = "one seed" if len(per_seed) == 1 else f"{len(per_seed)} seeds"
    return f"{', '.join(parts)} ({seeds})"


def format_summary(summary: dict, num_seeds: int) -> str:
    """``mean ± std (N seeds)``, or ``mean (one seed)``: a std over one seed is no spread."""
    if num_seeds == 1:
        return f"{summary['mean']:.4f} (one seed)"
    return f"{summary['mean']:.4f} ± {summary['std']:.4f} ({num_seeds} seeds)"
