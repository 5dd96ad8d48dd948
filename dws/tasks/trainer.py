"""The training loop shared by every model and task: AdamW, per-epoch validation, best checkpoint.

Model selection follows the paper's protocol: the validation metric picks the best epoch (early
stopping), and the test metrics reported are those of that epoch's parameters.

Batch norm's running statistics are an exponential average over training batches: augmented
inputs, and weights that moved during the epoch. Evaluated with them, DWSNet's validation accuracy
swings by 10 points from one epoch to the next. With a ``calibrate`` loader (un-augmented training
networks) the statistics are re-estimated before every evaluation as an exact average over it
("precise BN"), and the checkpoint keeps them (docs/train.md).

With a :class:`~dws.tasks.checkpoint.Checkpoint`, the loop saves its whole state after every epoch
(model, optimizer, every loader's position, the random generators, its own bookkeeping) and, when
the checkpoint holds a state, continues from it: the result equals an uninterrupted training's.
An epoch that runs longer than ``checkpoint_minutes`` is also saved within it, after a step: a rerun
then skips the batches that epoch already trained on (the loader still reads them: an epoch's batches
and augmentation draws are a function of its seed and number) and goes on with the next step, so a
machine that is taken away every few hours still finishes epochs of many hours.
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, NamedTuple

import numpy as np
import torch
from tqdm import tqdm

from dws.weightspace import WeightSpace
from zoo import cpuinfo

from .checkpoint import Captured, Checkpoint, global_random_state, set_global_random_state
from .objectives import Task

Tensor = torch.Tensor


@dataclass
class TrainConfig:
    epochs: int = 10
    lr: float = 1e-3
    weight_decay: float = 5e-4
    seed: int = 0
    patience: int | None = None  # stop after this many epochs without a better validation metric
    device: str = "cpu"
    progress: bool = True
    temperature: float = 0.1  # NT-Xent, SSL only
    compile: bool = False  # the training forward through torch.compile; evaluation stays eager
    precision: str = "fp32"  # the training step's arithmetic (AUTOCAST_DTYPES); evaluation stays float32
    warmup_steps: int = 0  # the lr of step k (from 1) is lr * min(1, k / warmup_steps)
    clip_grad: float | None = None  # the gradients' global L2 norm clipped to this before every step
    amsgrad: bool = False  # AdamW's AMSGrad variant
    # with a checkpoint: within an epoch, the state is also saved after the first step that ends this many
    # minutes after the last save (None: after every epoch only)
    checkpoint_minutes: float | None = 10.0


def warmed_up_lr(config: TrainConfig, step: int) -> float:
    """The lr of optimizer step ``step`` (1, 2, ...): raised linearly over ``warmup_steps``, as the neural
    graphs' and ScaleGMN's reference code (``WarmupLRScheduler``) does; ``config.lr`` without warmup."""
    return config.lr * min(1.0, step / config.warmup_steps) if config.warmup_steps else config.lr


class Diverged(FloatingPointError):
    """A training whose loss turned non-finite, with what it had done: its completed epochs' ``history`` and
    its ``seconds`` (the lr search records and counts them, and a rerun does not train it again)."""

    def __init__(self, message: str, history: list[dict], seconds: float):
        super().__init__(message)
        self.history, self.seconds = history, seconds


class Predictions(NamedTuple):
    """A split's model outputs, its targets, and the store rows (``index``) they belong to, in loader order."""

    output: Tensor
    target: Tensor
    index: Tensor


@dataclass
class TrainResult:
    best_epoch: int
    best_val: dict
    test: dict
    history: list[dict] = field(default_factory=list)
    state_dict: dict | None = None
    seconds: float = 0.0
    description: dict | None = None  # the model's (name, parameter count), set by the protocol
    test_predictions: Predictions | None = None  # the selected epoch's, on the test split


def _to(batch, device):
    return batch.ws.to(device), batch.target.to(device)


def shard_batch(batch, rank: int, world: int):
    """Rows ``rank::world`` of ``batch`` and the weight of their mean loss (None, 0 if ``batch`` is too short).

    With the weight ``rows * world / len(batch)``, the workers' average of the weighted shard-mean
    gradients (what DDP all-reduces) is the gradient of the whole batch's mean loss, even when
    ``world`` does not divide the batch.
    """
    n = len(batch)
    if n < world:
        return None, 0.0
    rows = torch.arange(rank, n, world)
    return batch.take(rows), len(rows) * world / n


def _length(loader) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None


def _stage(loader: Iterable, desc: str, config) -> Iterable:
    """``loader`` behind a transient progress bar named ``desc`` (off with the training's bar)."""
    return tqdm(loader, desc=desc, unit="batch", leave=False, total=_length(loader), disable=not config.progress,
                dynamic_ncols=True)


@torch.no_grad()
def predict(model, loader: Iterable, device: str) -> Predictions:
    model.eval()
    outs, targets, index = [], [], []
    for batch in loader:
        ws, target = _to(batch, device)
        outs.append(model(ws).float().cpu())
        targets.append(target.cpu())
        index.append(batch.index)
    return Predictions(torch.cat(outs), torch.cat(targets), torch.cat(index))


def batch_norms(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's batch norms: in training they take their statistics over the batch."""
    return [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]


def least_batch(model: torch.nn.Module, task: Task) -> tuple[int, str | None]:
    """The fewest networks a training batch needs, and why where it is more than one: batch norm's
    statistics of a single network are meaningless (PyTorch's raises on one; DWSNet's would normalize
    each network by itself), and NT-Xent needs other networks as negatives (its loss on one is 0)."""
    if batch_norms(model):
        return 2, "has batch norm, which takes its statistics over the batch (of one network they are meaningless)"
    if task.name == "ssl":
        return 2, "trains with NT-Xent, which needs other networks of the batch as negatives"
    return 1, None


@torch.no_grad()
def recalibrate_batchnorm(model: torch.nn.Module, loader: Iterable, device: str) -> bool:
    """Set every batch norm's running statistics to their average over ``loader``'s batches.

    The rest of the model runs in eval mode (dropout off), as it will be evaluated. Returns
    False (and changes nothing) if the model has no batch norm.
    """
    norms = batch_norms(model)
    if not norms or not all(m.track_running_stats for m in norms):
        return False
    was_training, momenta = model.training, [m.momentum for m in norms]
    model.eval()
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative average: every batch counts equally
        m.train()
    for batch in loader:
        if len(batch) > 1:  # batch norm cannot take statistics of one network (it raises)
            model(batch.ws.to(device))
    for m, momentum in zip(norms, momenta):
        m.momentum = momentum
    model.train(was_training)
    return True


def evaluate(model, task: Task, loader: Iterable, device: str, probe_train: Iterable | None = None) -> dict:
    """Metrics of ``model`` on ``loader``; a task with a probe (SSL) also gets ``probe_train``'s outputs."""
    if task.outputs_weights:  # its outputs are networks, judged by running them
        return task.evaluate(model, loader, device)
    return score(model, task, predict(model, loader, device), device, probe_train)


def score(model, task: Task, predictions: Predictions, device: str, probe_train: Iterable | None = None) -> dict:
    """The task's metrics of ``predictions`` (made by ``model``, which also runs the probe if the task has one)."""
    probe = predict(model, probe_train, device)[:2] if task.probe else None
    return task.metrics(predictions.output, predictions.target, probe)


def compiled(model: torch.nn.Module, device: str) -> torch.nn.Module:
    """``torch.compile(model)``, refused in one line where it cannot work: on a CPU, inductor builds the
    step's kernels with a C++ compiler, and without one the first step fails deep inside torch."""
    if torch.device(device).type == "cpu":
        names = [os.environ["CXX"]] if os.environ.get("CXX") else ["g++", "c++", "clang++"]
        if not any(shutil.which(name) for name in names):
            raise ValueError(f"--compile on a CPU needs a C++ compiler (torch.compile builds the training step "
                             f"with it): none found ({', '.join(names)}); install one, or train without --compile")
    return torch.compile(model)


# --precision: the dtype the training step's products run in under torch.autocast (None: plain float32).
# Parameters, their gradients, AdamW's state and every evaluation stay float32; losses run in float32, other
# ops follow their inputs' dtype (docs/train.md, "Precision"). bfloat16 has float32's exponent range, so no
# loss scaling is needed
AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16}

# the CPU flags of native bfloat16 products: without one, oneDNN emulates them and bf16 steps run several times
# slower than fp32 ones (2026-12-07, an AVX2 AMD EPYC, eager steps on MNIST INR widths: DWSNet 12x, ng-gnn 7.8x)
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def slow_precision(precision: str, device: str) -> str | None:
    """Why ``precision`` is slower than fp32 on ``device`` here, or None: bf16 on a CPU whose ``/proc/cpuinfo``
    names none of :data:`NATIVE_BF16_FLAGS` (a machine without that file: None, unknown)."""
    if precision != "bf16" or torch.device(device).type != "cpu":
        return None
    have = cpuinfo.flags()
    if not have or have & set(NATIVE_BF16_FLAGS):
        return None
    return ("--precision bf16 on a CPU without native bfloat16 (no AVX512-BF16 or AMX): its steps run several "
            "times slower than fp32 ones here (ng-gnn's 7.8x on an AVX2 AMD EPYC; docs/train.md, \"Precision\")")


COMPILER_MODULES = ("torch._dynamo", "torch._inductor")  # where torch.compile's own errors are defined


@contextlib.contextmanager
def compile_errors(config: TrainConfig):
    """A failure of ``torch.compile`` to build the step (``--compile``; it surfaces at the first step, as
    a compiler error deep inside torch) as one ValueError line: the step runs eagerly without the
    option, which changes only the speed, so the same command without it resumes the run."""
    try:
        yield
    except Exception as exc:
        # told apart by the module of its class (InductorError, BackendCompilerFailed, ...): torch's compiler
        # stack has no public exception types, and importing its private modules would tie us to one version
        if not config.compile or not type(exc).__module__.startswith(COMPILER_MODULES):
            raise
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        precision = "" if config.precision == "fp32" else f" with --precision {config.precision}"
        raise ValueError(f"--compile: torch.compile could not build this model's training step{precision} "
                         f"({type(exc).__name__}: {first[:200]}); rerun the same command without --compile "
                         f"(it changes only the speed; checkpoints resume)") from exc


def step_precision(config: TrainConfig):
    """The context a training step runs in: ``torch.autocast`` to ``config.precision``'s dtype on the
    training device, or nothing for fp32. ValueError (one line) for a precision that has no dtype here."""
    if config.precision not in AUTOCAST_DTYPES:
        raise ValueError(f"--precision {config.precision!r} is not one of {', '.join(AUTOCAST_DTYPES)}")
    dtype = AUTOCAST_DTYPES[config.precision]
    return torch.autocast(torch.device(config.device).type, dtype=dtype, enabled=dtype is not None)


def train(
    model: torch.nn.Module,
    task: Task,
    loaders: dict[str, Iterable],
    config: TrainConfig,
    augment: Callable[[WeightSpace], WeightSpace] | None = None,
    log: Callable[[str], None] | None = None,
    shard: tuple[int, int] | None = None,
    checkpoint: Checkpoint | None = None,
) -> TrainResult:
    """Train on ``loaders["train"]``, select on ``loaders["val"]``, report ``loaders["test"]``.

    With ``loaders["calibrate"]``, batch-norm statistics are re-estimated on it before each
    validation (:func:`recalibrate_batchnorm`).

    ``shard=(rank, world)``: data-parallel worker ``rank`` of ``world`` (``model`` wrapped in DDP,
    see :mod:`dws.tasks.distributed`); it trains on its rows of every batch (:func:`shard_batch`,
    batches shorter than ``world`` are skipped) and records the whole batches' losses.

    ``checkpoint``: saved after every epoch, and within an epoch every ``config.checkpoint_minutes`` (data-
    parallel workers all after the same step); a training it holds is continued where it was saved (``log``
    says so). The loaders' positions are saved if they have a ``state_dict``.
    """
    torch.manual_seed(config.seed)
    device = config.device
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay, amsgrad=config.amsgrad)
    # compiled for the training step only: evaluation under no_grad would compile a second graph, and the
    # state dict stays the eager module's (same parameters, same names)
    step_model = compiled(model, device) if config.compile else model
    stateful = {"model": model, "optimizer": opt,
                **{f"loader:{name}": loader for name, loader in loaders.items() if hasattr(loader, "state_dict")}}
    # the loop's own state: epochs completed, the best so far, history, epochs without progress, time spent,
    # optimizer steps taken (for the warmup), each epoch's seconds (training and validation; for a running
    # cell's time to go, pipelines.weight_models; not in the history, which resumed and uninterrupted runs share)
    done = {"epoch": 0, "best": None, "best_state": None, "best_epoch": -1, "history": [], "stale": 0, "seconds": 0.0,
            "steps": 0, "epoch_seconds": []}
    saved = None if checkpoint is None else checkpoint.resume(stateful)
    # a save within an epoch: that epoch's batches trained on, their losses (with data-parallel workers, each
    # worker's), its seconds so far, and the random generators as they were after its last step (restored
    # once those batches are skipped)
    within, within_random = None, None
    if saved is not None:
        # saved before steps were counted: never with a warmup (LEGACY_SETTINGS); before epoch times were kept
        done = {"steps": 0, "epoch_seconds": [], **saved}
        within = done.pop("within", None)
        if within is not None:
            within_random = global_random_state()
            if within.get("start") is not None and loaders["train"].state_dict() != within["start"]:
                # read otherwise now (another memory plan): the skipped batches would not be those trained on
                if log is not None:
                    log(f"{checkpoint.label}: the train split is read {loaders['train'].state_dict().get('reading')}"
                        f" now, {within['start'].get('reading')} when epoch {done['epoch'] + 1} was saved after "
                        f"{within['batches']} batches (--max-memory and --loader-workers decide it): that epoch "
                        f"restarts from its first batch")
                within = within_random = None
        if log is not None:
            log(f"resuming {checkpoint.label} after epoch {done['epoch']} of {config.epochs}" if within is None else
                f"resuming {checkpoint.label} in epoch {done['epoch'] + 1} of {config.epochs}, after "
                f"{within['batches']} of its {within['of'] or '?'} batches")
    history = done["history"]
    # (a training loader without a saved position may not repeat its batches: saves after epochs only)
    every = None if checkpoint is None or not config.checkpoint_minutes or "loader:train" not in stateful else \
        config.checkpoint_minutes * 60
    t0 = last_save = time.perf_counter()
    # a batch of one network (a final one) is skipped where batch norm or NT-Xent needs more; other models
    # train on it (the graph models and NFNs train on batches of one, docs/train.md). Data-parallel: per worker
    least, why = least_batch(model, task)
    least_rows = least * (1 if shard is None else shard[1])
    bar = tqdm(range(done["epoch"], config.epochs), desc=f"train {task.name}", initial=done["epoch"],
               total=config.epochs, disable=not config.progress, dynamic_ncols=True)
    for epoch in bar:
        if config.patience is not None and done["stale"] >= config.patience:
            break
        model.train()
        # the training loader's position at the epoch's start: what a save within the epoch records for it
        start = loaders["train"].state_dict() if "loader:train" in stateful else None
        epoch_start = {} if start is None else {"loader:train": Captured(start)}
        skip, losses, started = 0, [], time.perf_counter()
        if within is not None:
            skip, started = within["batches"], started - within["seconds"]
            losses = list(within["losses"] if shard is None else within["losses"][shard[0]])
        batches = tqdm(loaders["train"], desc=f"epoch {epoch + 1}/{config.epochs}", unit="batch", leave=False,
                       total=_length(loaders["train"]), disable=not config.progress, dynamic_ncols=True)
        for position, batch in enumerate(batches, start=1):
            if position <= skip:  # trained on before the interruption
                continue
            if within is not None:  # whatever reading the skipped batches drew is undone
                set_global_random_state(within_random)
                within = within_random = None
            weight = 1.0
            if len(batch) < least_rows:  # (with workers: a worker's rows could be fewer)
                continue
            if shard is not None:  # (never empty: the batch has at least one row per worker)
                batch, weight = shard_batch(batch, *shard)
            ws, target = _to(batch, device)
            if augment is not None:
                ws = augment(ws)
            with compile_errors(config):  # a compiled step is built at its first forward and backward
                with step_precision(config):
                    loss = task.loss(step_model, ws, target, config.temperature)
                finite = torch.isfinite(loss.detach()).to(torch.int32)
                due = every is not None and time.perf_counter() - last_save >= every  # a save after this step
                if shard is not None:  # all workers stop at the same step (one alone would leave the others
                    # waiting in DDP's gradient all-reduce), and save after the same one (a collective call)
                    flags = torch.stack([1 - finite, torch.tensor(int(due), dtype=torch.int32, device=finite.device)])
                    torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
                    finite, due = 1 - flags[0], bool(flags[1])
                if not finite:
                    here = loss.item()
                    raise Diverged(f"epoch {epoch + 1}: training loss is "
                                   f"{here if not np.isfinite(here) else 'not finite on another worker'}; lower the "
                                   f"learning rate", history, done["seconds"] + time.perf_counter() - t0)
                opt.zero_grad(set_to_none=True)
                (loss if shard is None else loss * weight).backward()
            if config.clip_grad is not None:  # after DDP's all-reduce: every worker clips the same gradients
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip_grad)
            done["steps"] += 1
            for group in opt.param_groups:
                group["lr"] = warmed_up_lr(config, done["steps"])
            opt.step()
            losses.append(loss.item() if shard is None else loss.item() * weight / shard[1])
            if due:
                now, kept = time.perf_counter(), list(losses)
                if shard is not None:  # every worker's (rank 0 writes the file)
                    kept = [None] * shard[1]
                    torch.distributed.all_gather_object(kept, losses)
                checkpoint.save({**stateful, **epoch_start}, {
                    **done, "seconds": done["seconds"] + now - t0,
                    "within": {"batches": position, "of": _length(loaders["train"]), "losses": kept,
                               "seconds": now - started, "start": start}})
                last_save = time.perf_counter()
        if within is not None:  # saved after its last batch: nothing was left to skip
            set_global_random_state(within_random)
            within = within_random = None
        if not losses:  # (never a NaN training loss in the history, and epochs that train nothing)
            raise ValueError(f"epoch {epoch + 1}: no batch was trained on: the model trains on batches of "
                             f"{least} or more networks{' per worker' if shard is not None else ''}"
                             f"{f' (it {why})' if why else ''}; raise --batch-size")
        if shard is not None:  # the sum over workers of their weighted shard losses: each whole batch's loss
            summed = torch.tensor(losses, dtype=torch.float64, device=device)
            torch.distributed.all_reduce(summed)
            losses = summed.tolist()
        # the work between epochs shows on a bar of its own (it can take as long as the epoch)
        if "calibrate" in loaders:
            recalibrate_batchnorm(model, _stage(loaders["calibrate"], f"epoch {epoch + 1}: batch-norm statistics",
                                                config), device)
        val_loader = loaders["val"] if task.outputs_weights else _stage(loaders["val"],
                                                                        f"epoch {epoch + 1}: validation", config)
        val = evaluate(model, task, val_loader, device, loaders.get("probe"))
        history.append({"epoch": epoch, "train_loss": float(np.mean(losses)), **{f"val_{k}": v for k, v in val.items()}})
        best = done["best"]
        if task.better(val[task.metric], None if best is None else best[task.metric]):
            done.update(best=val, best_epoch=epoch, stale=0, best_state=copy.deepcopy(model.state_dict()))
        else:
            done["stale"] += 1
        done["epoch"] = epoch + 1
        done["epoch_seconds"].append(time.perf_counter() - started)
        if checkpoint is not None:
            checkpoint.save(stateful, {**done, "seconds": done["seconds"] + time.perf_counter() - t0})
            last_save = time.perf_counter()
        bar.set_postfix(loss=f"{history[-1]['train_loss']:.3f}", **{f"val_{task.metric}": f"{val[task.metric]:.4f}"})
    bar.close()
    model.load_state_dict(done["best_state"])
    if task.outputs_weights:  # judged by running the adapted networks; no per-network predictions
        test, predictions = evaluate(model, task, loaders["test"], device), None
    else:
        predictions = predict(model, loaders["test"], device)
        test = score(model, task, predictions, device, loaders.get("probe"))
    return TrainResult(done["best_epoch"], done["best"], test, history, done["best_state"],
                       done["seconds"] + time.perf_counter() - t0, test_predictions=predictions)
