"""Writing finished chunks in the background while the next ones are made.

``zoo generate`` hands every finished chunk to a :class:`ChunkWriter`. Its one thread writes the
chunk (arrays, then fragment), takes its train moments for the statistics, lists it complete in
the manifest and moves the progress bar, in the order the chunks were handed over, while the
calling thread makes the next chunk: the chunk phase takes about max(compute, write) instead of
their sum (``benchmarks/store_write.py --only overlap`` measures it).

* **Bounded.** The writer holds at most ``depth`` chunks (waiting, or being written); handing
  over one more blocks until one is written, so memory stays at the chunk being made plus
  ``depth`` chunks.
* **One thread touches the manifest.** Only the writer lists chunks complete, so its rewrites
  never race, and a chunk is listed only after its data and fragment are stored: what a killed
  run leaves is what the synchronous path left (unlisted chunks are made again on resume).
* **Errors surface.** An exception in the writer (any ``BaseException``) stops it: nothing after
  the failed chunk is written or listed, and :meth:`ChunkWriter.put`, :meth:`ChunkWriter.check`
  and :meth:`ChunkWriter.close` raise that same exception object in the calling thread (``zoo
  generate``'s in-process progress callback calls ``check``, so the chunk being made stops at its
  next step rather than at its end).
* **Stopping.** On an error of the calling thread (a failed chunk, Ctrl-C), :meth:`ChunkWriter.stop`
  lets the writer finish the chunks it already holds (they are made; keeping them is what the
  synchronous path did), or, on a second Ctrl-C while it waits, abandons the rest: the writer
  takes no further chunk, and a chunk it is still writing is listed only if its write completes.

``depth`` 0 handles every chunk in the calling thread at once (the synchronous path, the
benchmark's baseline). :func:`write_depth` chooses: in-process runs of small chunks (under
:data:`MIN_BACKGROUND_BYTES` of arrays) write synchronously. Their writes take milliseconds, and
both threads then mostly run Python, taking the GIL by turns: measured on 2 cores (24-64 chunks
of 32-64 small SIRENs), the background writer made the chunk phase 0.6x-1.75x the synchronous
time from run to run, while chunks of tens of MB or more, whose writing is I/O that releases the
GIL, overlap as intended.
Ray runs always write in the background (the driver only waits for results). Where a job makes
several chunks at once (:mod:`zoo.generate.executors`), the background writer holds up to a whole
job's chunks (depth ``max(2, chunks per job)``), so the next job starts while the last one's chunks
are written; the job's chunks already share one host buffer, so this costs no memory beyond the
job's own, and :func:`zoo.generate.executors.job_size` bounds the two jobs' worth by the host memory.
``ZOO_WRITE_QUEUE=N`` forces the depth N for every run (tests and benchmarks; 0: synchronous).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from typing import Callable

#: environment variable: chunks the writer may hold (0: write synchronously in the calling thread)
DEPTH_VARIABLE = "ZOO_WRITE_QUEUE"
#: one chunk being written while the next waits: enough to absorb the jitter of Ray results
DEFAULT_DEPTH = 2
#: in-process runs write chunks with fewer array bytes than this synchronously (see above)
MIN_BACKGROUND_BYTES = 16 << 20


def write_depth(chunk_bytes: int | None = None, in_process: bool = True, chunks_per_job: int = 1) -> int:
    """The depth ``zoo generate`` uses for chunks of ``chunk_bytes`` array bytes (None: large), made
    ``chunks_per_job`` at a time: ``$ZOO_WRITE_QUEUE`` where set, else 0 for small chunks made in
    this process, else :data:`DEFAULT_DEPTH` or a whole job's chunks if more."""
    value = os.environ.get(DEPTH_VARIABLE, "").strip()
    if not value:
        small = chunk_bytes is not None and chunk_bytes < MIN_BACKGROUND_BYTES
        return 0 if in_process and small else max(DEFAULT_DEPTH, chunks_per_job)
    try:
        depth = int(value)
    except ValueError:
        depth = -1
    if depth < 0:
        raise ValueError(f"{DEPTH_VARIABLE} must be a whole number >= 0 (0: write synchronously), got {value!r}")
    return depth


class ChunkWriter:
    """Calls ``handle(item)`` for every item :meth:`put` hands over, in order, in one background
    thread (``depth`` > 0) or at once in the calling thread (``depth`` 0)."""

    def __init__(self, handle: Callable[[object], None], depth: int = DEFAULT_DEPTH):
        if depth < 0:
            raise ValueError(f"depth must be >= 0, got {depth}")
        self._handle, self.depth = handle, depth
        self._cond = threading.Condition()
        self._waiting: deque = deque()  # handed over, not yet started
        self._busy = False  # an item is being handled
        self._error: BaseException | None = None
        self._closing = self._abandoned = False
        self.handled = 0  # items handled completely
        self.blocked = 0  # puts that had to wait for room
        self._thread = None
        if depth:
            self._thread = threading.Thread(target=self._run, name="zoo-chunk-writer", daemon=True)
            self._thread.start()

    @property
    def held(self) -> int:
        """Items handed over and not yet handled completely (waiting or being handled)."""
        with self._cond:
            return len(self._waiting) + self._busy

    def put(self, item) -> None:
        """Hand ``item`` over; blocks while the writer holds ``depth`` items. Raises the writer's error."""
        if self._thread is None:
            self._handle(item)
            self.handled += 1
            return
        with self._cond:
            if self._closing:
                raise RuntimeError("the chunk writer was closed")
            if self._error is None and len(self._waiting) + self._busy >= self.depth:
                self.blocked += 1
                while self._error is None and len(self._waiting) + self._busy >= self.depth:
                    self._cond.wait()
            self._raise_error()
            self._waiting.append(item)
            self._cond.notify_all()

    def check(self) -> None:
        """Raise the writer's error, if it failed (cheap: call it as often as you like)."""
        if self._error is not None:
            with self._cond:
                self._raise_error()

    def close(self) -> None:
        """Wait until every item handed over is handled; raise the writer's error if it failed."""
        if self._thread is None:
            return
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()
        self._raise_error()

    def stop(self) -> None:
        """After an error of the calling thread: let the writer handle what it holds, or (a second
        KeyboardInterrupt while waiting) abandon what it has not started. Never raises the writer's
        own error (the caller's is the one to report); returns at once if the writer has stopped."""
        if self._thread is None:
            return
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        try:
            self._thread.join()
        except BaseException:
            self.abandon()
            raise

    def abandon(self) -> None:
        """Hand nothing more to ``handle``: items not started are dropped (not written, not listed)."""
        with self._cond:
            self._abandoned = True
            self._waiting.clear()
            self._cond.notify_all()

    def _raise_error(self) -> None:  # with the lock held
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closing and not self._abandoned:
                    self._cond.wait()
                if self._abandoned or not self._waiting:  # abandoned, or closing with nothing left
                    return
                item = self._waiting.popleft()
                self._busy = True
            try:
                self._handle(item)
            except BaseException as exc:  # noqa: BLE001 - handed to the calling thread, which raises it
                with self._cond:
                    self._error, self._busy = exc, False
                    self._waiting.clear()  # nothing after a failed chunk is written or listed
                    self._cond.notify_all()
                return
            finally:
                del item  # a chunk's arrays are freed as soon as they are written
            with self._cond:
                self._busy = False
                self.handled += 1
                self._cond.notify_all()
