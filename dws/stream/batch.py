"""What the loader yields: a batch of networks, their targets and their store indices."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from dws.weightspace import WeightSpace
from zoo.store.format import arrays_from_layers, layers_from_arrays

Tensor = torch.Tensor


@dataclass(frozen=True)
class Batch:
    """``ws`` holds ``B`` networks, ``target[i]`` and ``index[i]`` (row in the store) describe network ``i``.

    Also the unit that loader workers hand to the main process (a whole shuffle window), which is
    why it can be sliced and concatenated cheaply.
    """

    ws: WeightSpace
    target: Tensor
    index: Tensor

    def __len__(self) -> int:
        return self.index.shape[0]

    def _map(self, fn) -> "Batch":
        return Batch(self.ws.map(fn), fn(self.target), fn(self.index))

    def slice(self, start: int, stop: int) -> "Batch":
        """Rows ``start..stop-1`` as views (no copy)."""
        return self._map(lambda t: t[start:stop])

    def take(self, rows: Tensor) -> "Batch":
        return self._map(lambda t: t.index_select(0, rows))

    def to(self, *args, **kwargs) -> "Batch":
        return self._map(lambda t: t.to(*args, **kwargs))

    def pin_memory(self) -> "Batch":
        """Called by ``DataLoader(pin_memory=True)`` on custom batch types."""
        return self._map(lambda t: t.pin_memory())

    def new_empty(self, size: int) -> "Batch":
        """An uninitialized batch of ``size`` networks shaped and typed like this one's."""
        return self._map(lambda t: t.new_empty((size, *t.shape[1:])))

    def index_copy_(self, rows: Tensor, source: "Batch") -> "Batch":
        """Write ``source``'s networks to rows ``rows`` of this batch, in place."""
        mine, theirs = self._tensors(), source._tensors()
        for out, values in zip(mine, theirs):
            out.index_copy_(0, rows, values)
        return self

    def _tensors(self) -> list[Tensor]:
        return [*self.ws.weights, *self.ws.biases, self.target, self.index]

    @staticmethod
    def cat(parts: Sequence["Batch"]) -> "Batch":
        if len(parts) == 1:
            return parts[0]
        ws = WeightSpace(
            tuple(torch.cat(ws) for ws in zip(*(p.ws.weights for p in parts))),
            tuple(torch.cat(bs) for bs in zip(*(p.ws.biases for p in parts))),
        )
        return Batch(ws, torch.cat([p.target for p in parts]), torch.cat([p.index for p in parts]))


def weightspace_from_arrays(arrays: dict[str, np.ndarray]) -> WeightSpace:
    """A store's parameter arrays (``WeightStore.read``) as a :class:`WeightSpace` (sharing memory)."""
    weights, biases = layers_from_arrays(arrays)
    return WeightSpace(tuple(torch.from_numpy(np.ascontiguousarray(w)) for w in weights),
                       tuple(torch.from_numpy(np.ascontiguousarray(b)) for b in biases))


def arrays_from_weightspace(ws: WeightSpace) -> dict[str, np.ndarray]:
    """The inverse: parameter arrays ``[B, ...]`` to write into a store (without a channel dimension)."""
    if ws.has_channels:
        raise ValueError("a store holds weights without a channel dimension")
    return arrays_from_layers([w.detach().cpu().numpy() for w in ws.weights],
                              [b.detach().cpu().numpy() for b in ws.biases])


def rebatch(blocks, batch_size: int, drop_last: bool):
    """Cut a stream of :class:`Batch` blocks of any sizes into batches of exactly ``batch_size``.

    Only the batch that straddles two blocks is copied; the others are views. The last batch cut
    before the next block is read, and the rest left over, are copied too, so that nothing holds the
    spent block (a whole shuffle window) while the next is read. The last, shorter batch is yielded
    unless ``drop_last``.
    """
    pending: list[Batch] = []
    count = 0
    for block in blocks:
        if len(block) == 0:
            continue
        pending.append(block)
        count += len(block)
        del block
        while count >= batch_size:
            batch = _take(pending, batch_size)
            count -= batch_size
            if count < batch_size:  # the next block is read next: let go of this one
                batch = batch._map(torch.clone)
                pending = [part._map(torch.clone) for part in pending]
            yield batch
            del batch
    if count and not drop_last:
        yield Batch.cat(pending)


def _take(pending: list[Batch], size: int) -> Batch:
    """The first ``size`` networks of the ``pending`` blocks (views where one block has them all),
    removed from ``pending``."""
    pieces = []
    while size:
        head = pending[0]
        if len(head) <= size:
            pieces.append(pending.pop(0))
            size -= len(head)
        else:
            pieces.append(head.slice(0, size))
            pending[0] = head.slice(size, len(head))
            size = 0
    return Batch.cat(pieces)
