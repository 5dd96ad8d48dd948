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

On a GPU nothing in the step loop waits for the device (``sync_free``): losses, divergence and
the still-training mask stay there and are read when the group ends; a checkpoint is one copy per
layer of every network into a buffer on the device (:class:`CheckpointBuffer`), which the test
evaluation reads in place before one copy per layer to the host. On a CPU the loop reads the mask
every step, which costs nothing there and lets Adam take its every-network-moves path.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ..devices import free_gpu_bytes
from ..fit.adam import MaskedAdam
from .data import ClassifierData, batch_plan, class_pool, normalized, pool_size
from .evaluate import stack_accuracies
from .mlp import MlpSpec, backward, forward_train, get_activation, init_params
from .runs import DROPOUT_STREAM, RunSettings, stream_seed
from .schedule import ADAM_BETAS, ADAM_EPS, TrainSchedule

Tensor = torch.Tensor
CPU_GROUP_INPUT_BYTES = 24 << 20  # a group's gathered inputs per step on a CPU (fits the last-level cache)
GPU_GROUP_SHARE = 0.5  # of a GPU's free memory, what a group may take while it trains


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


def network_bytes(spec: MlpSpec, schedule: TrainSchedule, steps: int, checkpoints: int) -> int:
    """Device memory one network takes while its group trains: parameters, gradients, Adam's two
    moments and two temporaries, its checkpoints, a step's activations, its batch plan."""
    params = sum(o * i + o for i, o in zip(spec.widths[:-1], spec.widths[1:]))
    B = schedule.batch_size
    activations = B * (spec.widths[0] + 4 * sum(spec.widths[1:]))
    return 4 * (params * (6 + checkpoints) + activations) + 16 * steps * B


def default_group(schedule: TrainSchedule, input_size: int, device, spec: MlpSpec | None = None,
                  steps: int = 0, checkpoints: int = 1) -> int:
    """Networks trained together: on a CPU as many as keep a step's inputs in cache (at most 16);
    on a GPU as many as fit in :data:`GPU_GROUP_SHARE` of its free memory (:func:`network_bytes`;
    all of them without ``spec``)."""
    device = torch.device(device)
    if device.type == "cuda" and spec is not None:
        budget = int(GPU_GROUP_SHARE * free_gpu_bytes(device))
        return max(1, budget // network_bytes(spec, schedule, steps, checkpoints))
    if device.type != "cpu":
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


HostArrays = tuple[list[np.ndarray], list[np.ndarray]]  # per-layer weights [N, d_m, d_{m-1}], biases [N, d_m]


def host_arrays(spec: MlpSpec, count: int, device="cpu") -> HostArrays:
    """Room for ``count`` networks on the host, float32: page-locked when they come from a GPU (the
    copies then run at the bus's speed), ordinary memory on a CPU or where pinning fails."""
    shapes = ([(count, o, i) for i, o in zip(spec.widths[:-1], spec.widths[1:])],
              [(count, o) for o in spec.widths[1:]])
    if torch.device(device).type == "cuda":
        try:
            return tuple([torch.empty(s, pin_memory=True).numpy() for s in part] for part in shapes)
        except RuntimeError:
            pass
    return tuple([np.empty(s, np.float32) for s in part] for part in shapes)


def train_runs(spec: MlpSpec, data: ClassifierData, runs: list[RunSettings], schedule: TrainSchedule,
               device="cpu", group: int | None = None, evaluate: bool = True,
               progress: Callable[[float], None] | None = None, out: HostArrays | None = None,
               sync_free: bool | None = None) -> list[Checkpoints]:
    """Train ``runs`` and return their checkpoints (with test accuracies unless ``evaluate=False``).

    Every run's checkpoints are consecutive rows, in run order, of one array per layer: ``out``
    (:func:`host_arrays`) where given, so that a caller storing them all copies nothing.
    ``progress(fraction)`` is called after every training step and every run tested, with the share
    of the work done (:class:`WorkMeter`). ``sync_free`` (default: on a GPU) keeps the step loop's
    bookkeeping on the device; the results are the same either way."""
    if data.input_size != spec.widths[0]:
        raise ValueError(f"the networks take {spec.widths[0]} inputs but the images have {data.input_size} values "
                         f"({'x'.join(map(str, data.image_shape))}); pick a data set of the kind's image size")
    device = torch.device(device)
    sync_free = device.type != "cpu" if sync_free is None else sync_free
    meter = WorkMeter(progress, data, runs, schedule, evaluate)
    counts = [len(schedule.checkpoint_steps(t)) for t in meter.steps]
    first_row = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).tolist()
    out = out or host_arrays(spec, first_row[-1], device)
    if len(out[0][0]) != first_row[-1]:
        raise ValueError(f"out has room for {len(out[0][0])} networks, the runs have {first_row[-1]} checkpoints")
    with flushed_denormals(device):
        x_train = normalized(data, "train", device)
    group = group or default_group(schedule, data.input_size, device, spec, max(meter.steps, default=0),
                                   max(counts, default=1))
    results: list[Checkpoints | None] = [None] * len(runs)
    for activation in dict.fromkeys(r.activation for r in runs):  # one activation per group
        members = [i for i, r in enumerate(runs) if r.activation == activation]
        for s in range(0, len(members), group):
            part = members[s : s + group]
            with flushed_denormals(device):
                trained = _train_group(spec, x_train, data.train_labels, [runs[i] for i in part], schedule, device,
                                       meter.training(part), sync_free)
            rows = [first_row[i] for i in part]
            copying = trained.copy_to(out, rows)
            # IEEE arithmetic (denormals kept), as anyone re-evaluating a stored network gets it
            accuracy = trained.test_accuracy(data, device) if evaluate else None
            if copying is not None:
                copying.synchronize()
            for k, i in enumerate(part):
                results[i] = trained.checkpoints(k, out, rows[k], None if accuracy is None else accuracy[k])
                if evaluate:
                    meter.tested(runs[i])
    return results


def class_counts(labels: np.ndarray, runs: list[RunSettings]) -> list[int]:
    """Each run's number of images of its classes (:func:`~zoo.train.data.pool_size`), counted
    once per class set: 5,000 CIFAR-10 runs have 45 pairs, and a count reads every label."""
    counts = {classes: pool_size(labels, classes) for classes in dict.fromkeys(r.classes for r in runs)}
    return [counts[r.classes] for r in runs]


class WorkMeter:
    """Turns steps and tested runs into the share of :func:`train_runs`' work done, for its
    ``progress`` callback. Work is counted in images through a network: a training step is a batch
    forward and backward (3 batches' worth), testing a run is its checkpoints times its classes'
    test images (measured: testing takes ~60% of a Fashion-MNIST trajectory zoo's time, ~15% of
    binary CIFAR-10 classifiers'; this counts ~62% and ~8%)."""

    def __init__(self, progress, data: ClassifierData, runs: list[RunSettings], schedule: TrainSchedule,
                 evaluate: bool):
        self.progress = progress
        train, test = class_counts(data.train_labels, runs), class_counts(data.test_labels, runs)
        self.steps = steps = [schedule.total_steps(n) for n in train]  # each run's steps
        self.train_work = [3 * schedule.batch_size * t for t in steps]
        self.test_work = {r.run: len(schedule.checkpoint_steps(t)) * n if evaluate else 0
                          for r, t, n in zip(runs, steps, test)}
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
    whether or not it still trains, so the draws do not depend on the group. Drawn on the CPU (a
    GPU's generator draws others) and sent to a GPU without waiting for it."""
    if all(g is None for g in generators):
        return None
    cuda = torch.device(device).type == "cuda"
    masks = []
    for width in spec.widths[1:-1]:
        mask = torch.ones(len(runs), batch, width, pin_memory=cuda)
        for k, (run, gen) in enumerate(zip(runs, generators)):
            if gen is not None:
                keep = torch.rand(batch, width, generator=gen) >= run.dropout
                mask[k] = keep.to(torch.float32) / (1.0 - run.dropout)
        masks.append(mask.to(device, non_blocking=cuda))
    return masks


class CheckpointBuffer:
    """A group's checkpoints as training reaches them: per layer ``[K, C, ...]`` on the training
    device (C: the most checkpoints of a run), one copy per layer at a checkpoint step."""

    def __init__(self, weights: list[Tensor], biases: list[Tensor], wanted: list[list[int]]):
        K, C, device = len(wanted), max(len(w) for w in wanted), weights[0].device
        self.weights = [torch.empty(K, C, *w.shape[1:], device=device) for w in weights]
        self.biases = [torch.empty(K, C, *b.shape[1:], device=device) for b in biases]
        slots: dict[int, list[tuple[int, int]]] = {}
        for k, steps in enumerate(wanted):
            for c, step in enumerate(steps):
                slots.setdefault(step, []).append((k, c))
        self.slots = {}  # step -> (None, c): every network's slot c; else (networks, slots) as index tensors
        for step, pairs in sorted(slots.items()):
            ks, cs = zip(*pairs)
            every = ks == tuple(range(K)) and len(set(cs)) == 1
            self.slots[step] = (None, cs[0]) if every else (torch.tensor(ks, device=device),
                                                            torch.tensor(cs, device=device))

    def take(self, step: int, weights: list[Tensor], biases: list[Tensor]) -> None:
        """The parameters as checkpoint ``step`` of every run that keeps one there."""
        slot = self.slots.pop(step, None)
        if slot is None:
            return
        ks, cs = slot
        for buffer, p in zip(self.weights + self.biases, weights + biases):
            if ks is None:
                buffer[:, cs].copy_(p)
            else:
                buffer[ks, cs] = p[ks]

    def take_rest(self, weights: list[Tensor], biases: list[Tensor]) -> None:
        """The checkpoints training did not reach (every network stopped early): the last parameters."""
        for step in list(self.slots):
            self.take(step, weights, biases)


@dataclass
class TrainedGroup:
    """A group's checkpoints as trained, still on the training device (:class:`CheckpointBuffer`)."""

    runs: list[RunSettings]
    steps: list[list[int]]  # each run's checkpoint steps
    weights: list[Tensor]  # per layer [K, C, d_m, d_{m-1}]; run k fills its first len(steps[k])
    biases: list[Tensor]
    losses: np.ndarray  # [K, T] every step's batch loss
    diverged_at: list[int | None]
    pass_steps: list[int]

    def ok(self) -> np.ndarray:
        """bool ``[K, C]``: the checkpoint exists and its network had not diverged."""
        C = self.weights[0].shape[1]
        return np.array([[c < len(s) and (d is None or s[c] < d) for c in range(C)]
                         for s, d in zip(self.steps, self.diverged_at)], dtype=bool)

    def test_accuracy(self, data: ClassifierData, device) -> np.ndarray:
        """float32 ``[K, C]``, NaN where not :meth:`ok`: the group's checkpoints evaluated together
        where they are, those of the same classes as one stack."""
        K, C = self.weights[0].shape[:2]
        chosen = np.flatnonzero(self.ok().reshape(-1))
        weights, biases = [w.flatten(0, 1) for w in self.weights], [b.flatten(0, 1) for b in self.biases]
        if len(chosen) < K * C:
            index = torch.from_numpy(chosen).to(weights[0].device)
            weights, biases = [w.index_select(0, index) for w in weights], [b.index_select(0, index) for b in biases]
        accuracy = np.full(K * C, np.nan, np.float32)
        classes = [self.runs[i // C].classes for i in chosen]
        activation = get_activation(self.runs[0].activation)
        accuracy[chosen] = stack_accuracies(data, weights, biases, activation, classes, device).numpy()
        return accuracy.reshape(K, C)

    def copy_to(self, out: HostArrays, rows: list[int]) -> torch.cuda.Stream | None:
        """Run k's checkpoints to ``out``'s rows from ``rows[k]`` on: one copy per layer where the runs
        are consecutive there and have as many checkpoints each, else one per run and layer. From a
        GPU the copies run on a stream of their own, beside the evaluation: synchronize the stream
        returned before reading ``out``."""
        K, C = self.weights[0].shape[:2]
        whole = all(len(s) == C for s in self.steps) and rows == list(range(rows[0], rows[0] + K * C, C))
        device = self.weights[0].device
        stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(device))  # the buffers are complete
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            for host, trained in zip(out[0] + out[1], self.weights + self.biases):
                if whole:
                    torch.from_numpy(host[rows[0] : rows[0] + K * C]).copy_(trained.flatten(0, 1), non_blocking=True)
                else:
                    for k, (row, steps) in enumerate(zip(rows, self.steps)):
                        torch.from_numpy(host[row : row + len(steps)]).copy_(trained[k, : len(steps)],
                                                                              non_blocking=True)
        return stream

    def checkpoints(self, k: int, out: HostArrays, row: int, accuracy: np.ndarray | None) -> Checkpoints:
        """Run k's :class:`Checkpoints`, its parameters as views of ``out`` (after :meth:`copy_to`)."""
        C = len(self.steps[k])
        return Checkpoints(
            run=self.runs[k], steps=self.steps[k],
            weights=[w[row : row + C] for w in out[0]], biases=[b[row : row + C] for b in out[1]],
            train_loss=window_losses(self.losses[k], self.steps[k], self.pass_steps[k], self.diverged_at[k]),
            diverged_at=self.diverged_at[k],
            test_accuracy=None if accuracy is None else accuracy[:C].copy(),
        )


def _train_group(spec: MlpSpec, x_train: Tensor, labels: np.ndarray, runs: list[RunSettings],
                 schedule: TrainSchedule, device, progress: Callable[[float], None] | None = None,
                 sync_free: bool = False) -> TrainedGroup:
    """Train ``runs`` (one activation) together; ``sync_free``: never read the device in the loop."""
    K, B = len(runs), schedule.batch_size
    activation = get_activation(runs[0].activation)
    pools = {classes: class_pool(labels, classes) for classes in dict.fromkeys(r.classes for r in runs)}
    plans = [batch_plan(r, labels, schedule, pools[r.classes]) for r in runs]
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
    params = weights + biases
    same_lr = all(r.lr == schedule.lr for r in runs)
    lr = schedule.lr if same_lr else torch.tensor([r.lr for r in runs], dtype=torch.float64,
                                                  device=device if sync_free else "cpu")  # scaled where it is
    # weight decay (torch.optim.Adam's L2 term: grad + wd * param) is added below, not by the
    # optimizer, whose test for all-zero rates would read the device every step
    decay = None if all(r.weight_decay == 0 for r in runs) else \
        torch.tensor([r.weight_decay for r in runs], device=device)
    opt = MaskedAdam(params, lr=lr, betas=ADAM_BETAS, eps=ADAM_EPS)
    generators = [torch.Generator().manual_seed(stream_seed(r.seed, DROPOUT_STREAM)) if r.dropout > 0 else None
                  for r in runs]

    wanted = [schedule.checkpoint_steps(t) for t in total]
    book = CheckpointBuffer(weights, biases, wanted)
    book.take(0, weights, biases)
    losses = torch.full((K, T), float("nan"), device=device)
    diverged_at = torch.full((K,), -1, dtype=torch.int64, device=device)
    active = torch.ones(K, dtype=torch.bool, device=device)
    ends = torch.tensor(total, device=device)
    # buffers reused every step: the inputs of all K networks and the gradients
    x = torch.empty(K * B, spec.widths[0], device=device)
    grad_w, grad_b = [torch.empty_like(w) for w in weights], [torch.empty_like(b) for b in biases]
    grads = grad_w + grad_b
    with torch.no_grad():
        for t in range(T):
            running = active & (t < ends)
            if not sync_free and not bool(running.any()):
                break
            torch.index_select(x_train, 0, indices[:, t].reshape(-1), out=x)
            masks = _dropout_masks(runs, generators, spec, B, device)
            out, cache = forward_train(weights, biases, x.view(K, B, -1), activation, masks)
            loss, grad_out = class_loss_and_grad(out, class_index, targets[:, t])
            backward(weights, cache, grad_out, activation, out=(grad_w, grad_b))
            sums = torch.stack([loss] + [g.flatten(1).sum(dim=1) for g in grads], dim=1)
            finite = torch.isfinite(sums).all(dim=1)  # the loss and every gradient tensor's sum
            losses[:, t] = loss
            stops = running & ~finite
            diverged_at.masked_fill_(stops, t)
            active &= ~stops
            moving = running & finite
            if decay is not None:
                for g, p in zip(grads, params):
                    g.addcmul_(p, decay.view(-1, *[1] * (p.dim() - 1)))
            if not sync_free and bool(moving.all()):
                opt.step(grads)
            else:  # the optimizer scales a still network's update by 0, and a non-finite one's would be NaN
                still = ~moving
                for g in grads:
                    g.masked_fill_(still.view(-1, *[1] * (g.dim() - 1)), 0.0)
                opt.step(grads, active=moving)
            book.take(t + 1, weights, biases)
            if progress is not None:
                progress((t + 1) / T)
    book.take_rest(weights, biases)  # a network that stopped keeps its last parameters
    return TrainedGroup(runs, wanted, book.weights, book.biases, losses.cpu().numpy(),
                        [None if d < 0 else d for d in diverged_at.tolist()], [p.pass_steps for p in plans])


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
