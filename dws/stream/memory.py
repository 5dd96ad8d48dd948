"""How a memory budget (``--max-memory``) is split between what a training or an evaluation holds.

Besides the runtime (:data:`zoo.options.RUNTIME_BYTES`) a process holds, at most at once:

* **the model**: its parameters, and when training their gradients, AdamW's two moments, the best
  epoch's copy and the state being checkpointed (:data:`TRAINING_MODEL_COPIES`); evaluating, the
  parameters and the state dict they were loaded from (:data:`EVAL_MODEL_COPIES`);
* **batches**: the one being trained on, the next one being cut, and the copies an augmentation or
  a flattening model makes (:data:`BATCH_COPIES`);
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
"""

from __future__ import annotations

from dataclasses import dataclass

from zoo.options import RUNTIME_BYTES, format_size, require_memory
from zoo.store import WeightStore
from zoo.store.format import values_per_network

BATCH_COPIES = 4
CHUNK_COPIES = 2
TRAINING_MODEL_COPIES = 6
EVAL_MODEL_COPIES = 2


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
    """The budget's split (module docstring): ``fixed`` parts, then each split's share of the rest."""

    budget: int
    fixed: dict[str, int]
    splits: dict[str, SplitPlan]

    @property
    def peak(self) -> int:
        """The most the process holds by this accounting: the fixed parts, every split held in memory,
        and the largest streaming split's windows (streaming splits are read one after another)."""
        streamed = [s.held for s in self.splits.values() if not s.in_memory]
        return (sum(self.fixed.values()) + sum(s.held for s in self.splits.values() if s.in_memory)
                + max(streamed, default=0))

    def describe(self) -> str:
        """One line for the log: the budget, the accounted peak, how each split is served."""
        served = ", ".join(plan.describe(name) for name, plan in self.splits.items())
        return f"memory: {served}; {format_size(self.peak)} of --max-memory {format_size(self.budget)} accounted"


def plan_memory(budget: int, store: WeightStore, networks: dict[str, int], *, shuffled: str | None,
                batch_size: int, model_bytes: int, training: bool, workers: int = 0,
                flag: str = "--max-memory") -> MemoryPlan:
    """Split ``budget`` bytes for reading ``networks`` (``{split: count}``, in the order served) of
    ``store``; ``shuffled``: the split trained on (read in shuffled order), if any. ValueError in one
    line, with the minimum, when the budget cannot hold the fixed parts and one window of one chunk."""
    per_network = network_bytes(store)
    chunk = store.chunk_size * per_network
    fixed = {
        "the runtime": RUNTIME_BYTES,
        "the model": model_bytes * (TRAINING_MODEL_COPIES if training else EVAL_MODEL_COPIES),
        f"batches of {batch_size}": BATCH_COPIES * batch_size * per_network,
        "chunks being read": CHUNK_COPIES * max(1, workers) * chunk,
    }
    least = dict(fixed)
    if workers or (shuffled is not None and networks[shuffled] * per_network > budget - sum(fixed.values())):
        least["windows of one chunk"] = windows_in_flight(workers) * chunk  # (with workers, evaluated splits too)
    what = f"{'training' if training else 'evaluating'} on {store.root.name} (chunks of {format_size(chunk)})"
    require_memory(flag, budget, least, what)
    left = budget - sum(fixed.values())
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
    return MemoryPlan(budget, fixed, splits)


def model_bytes(model) -> int:
    """Bytes of a module's parameters and buffers."""
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
