"""The ``zoo generate`` progress bar: networks made so far, moving while a chunk is made.

In this process a chunk's work says how far it got: the fitter and the classifier trainer call
``progress(fraction)`` after every step, so the bar moves through a chunk of 200 networks instead
of sitting at 0% until it is written. Ray tasks say nothing until they finish, so while they run a
ticker thread redraws the bar once a second (the elapsed time, a spinner, the chunks running), or
at the bar's ``mininterval`` where that is longer (``TQDM_MININTERVAL=30`` keeps a log file to a
line every 30 s, as the background queue sets it).
A chunk counts fully only once it is written, whatever its work reported before.
"""

from __future__ import annotations

import threading
from typing import Callable

from tqdm import tqdm

SPINNER = "|/-\\"


class GenerateProgress:
    """A tqdm bar over ``total`` networks (``done`` of them already made)."""

    def __init__(self, total: int, done: int, desc: str, enabled: bool = True, chunks_left: int = 0,
                 workers: int | None = None, tick_seconds: float = 1.0):
        """``workers``: chunks made at a time by workers that do not report (Ray), None: in-process."""
        self.bar = tqdm(total=total, initial=done, unit="net", desc=desc, disable=not enabled, dynamic_ncols=True)
        self.counted: dict[int, int] = {}  # chunk -> networks the bar shows for it before it is written
        self.postfix: dict[str, str] = {}
        self.chunks_left, self.workers = chunks_left, workers
        self._stop = threading.Event()
        self._ticker = None
        # a redraw forces a line: not more often than the bar's own (a disabled bar has none)
        self.tick_seconds = max(tick_seconds, getattr(self.bar, "mininterval", 0.0))
        if enabled and workers:
            self._ticker = threading.Thread(target=self._tick, args=(self.tick_seconds,), daemon=True)
            self._ticker.start()

    def reporter(self, chunk: int, networks: int) -> Callable[[float], None]:
        """``progress(fraction)`` for the work making ``chunk`` (``networks`` networks) in this process."""
        def progress(fraction: float) -> None:
            shown = min(networks - 1, int(fraction * networks))  # the last one when the chunk is written
            before = self.counted.get(chunk, 0)
            if shown > before:
                self.counted[chunk] = shown
                self.bar.update(shown - before)
        return progress

    def chunk_written(self, chunk: int, networks: int, postfix: dict[str, str]) -> None:
        self.bar.update(networks - self.counted.pop(chunk, 0))
        self.postfix = postfix
        self.chunks_left -= 1
        self.bar.set_postfix(postfix)

    def _tick(self, seconds: float) -> None:
        turn = 0
        while not self._stop.wait(seconds):
            turn += 1
            running = min(self.workers, self.chunks_left)
            self.bar.set_postfix({**self.postfix, "running": f"{running} chunk(s) {SPINNER[turn % len(SPINNER)]}"})

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        self.bar.close()
