"""How a memory budget (``--max-memory``) is split between what a training or an evaluation holds.

Besides the runtime (:data:`zoo.options.RUNTIME_BYTES`) a process holds, at most at once:

* **the model**: its parameters, and when training their gradients, AdamW's two moments, the best
  epoch's copy and the state being checkpointed (:data:`TRAINING_MODEL_COPIES`); evaluating, the
  parameters and the state dict they were loaded from (:data:`EVAL_MODEL_COPIES`);
* **batches**: the one being trained on, the next one being cut, and the copies an augmentation or
  a flattening model makes (:data:`BATCH_COPIES`);
* **activations**: at the batch size, the model's forward and (training) backward, from what
  autograd saves on a probe forward and the model's measured peak factor (:func:`activation_bytes`);
* **chunks being read**: a chunk's bytes as read and its values (:data:`CHUNK_COPIES`), before
  they are copied into a window or a split (one per loader worker process);
* **the data**: what is left. The splits are served in order -- the trained one first, then
  validation, then test -- and each is held whole if it fits in what the earlier ones left.
  A split that does not fit streams: an evaluated one chunk by chunk (the chunk above is all it
  holds), the trained one through shuffle windows of as many whole chunks as fit in what is left
  (shared by the windows in flight: one being cut into batches and, per loader worker, one being
  built and one queued), after which nothing is left for validation and test, which stream.

The plan decides the data order (in memory: a permutation of the whole split; streaming: of each
window), so it is part of a run's settings, and it is computed from the split sizes, the chunk
size, the batch size and the model only: the same command trains the same way on any machine.
That is why the activations are counted in the plan on every device; only the refusal leaves them
out where they live in an accelerator's memory. Processes that share one budget (``zoo train
--workers N``: Ray workers on one machine) each plan an equal share of it, after the driver's runtime.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from dws.weightspace import WeightSpace
from zoo.options import RUNTIME_BYTES, format_size, require_memory
from zoo.store import WeightStore
from zoo.store.format import layers_from_arrays, parameter_shapes, values_per_network

BATCH_COPIES = 4
CHUNK_COPIES = 2
TRAINING_MODEL_COPIES = 6
EVAL_MODEL_COPIES = 2
# Activations: the tensors autograd saves in a probe forward of PROBE_NETWORKS networks, scaled to the
# batch (linear in it; a part that is not, e.g. position encodings, only makes this larger), times the
# model's peak factor: what a training step (the backward's gradients, the forward's temporaries) or a
# no-grad forward holds at most over the saved bytes (dws.tasks.options.ACTIVATION_PEAK, measured)
PROBE_NETWORKS = 2


def network_bytes(store: WeightStore) -> int:
    """One network's parameters in memory (float32)."""
    return 4 * values_per_network(store.manifest)


def windows_in_flight(workers: int) -> int:
    """Shuffle windows held at once: one being cut into batches, and per worker one built, one queued."""
    return 1 + 2 * workers


def window_chunks(data_bytes: int, chunk_bytes: int, workers: int = 0) -> int:
    """Whole chunks per shuffle window when ``data_bytes`` hold every window in flight (at least one)."""
    return max(1, data_bytes // (windows_in_flight(workers) * chunk_bytes))


@dataclass(frozen=True)
class SplitPlan:
    """How one split is served: held whole, or streamed in windows of ``buffer_chunks`` chunks."""

    in_memory: bool
    buffer_chunks: int
    held: int  # bytes of networks it holds at most (the split, or its windows in flight)

    def loader_options(self) -> dict:
        return {"in_memory": self.in_memory, "buffer_chunks": self.buffer_chunks}

    def describe(self, name: str) -> str:
        if self.in_memory:
            return f"{name} in memory ({format_size(self.held)})"
        if self.held:
            return f"{name} streamed in windows of {self.buffer_chunks} chunk(s)"
        return f"{name} streamed chunk by chunk"


@dataclass(frozen=True)
class MemoryPlan:
    """The budget's split (module docstring): ``fixed`` parts, then each split's share of the rest.
    ``budget``: this process's share of ``total`` (``sharers`` processes plan one budget each)."""

    budget: int
    fixed: dict[str, int]
    splits: dict[str, SplitPlan]
    total: int | None = None  # the --max-memory asked for (None: ``budget``)
    sharers: int = 1

    @property
    def peak(self) -> int:
        """The most the process holds by this accounting: the fixed parts, every split held in memory,
        and the largest streaming split's windows (streaming splits are read one after another)."""
        streamed = [s.held for s in self.splits.values() if not s.in_memory]
        return (sum(self.fixed.values()) + sum(s.held for s in self.splits.values() if s.in_memory)
                + max(streamed, default=0))

    def describe(self) -> str:
        """One line for the log: the activations, how each split is served, the accounted peak and
        the budget (a worker's share of it)."""
        served = ", ".join(plan.describe(name) for name, plan in self.splits.items())
        activations = next((f"{name} {format_size(size)}, " for name, size in self.fixed.items()
                            if name.startswith("activations")), "")
        budget = f"--max-memory {format_size(self.budget)}"
        if self.sharers > 1:
            budget = (f"{format_size(self.budget)}, the share of each of {self.sharers} workers of "
                      f"--max-memory {format_size(self.total)}")
        return f"memory: {activations}{served}; {format_size(self.peak)} of {budget} accounted"


def worker_budget(budget: int, workers: int) -> int:
    """Each of ``workers`` processes' share of one ``budget``: what the driver's runtime leaves, split
    equally (one process: the whole budget)."""
    return budget if workers <= 1 else max(0, budget - RUNTIME_BYTES) // workers


def plan_memory(budget: int, store: WeightStore, networks: dict[str, int], *, shuffled: str | None,
                batch_size: int, model_bytes: int, training: bool, workers: int = 0, activations: int = 0,
                activations_on_host: bool = True, sharers: int = 1, extra: dict[str, int] | None = None,
                flag: str = "--max-memory") -> MemoryPlan:
    """Split ``budget`` bytes for reading ``networks`` (``{split: count}``, in the order served) of
    ``store``; ``shuffled``: the split trained on (read in shuffled order), if any; ``workers``: loader
    worker processes; ``activations``: :func:`activation_bytes` at ``batch_size`` (always planned, so
    the plan is the same on every device; ``activations_on_host=False``: the model runs on an
    accelerator, and a budget is not refused for them); ``sharers``: processes (Ray workers) that
    share ``budget``, each planning :func:`worker_budget`; ``extra``: a command's own fixed parts
    (``{what: bytes}``). ValueError in one line, with the minimum, when the budget cannot hold the
    fixed parts and one window of one chunk."""
    per_network = network_bytes(store)
    chunk = store.chunk_size * per_network
    total, budget = budget, worker_budget(budget, sharers)
    fixed = {
        "the runtime": RUNTIME_BYTES,
        "the model": model_bytes * (TRAINING_MODEL_COPIES if training else EVAL_MODEL_COPIES),
        f"batches of {batch_size}": BATCH_COPIES * batch_size * per_network,
        "chunks being read": CHUNK_COPIES * max(1, workers) * chunk,
    }
    if activations:
        fixed[f"activations of {batch_size}"] = activations
    fixed.update(extra or {})
    least = {name: size for name, size in fixed.items() if activations_on_host or not name.startswith("activations")}
    if workers or (shuffled is not None and networks[shuffled] * per_network > budget - sum(fixed.values())):
        least["windows of one chunk"] = windows_in_flight(workers) * chunk  # (with workers, evaluated splits too)
    what = f"{'training' if training else 'evaluating'} on {store.root.name} (chunks of {format_size(chunk)})"
    if sharers > 1:  # the minimum of the whole budget: the driver's runtime and every worker's least
        least = {"the driver's runtime": RUNTIME_BYTES, **{f"{sharers} x {name}": sharers * size
                                                            for name, size in least.items()}}
        what += f" on {sharers} workers"
    require_memory(flag, total, least, what)
    left = max(0, budget - sum(fixed.values()))  # (negative only for activations held on an accelerator)
    splits = {}
    for name, count in networks.items():
        size = count * per_network
        if size <= left:
            splits[name] = SplitPlan(True, 1, size)
            left -= size
        elif name == shuffled:
            chunks = window_chunks(left, chunk, workers)
            splits[name] = SplitPlan(False, chunks, windows_in_flight(workers) * chunks * chunk)
            left = 0
        else:  # one chunk at a time: no window beyond the chunk being read, except the workers' queue
            splits[name] = SplitPlan(False, 1, windows_in_flight(workers) * chunk if workers else 0)
    return MemoryPlan(budget, fixed, splits, total, sharers)


def model_bytes(model) -> int:
    """Bytes of a module's parameters and buffers."""
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


def activation_bytes(model: torch.nn.Module, widths, batch_size: int, peak: float, forwards: int = 1) -> int:
    """Bytes the activations of ``forwards`` forward passes of ``model`` on ``batch_size`` networks of
    ``widths`` hold at most: ``peak`` (training or evaluating: module comment) times the bytes of the
    tensors autograd saves for the backward. Counted, not sampled from the allocator, so the same on
    every machine: a probe forward of :data:`PROBE_NETWORKS` random networks through a copy of the
    model (its batch-norm statistics and the global random generators untouched) records every saved
    tensor other than parameters, buffers and the input (counted in the model and the batches)."""
    probe = copy.deepcopy(model).train()
    generator = torch.Generator().manual_seed(0)
    weights, biases = layers_from_arrays({name: torch.randn((PROBE_NETWORKS, *shape), generator=generator)
                                          for name, shape in parameter_shapes(widths).items()})
    ws = WeightSpace(tuple(weights), tuple(biases))
    held_elsewhere = {tensor.untyped_storage().data_ptr()
                      for tensor in (*probe.parameters(), *probe.buffers(), *weights, *biases)}
    saved = {}  # storage address -> (bytes, the tensor: kept, so that no address is reused during the probe)

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in held_elsewhere:
            saved[storage.data_ptr()] = (storage.nbytes(), tensor)
        return tensor

    with torch.random.fork_rng(devices=[]), torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        probe(ws)
    per_network = sum(size for size, _ in saved.values()) / PROBE_NETWORKS
    return int(per_network * batch_size * forwards * peak)
