"""Train many classifiers as one computation: stacked parameters, batched matmuls, one Adam.

Each network has its own initialization, classes, data order, dropout masks and hyperparameters
(:mod:`zoo.train.runs`), its own loss (the sum over networks is differentiated, so each gradient
is its network's) and its share of one :class:`~zoo.fit.adam.MaskedAdam` (elementwise, so equal to
a ``torch.optim.Adam`` per network). Networks are trained ``group`` at a time (those of one
activation together); the grouping changes speed only.

A network whose loss or gradient turns non-finite at step ``t`` stops there: it keeps the
parameters it had (finite: no update with a non-finite gradient is ever applied), every
checkpoint from step ``t`` on holds them and is marked diverged, and the caller reports it. On a
CPU, denormal floats are flushed to zero while training (x86 computes on them ~100x slower):
ReLU zoos were checked to produce none, sigmoid and GELU runs a few (~1 in 10^5 gradient values).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ..fit.adam import MaskedAdam
from .data import ClassifierData, batch_plan, normalized, pool_size
from .evaluate import accuracy
from .mlp import MlpSpec, backward, forward_train, get_activation, init_params
from .runs import DROPOUT_STREAM, RunSettings, stream_seed
from .schedule import ADAM_BETAS, ADAM_EPS, TrainSchedule

Tensor = torch.Tensor
CPU_GROUP_INPUT_BYTES = 24 << 20  # a group's gathered inputs per step on a CPU (fits the last-level cache)


@dataclass
class Checkpoints:
    """One run's stored networks, in step order."""

    run: RunSettings
    steps: list[int]
    weights: list[np.ndarray]  # per layer [C, d_m, d_{m-1}] float32
    biases: list[np.ndarray]  # per layer [C, d_m]
    train_loss: np.ndarray  # [C] mean batch loss since the previous checkpoint (see window_losses)
    diverged_at: int | None  # first step whose loss or gradient was non-finite
    test_accuracy: np.ndarray | None = None  # [C], NaN where diverged

    def status(self, c: int) -> str:
        return "diverged" if self.diverged_at is not None and self.steps[c] >= self.diverged_at else "ok"


def default_group(schedule: TrainSchedule, input_size: int, device) -> int:
    """Networks trained together: on a CPU as many as keep a step's inputs in cache (at most 16),
    on a GPU all of them."""
    if torch.device(device).type != "cpu":
        return 1 << 30
    per_network = schedule.batch_size * input_size * 4
    return max(1, min(16, 2 ** int(math.log2(max(1, CPU_GROUP_INPUT_BYTES // per_network)))))


@contextlib.contextmanager
def flushed_denormals(device):
    """Flush denormals to zero on a CPU while the block runs (back to IEEE behaviour after it)."""
    cpu = torch.device(device).type == "cpu"
    if cpu:
        torch.set_flush_denormal(True)
    try:
        yield
    finally:
        if cpu:
            torch.set_flush_denormal(False)


def train_runs(spec: MlpSpec, data: ClassifierData, runs: list[RunSettings], schedule: TrainSchedule,
               device="cpu", group: int | None = None, evaluate: bool = True,
               progress: Callable[[float], None] | None = None) -> list[Checkpoints]:
    """Train ``runs`` and return their checkpoints (with test accuracies unless ``evaluate=False``).

    ``progress(fraction)`` is called after every training step and every run tested, with the share
    of the work done (:class:`WorkMeter`)."""
    if data.input_size != spec.widths[0]:
        raise ValueError(f"the networks take {spec.widths[0]} inputs but the images have {data.input_size} values "
                         f"({'x'.join(map(str, data.image_shape))}); pick a data set of the kind's image size")
    device = torch.device(device)
    group = group or default_group(schedule, data.input_size, device)
    results: list[Checkpoints | None] = [None] * len(runs)
    meter = WorkMeter(progress, data, runs, schedule, evaluate)
    with flushed_denormals(device):
        x_train = normalized(data, "train", device)
        for activation in dict.fromkeys(r.activation for r in runs):  # one activation per group
            members = [i for i, r in enumerate(runs) if r.activation == activation]
            for s in range(0, len(members), group):
                part = members[s : s + group]
                for i, result in zip(part, _train_group(spec, x_train, data.train_labels, [runs[i] for i in part],
                                                        schedule, device, meter.training(part))):
                    results[i] = result
    if evaluate:  # IEEE arithmetic, as anyone re-evaluating a stored network gets it
        evaluate_checkpoints(data, results, device, meter.tested)
    return results


class WorkMeter:
    """Turns steps and tested runs into the share of :func:`train_runs`' work done, for its
    ``progress`` callback. Work is counted in images through a network: a training step is a batch
    forward and backward (3 batches' worth), testing a run is its checkpoints times its classes'
    test images (measured: testing takes ~60% of a Fashion-MNIST trajectory zoo's time, ~15% of
    binary CIFAR-10 classifiers'; this counts ~62% and ~8%)."""

    def __init__(self, progress, data: ClassifierData, runs: list[RunSettings], schedule: TrainSchedule,
                 evaluate: bool):
        self.progress = progress
        steps = [schedule.total_steps(pool_size(data.train_labels, r.classes)) for r in runs]
        self.train_work = [3 * schedule.batch_size * t for t in steps]
        self.test_work = {r.run: len(schedule.checkpoint_steps(t)) * pool_size(data.test_labels, r.classes) if evaluate
                          else 0 for r, t in zip(runs, steps)}
        self.total = max(1, sum(self.train_work) + sum(self.test_work.values()))
        self.done = 0

    def training(self, members: list[int]):
        """``report(share)`` for a group of runs (by position) trained together, or None."""
        if self.progress is None:
            return None
        start, work = self.done, sum(self.train_work[i] for i in members)
        self.done += work
        return lambda share: self.progress((start + share * work) / self.total)

    def tested(self, run: RunSettings) -> None:
        if self.progress is not None:
            self.done += self.test_work[run.run]
            self.progress(self.done / self.total)


def class_loss_and_grad(out: Tensor, class_index: Tensor | None, targets: Tensor) -> tuple[Tensor, Tensor]:
    """Per-network cross-entropy ``[K]`` over the logits of each network's classes, and its gradient
    with respect to ``out`` ``[K, B, d_M]``. ``class_index`` ``[K, c]`` (None: all logits, in order);
    ``targets`` ``[K, B]``: the position of the label among the classes, -1 for padding."""
    K, B, _ = out.shape
    chosen = out if class_index is None else out.gather(2, class_index.unsqueeze(1).expand(K, B, -1))
    logp = torch.log_softmax(chosen, dim=2)
    valid = targets >= 0
    target = targets.clamp_min(0).unsqueeze(2)
    count = valid.sum(dim=1).clamp_min(1).to(out.dtype)
    nll = -logp.gather(2, target).squeeze(2)
    loss = torch.where(valid, nll, torch.zeros_like(nll)).sum(dim=1) / count
    grad = logp.exp_()
    grad.scatter_add_(2, target, torch.full_like(target, -1, dtype=out.dtype))
    grad.mul_((valid.to(out.dtype) / count.unsqueeze(1)).unsqueeze(2))
    if class_index is not None:
        grad = torch.zeros_like(out).scatter_(2, class_index.unsqueeze(1).expand(K, B, -1), grad)
    return loss, grad


def _dropout_masks(runs, generators, spec: MlpSpec, batch: int, device) -> list[Tensor] | None:
    """Each hidden layer's scaled masks ``[K, B, d_m]``; every network draws its own, every step,
    whether or not it still trains, so the draws do not depend on the group."""
    if all(g is None for g in generators):
        return None
    masks = []
    for width in spec.widths[1:-1]:
        mask = torch.ones(len(runs), batch, width)
        for k, (run, gen) in enumerate(zip(runs, generators)):
            if gen is not None:
                keep = torch.rand(batch, width, generator=gen) >= run.dropout
                mask[k] = keep.to(torch.float32) / (1.0 - run.dropout)
        masks.append(mask.to(device))
    return masks


def _train_group(spec: MlpSpec, x_train: Tensor, labels: np.ndarray, runs: list[RunSettings],
                 schedule: TrainSchedule, device, progress: Callable[[float], None] | None = None) -> list[Checkpoints]:
    K, B = len(runs), schedule.batch_size
    activation = get_activation(runs[0].activation)
    plans = [batch_plan(r, labels, schedule) for r in runs]
    total = [p.steps for p in plans]
    T = max(total)
    indices = torch.zeros(K, T, B, dtype=torch.int64)
    targets = torch.full((K, T, B), -1, dtype=torch.int64)
    for k, p in enumerate(plans):
        indices[k, : p.steps] = torch.from_numpy(p.indices)
        targets[k, : p.steps] = torch.from_numpy(p.targets)
    indices, targets = indices.to(device), targets.to(device)
    all_classes = all(r.classes == tuple(range(spec.num_classes)) for r in runs)
    class_index = None if all_classes else torch.tensor([r.classes for r in runs], device=device)

    weights, biases = init_params(spec, [r.seed for r in runs], [r.init_scale for r in runs])
    weights = [w.to(device) for w in weights]
    biases = [b.to(device) for b in biases]
    same_lr = all(r.lr == schedule.lr for r in runs)
    lr = schedule.lr if same_lr else torch.tensor([r.lr for r in runs], dtype=torch.float64)
    decay = 0.0 if all(r.weight_decay == 0 for r in runs) else \
        torch.tensor([r.weight_decay for r in runs], device=device)
    opt = MaskedAdam(weights + biases, lr=lr, betas=ADAM_BETAS, eps=ADAM_EPS, weight_decay=decay)
    generators = [torch.Generator().manual_seed(stream_seed(r.seed, DROPOUT_STREAM)) if r.dropout > 0 else None
                  for r in runs]

    wanted = [schedule.checkpoint_steps(t) for t in total]
    taken: list[list[tuple[list[Tensor], list[Tensor]]]] = [[] for _ in runs]

    def snapshot(k: int) -> None:
        taken[k].append(([w[k].to("cpu", copy=True) for w in weights], [b[k].to("cpu", copy=True) for b in biases]))

    for k in range(K):
        if wanted[k][0] == 0:
            snapshot(k)
    losses = torch.full((K, T), float("nan"))
    diverged_at: list[int | None] = [None] * K
    active = torch.ones(K, dtype=torch.bool)
    ends = torch.tensor(total)
    # buffers reused every step: the inputs of all K networks and the gradients
    x = torch.empty(K * B, spec.widths[0], device=device)
    grad_w, grad_b = [torch.empty_like(w) for w in weights], [torch.empty_like(b) for b in biases]
    with torch.no_grad():
        for t in range(T):
            running = active & (t < ends)
            if not bool(running.any()):
                break
            torch.index_select(x_train, 0, indices[:, t].reshape(-1), out=x)
            masks = _dropout_masks(runs, generators, spec, B, device)
            out, cache = forward_train(weights, biases, x.view(K, B, -1), activation, masks)
            loss, grad_out = class_loss_and_grad(out, class_index, targets[:, t])
            backward(weights, cache, grad_out, activation, out=(grad_w, grad_b))
            finite = torch.isfinite(loss)
            for g in grad_w + grad_b:
                finite &= torch.isfinite(g.flatten(1).sum(dim=1))
            finite = finite.cpu()
            losses[:, t] = loss.cpu()
            for k in (running & ~finite).nonzero().flatten().tolist():
                diverged_at[k] = t
                active[k] = False
            moving = running & finite
            opt.step(grad_w + grad_b, active=None if bool(moving.all()) else moving.to(device))
            for k in moving.nonzero().flatten().tolist():
                if len(taken[k]) < len(wanted[k]) and wanted[k][len(taken[k])] == t + 1:
                    snapshot(k)
            if progress is not None:
                progress((t + 1) / T)
    for k in range(K):  # a diverged network keeps its last parameters in its remaining checkpoints
        while len(taken[k]) < len(wanted[k]):
            snapshot(k)
    return [
        Checkpoints(
            run=runs[k], steps=wanted[k],
            weights=[torch.stack([c[0][m] for c in taken[k]]).numpy() for m in range(spec.num_layers)],
            biases=[torch.stack([c[1][m] for c in taken[k]]).numpy() for m in range(spec.num_layers)],
            train_loss=window_losses(losses[k].numpy(), wanted[k], plans[k].pass_steps, diverged_at[k]),
            diverged_at=diverged_at[k],
        )
        for k in range(K)
    ]


def window_losses(losses: np.ndarray, steps: list[int], pass_steps: int, diverged_at: int | None = None) -> np.ndarray:
    """Per checkpoint, the mean batch loss of the steps since the previous checkpoint (for the
    first one: of the last pass over the data before it); NaN for step 0 and for checkpoints of a
    diverged run from its divergence on."""
    out = np.full(len(steps), np.nan, np.float32)
    for c, step in enumerate(steps):
        start = steps[c - 1] if c > 0 else max(0, step - pass_steps)
        if step > start and (diverged_at is None or step < diverged_at):
            out[c] = np.float32(losses[start:step].astype(np.float64).mean())
    return out


def evaluate_checkpoints(data: ClassifierData, results: list[Checkpoints], device="cpu",
                         tested: Callable[[RunSettings], None] | None = None) -> None:
    """Fill every checkpoint's test accuracy on the official test images of its run's classes
    (``tested(run)`` after each run)."""
    device = torch.device(device)
    x_test = normalized(data, "test", device)
    labels = torch.tensor(data.test_labels, device=device)
    selected = None
    for r in sorted(results, key=lambda r: r.run.classes):  # each class subset is gathered once
        classes = torch.tensor(r.run.classes, device=device)
        if selected is None or selected[0] != r.run.classes:
            rows = torch.isin(labels, classes)
            selected = (r.run.classes, x_test if bool(rows.all()) else x_test[rows], labels[rows])
        _, x, y = selected
        activation = get_activation(r.run.activation)
        r.test_accuracy = np.full(len(r.steps), np.nan, np.float32)
        for c in range(len(r.steps)):
            if r.status(c) == "ok":
                w = [torch.from_numpy(a[c]).to(device) for a in r.weights]
                b = [torch.from_numpy(a[c]).to(device) for a in r.biases]
                r.test_accuracy[c] = np.float32(accuracy(w, b, activation, x, y, classes))
        if tested is not None:
            tested(r.run)
