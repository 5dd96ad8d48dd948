"""The streaming side of the loader: an epoch as a sequence of shuffle windows of whole chunks.

Reading whole chunks in shuffled order is what a Zarr store reads fast (a random batch touches
every chunk). An epoch visits the split's chunks in a random order, groups them into windows of
``buffer_chunks`` chunks, and shuffles the networks inside each window. Window ``k`` is produced
by worker ``k % num_workers`` with its own generator seeded by ``(seed, epoch, k)``, and
``DataLoader`` returns the workers' outputs round-robin, so the stream of windows -- augmentation
draws included -- is the same for any number of workers.
"""

from __future__ import annotations

import os

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from zoo.store import WeightStore

from .batch import Batch, weightspace_from_arrays

ORDER, WINDOW = 0, 1  # generator domains: epoch-level order, per-window shuffle and augmentation


def derived_generator(seed: int, epoch: int, domain: int, k: int = 0) -> torch.Generator:
    """An independent ``torch.Generator`` per ``(seed, epoch, domain, k)``."""
    state = np.random.SeedSequence([int(seed), int(epoch), domain, int(k)]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed((int(state[0]) << 32) | int(state[1]))


def split_pieces(store: WeightStore, split: str, stop: int | None = None) -> list[tuple[int, int]]:
    """The split's index range (up to ``stop``) cut at chunk boundaries: one ``(start, stop)`` per chunk."""
    start, split_stop = store.split_range(split)
    stop = split_stop if stop is None else min(stop, split_stop)
    size = store.chunk_size
    first = start // size * size
    return [(max(lo, start), min(lo + size, stop)) for lo in range(first, stop, size)]


def prepare(batch: Batch, augment, normalizer, generator, piece: int | None = None) -> Batch:
    """Augment raw weights (geometric INR augmentations are exact only there), then normalize.

    Normalizes in place: every caller hands over a batch it owns (fresh from the store, or a
    gathered copy) and keeps only the result, so the batch is held once, not twice. ``piece``:
    augment ``piece`` networks at a time (drawing from ``generator`` in turn) and write them back
    in place, so an augmentation's temporaries of a whole shuffle window are those of one piece.
    """
    ws = batch.ws
    if augment is not None and piece is not None and len(batch) > piece:
        for lo in range(0, len(batch), piece):
            part = ws.map(lambda t: t[lo : lo + piece])
            done = augment(part, generator)
            for out, values in zip((*part.weights, *part.biases), (*done.weights, *done.biases)):
                out.copy_(values)
            del part, done
    elif augment is not None:
        ws = augment(ws, generator)
    if normalizer is not None:
        ws = normalizer.normalize(ws, in_place=True)
    return Batch(ws, batch.target, batch.index)


class WindowStream(IterableDataset):
    """Yields one prepared :class:`Batch` per shuffle window (this worker's share of the windows).

    ``targets`` covers the split (row 0 is network ``split_start``), or with ``keep`` (a bool mask
    over the split) the networks it keeps, which are the only ones read out. ``store``: a store's
    root, or the open store (read in this process; a worker process opens its own). Set :attr:`epoch`
    before iterating; workers receive a copy of this object when a ``DataLoader`` starts them.
    """

    def __init__(self, store, pieces, split_start: int, targets: torch.Tensor, *, buffer_chunks: int,
                 shuffle: bool, seed: int, normalizer=None, augment=None, keep: torch.Tensor | None = None):
        super().__init__()
        if keep is not None:  # targets by position in the split; left-out positions are never read
            padded = targets.new_zeros((len(keep), *targets.shape[1:]))
            padded[keep] = targets
            targets = padded
        opened = isinstance(store, WeightStore)
        self.root = str(store.root if opened else store)
        self.pieces, self.split_start, self.targets = pieces, split_start, targets
        self.keep = keep
        self.buffer_chunks, self.shuffle, self.seed = buffer_chunks, shuffle, seed
        self.normalizer, self.augment = normalizer, augment
        self.epoch = 0
        self._store, self._pid = (store, os.getpid()) if opened else (None, None)

    @property
    def piece(self) -> int:
        """Networks augmented at a time: half the largest chunk (within the room of a chunk being read)."""
        return max(1, max(hi - lo for lo, hi in self.pieces) // 2)

    def windows(self, epoch: int) -> list[list[tuple[int, int]]]:
        order = range(len(self.pieces))
        if self.shuffle:
            order = torch.randperm(len(self.pieces), generator=derived_generator(self.seed, epoch, ORDER)).tolist()
        pieces = [self.pieces[i] for i in order]
        return [pieces[i : i + self.buffer_chunks] for i in range(0, len(pieces), self.buffer_chunks)]

    def _read(self, lo: int, hi: int) -> dict:
        """Rows ``lo..hi-1`` of every array, through ``WeightStore.read`` (which refuses damaged
        chunks); the store is opened once per process (a forked worker opens its own)."""
        if self._pid != os.getpid():
            self._store = WeightStore(self.root)
            self._pid = os.getpid()
        return self._store.read(lo, hi)

    def _part(self, lo: int, hi: int) -> Batch:
        """Networks ``lo..hi-1`` (one chunk's share of the split), less those left out."""
        a, b = lo - self.split_start, hi - self.split_start
        part = Batch(weightspace_from_arrays(self._read(lo, hi)), self.targets[a:b], torch.arange(lo, hi))
        return part if self.keep is None else part.take(self.keep[a:b].nonzero().flatten())

    def _count(self, lo: int, hi: int) -> int:
        a, b = lo - self.split_start, hi - self.split_start
        return b - a if self.keep is None else int(self.keep[a:b].sum())

    def load(self, k: int, window: list[tuple[int, int]], epoch: int) -> Batch:
        """Window ``k``: its chunks' networks in a shuffled order, prepared.

        Each chunk is read and copied straight to its rows of the shuffled window, so the window is
        held once plus one chunk (a window of a classifier zoo is gigabytes): the same batch as
        concatenating the chunks and gathering ``randperm``'s order, without the second copy.
        """
        sizes = [self._count(lo, hi) for lo, hi in window]
        total = sum(sizes)
        generator = derived_generator(self.seed, epoch, WINDOW, k)
        if total == 0 or (len(window) == 1 and not self.shuffle):  # nothing to gather: the chunk as read
            block = self._part(*window[0])
            return block if total == 0 else prepare(block, self.augment, self.normalizer, generator, self.piece)
        # block[i] = (the window's networks in chunk order)[order[i]]: network j goes to row rows[j]
        order = torch.randperm(total, generator=generator) if self.shuffle else torch.arange(total)
        rows = torch.empty_like(order)
        rows[order] = torch.arange(total)
        block, start = None, 0
        for (lo, hi), size in zip(window, sizes):
            if size:
                part = self._part(lo, hi)
                if block is None:
                    block = part.new_empty(total)
                block.index_copy_(rows[start : start + size], part)
                del part  # before the next chunk is read
            start += size
        return prepare(block, self.augment, self.normalizer, generator, self.piece)

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        epoch = self.epoch
        for k, window in enumerate(self.windows(epoch)):
            if k % workers == worker:
                yield self.load(k, window, epoch)

