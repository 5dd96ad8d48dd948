"""Batches of networks from a weight store, streamed chunk by chunk or held in memory.

Two modes, chosen automatically by the split's size against ``ram_budget``:

* **in memory**: the split is read once; each epoch is a fresh permutation (``torch.Generator``
  seeded by ``(seed, epoch)``) and batches are gathered from it.
* **streaming**: chunks are read in a shuffled order, a few at a time (``buffer_chunks``; by default
  as many as fit in ``ram_budget``, :mod:`dws.stream.memory`) into a shuffle window (see
  :mod:`dws.stream.windows`); an unshuffled split is read one chunk at a time. With
  ``num_workers > 0`` the windows are read, augmented and normalized in ``DataLoader`` worker
  processes (processes, not threads: the per-sample augmentation and normalization are
  Python/torch work that would contend for the GIL); the main process only cuts the windows into
  batches.

Either way an epoch visits every network of the split exactly once, the sequence of batches
depends on ``seed`` and the epoch number only (not on ``num_workers``), and augmentation is
applied to raw weights before normalization. Networks that did not train normally (a ``status``
other than ``ok``, see :mod:`dws.stream.rows`) are left out unless ``only_ok=False``; ``limit``
keeps a fixed subset spread over the split, as a mask over its rows like those left out.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader

from zoo.store import StoreError, WeightStore

from .batch import Batch, rebatch
from .memory import network_bytes, window_chunks
from .normalize import Normalizer
from .rows import excluded, selected_mask
from .targets import read_targets, target_names
from .windows import ORDER, WindowStream, derived_generator, prepare, split_pieces

DEFAULT_RAM_BUDGET = 2 * 2**30


class WeightStoreLoader:
    """Iterate over ``split`` of a store in batches of :class:`~dws.stream.batch.Batch`.

    Args:
        store: a store directory or an open :class:`zoo.store.WeightStore`.
        split: ``"train"``, ``"val"`` or ``"test"``.
        target: column(s) of ``networks.parquet``: ``"label"`` -> int64 ``[B]``, ``"frequency"`` ->
            float32 ``[B]``, ``"amplitude,frequency"`` -> float32 ``[B, 2]``; None: the manifest's targets.
        shuffle: False reads the split in index order (evaluation).
        seed: with the epoch number, fixes the order and the augmentation draws.
        normalize: apply the store's ``(value - mean) / std`` statistics, or a given
            :class:`~dws.stream.normalize.Normalizer`'s (e.g. orbit statistics, :mod:`dws.stream.orbit`).
        augment: ``aug(ws, generator) -> ws`` on raw weights (:mod:`dws.stream.augment`).
        num_workers: streaming worker processes (0: read in this process). Ignored in memory.
        buffer_chunks: chunks per shuffle window when streaming; None: as many whole chunks as the
            windows in flight fit in ``ram_budget`` (:func:`~dws.stream.memory.window_chunks`), and one
            for an unshuffled split (its batches are the same for any window).
        in_memory: force a mode; None chooses memory when the split fits in ``ram_budget`` bytes.
        ram_budget: bytes of networks this loader may hold: the split, or its shuffle windows (what a
            whole process holds is split by :func:`dws.stream.memory.plan_memory`).
        pin_memory: pin each batch (for fast copies to an accelerator).
        limit: use only ``limit`` networks of the split (training-set-size sweeps), spread over it: the
            first ``limit`` of a fixed seeded permutation of the networks otherwise used, stratified by
            ``label`` where every one has a label (:func:`~dws.stream.rows.limit_mask`); the same for
            every ``seed`` and mode, and nested across limits. Not the split's first ``limit``: stores
            are laid out in source order, and some sources are sorted (by label). Held and budgeted
            (``split_bytes``) as the subset, read chunk by chunk.
        views: use only each item's first ``views`` views (a store generated with ``--views K``,
            ``views <= K``: the multi-view table from one store; :func:`~dws.stream.rows.view_mask`).
        only_ok: leave out the networks whose ``status`` is not ``ok`` (diverged classifiers; they
            have no test accuracy). :attr:`excluded` counts them by status.
    """

    def __init__(
        self,
        store: str | Path | WeightStore,
        split: str = "train",
        *,
        batch_size: int = 512,
        target: str | Sequence[str] | None = None,
        shuffle: bool = True,
        seed: int = 0,
        normalize: bool | Normalizer = True,
        augment=None,
        drop_last: bool = False,
        num_workers: int = 0,
        buffer_chunks: int | None = None,
        in_memory: bool | None = None,
        ram_budget: int = DEFAULT_RAM_BUDGET,
        pin_memory: bool = False,
        limit: int | None = None,
        only_ok: bool = True,
        views: int | None = None,
    ):
        if batch_size < 1 or (buffer_chunks is not None and buffer_chunks < 1) or num_workers < 0:
            raise ValueError(f"need batch_size >= 1, buffer_chunks >= 1, num_workers >= 0; got "
                             f"{batch_size}, {buffer_chunks}, {num_workers}")
        self.store = store if isinstance(store, WeightStore) else WeightStore(store)
        self.split = split
        self.start, self.stop = self.store.split_range(split)
        if self.stop <= self.start:
            raise StoreError(f"{self.store.root}: split {split!r} is empty")
        self.only_ok, self.views, self.limit = only_ok, views, limit
        self.excluded = excluded(self.store, self.start, self.stop) if only_ok else {}
        # None: every network of the range; else a mask over it (``rows``: the store indices kept)
        self.keep = selected_mask(self.store, self.start, self.stop, only_ok=only_ok, views=views, limit=limit)
        self.rows = None if self.keep is None else torch.from_numpy(np.flatnonzero(self.keep) + self.start)
        if self.rows is not None and len(self.rows) == 0:
            raise StoreError(f"{self.store.root}: no network of split {split!r} ({self.start}..{self.stop - 1}) "
                             f"trained normally (status: {dict(self.excluded)})"
                             f"{'' if views is None else f' among the first {views} view(s) of each item'}; "
                             f"nothing to load")
        self.target_names = target_names(self.store, target)
        self.targets = read_targets(self.store, self.target_names, self.start, self.stop, self.keep)
        self.normalizer = (normalize if isinstance(normalize, Normalizer) else
                           Normalizer.from_store(self.store) if normalize else None)
        self.batch_size, self.shuffle, self.seed, self.drop_last = batch_size, shuffle, seed, drop_last
        self.augment, self.num_workers, self.pin_memory = augment, num_workers, pin_memory
        self._asked_chunks, self.ram_budget = buffer_chunks, ram_budget  # (for variants)
        if buffer_chunks is None:
            chunk_bytes = self.store.chunk_size * network_bytes(self.store)
            buffer_chunks = window_chunks(ram_budget, chunk_bytes, num_workers) if shuffle else 1
        self.buffer_chunks = buffer_chunks
        self.epoch = 0
        self.in_memory = self.split_bytes <= ram_budget if in_memory is None else bool(in_memory)
        if self.in_memory:
            self._data = self._load_split()
        else:
            self._stream = WindowStream(
                self.store, split_pieces(self.store, split, self.stop), self.start, self.targets,
                buffer_chunks=buffer_chunks, shuffle=shuffle, seed=seed,
                normalizer=self.normalizer, augment=augment,
                keep=None if self.keep is None else torch.from_numpy(self.keep),
            )

    # ----------------------------------------------------------------- description
    @property
    def num_networks(self) -> int:
        """Networks per epoch: the split's range less those left out (and beyond ``limit``)."""
        return self.stop - self.start if self.rows is None else len(self.rows)

    @property
    def widths(self) -> tuple[int, ...]:
        return self.store.widths

    @property
    def split_bytes(self) -> int:
        """Size of the split's parameters in memory (float32)."""
        return network_bytes(self.store) * self.num_networks

    def __len__(self) -> int:
        """Batches per epoch (the same for every epoch and worker count)."""
        full, rest = divmod(self.num_networks, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def set_epoch(self, epoch: int) -> None:
        """The next iteration produces epoch ``epoch``; each iteration then advances it by one."""
        self.epoch = int(epoch)

    def state_dict(self) -> dict:
        """The loader's position between epochs (what a resumed training restores): the next epoch.

        An epoch's batch order and augmentation draws depend on ``(seed, epoch)`` and, shuffled, on how
        the split is read (:attr:`reading`), so these are all a loader needs to continue as if never stopped.
        """
        return {"epoch": self.epoch, "seed": self.seed, **({"reading": self.reading} if self.shuffle else {})}

    def load_state_dict(self, state: dict) -> None:
        """Go to ``state``'s epoch (refused for another seed). A shuffled split read otherwise than when
        ``state`` was saved (its ``reading``) gives that epoch other batches: the caller compares
        ``state_dict()`` after loading where it matters (``zoo train`` resuming within an epoch)."""
        if state["seed"] != self.seed:
            raise ValueError(f"a loader position saved with seed {state['seed']} cannot resume a loader with "
                             f"seed {self.seed}")
        self.set_epoch(state["epoch"])

    @property
    def reading(self) -> str:
        """How a shuffled epoch reads the split, which decides its order: held whole (one permutation) or
        streamed through shuffle windows of ``buffer_chunks`` chunks."""
        return "in memory" if self.in_memory else f"in shuffle windows of {self.buffer_chunks} chunk(s)"

    # ----------------------------------------------------------------- iteration
    def __iter__(self) -> Iterator[Batch]:
        epoch, self.epoch = self.epoch, self.epoch + 1
        batches = self._memory_epoch(epoch) if self.in_memory else self._stream_epoch(epoch)
        for batch in batches:
            yield batch.pin_memory() if self.pin_memory else batch

    def variant(self, *, shuffle: bool, augment=None, drop_last: bool = False) -> WeightStoreLoader:
        """This loader's split, store, batch size, seed and target with other reading options.

        In memory the variant shares this loader's arrays instead of reading a second copy (e.g.
        the un-augmented train batches for batch-norm statistics or a linear probe beside the
        augmented training loader); if those arrays are already normalized and the variant
        augments (which needs raw weights), it reads its own. Streaming variants stream on their own.
        """
        if not self.in_memory or (augment is not None and self._data_normalized):
            return WeightStoreLoader(
                self.store, self.split, batch_size=self.batch_size, target=self.target_names, shuffle=shuffle,
                seed=self.seed, normalize=self.normalizer or False, augment=augment, drop_last=drop_last,
                num_workers=self.num_workers, buffer_chunks=self._asked_chunks, ram_budget=self.ram_budget,
                in_memory=self.in_memory, pin_memory=self.pin_memory, limit=self.limit,
                only_ok=self.only_ok, views=self.views,
            )
        other = copy.copy(self)
        other.shuffle, other.augment, other.drop_last, other.epoch = shuffle, augment, drop_last, 0
        return other

    def _load_split(self) -> Batch:
        """The split as one block, read chunk by chunk into place (held once plus one chunk, not twice)."""
        pieces = split_pieces(self.store, self.split, self.stop)
        reader = WindowStream(self.store, pieces, self.start, self.targets, buffer_chunks=len(pieces), shuffle=False,
                              seed=self.seed, keep=None if self.keep is None else torch.from_numpy(self.keep))
        data = reader.load(0, pieces, 0)
        self._data_normalized = self.augment is None and self.normalizer is not None
        if self._data_normalized:  # nothing random: normalize once
            data = prepare(data, None, self.normalizer, None)
        return data

    def _memory_epoch(self, epoch: int) -> Iterator[Batch]:
        generator = derived_generator(self.seed, epoch, ORDER)
        n = self.num_networks
        order = torch.randperm(n, generator=generator) if self.shuffle else torch.arange(n)
        stop = n - n % self.batch_size if self.drop_last else n
        for i in range(0, stop, self.batch_size):
            batch = self._data.take(order[i : i + self.batch_size])
            if not self._data_normalized:  # (a no-op without augmentation and normalizer)
                batch = prepare(batch, self.augment, self.normalizer, generator)
            yield batch

    def _stream_epoch(self, epoch: int) -> Iterator[Batch]:
        self._stream.epoch = epoch
        if self.num_workers == 0:
            blocks = iter(self._stream)
        else:
            # one window queued per worker (dws.stream.memory.windows_in_flight counts them)
            blocks = iter(DataLoader(self._stream, batch_size=None, num_workers=self.num_workers, prefetch_factor=1))
        return rebatch(blocks, self.batch_size, self.drop_last)

    def __repr__(self) -> str:
        mode = "in memory" if self.in_memory else f"streaming, {self.num_workers} workers"
        return (f"WeightStoreLoader({self.store.root}, split={self.split!r}, {self.num_networks} networks, "
                f"batch {self.batch_size}, target={self.target_names}, {mode})")
