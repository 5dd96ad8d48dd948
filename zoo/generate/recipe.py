"""What a zoo kind decides when ``zoo generate`` makes its store, and what stays shared.

The shared orchestration (:mod:`zoo.generate.run`) creates or resumes the store, checks a resumed
store's settings, fans chunks out (in-process or Ray), shows progress, handles Ctrl-C, merges the
rows, reduces the statistics and finishes the manifest. A :class:`Recipe` supplies the rest: which
options apply, the settings a resume must match, the plan (how many networks, the splits, the
chunking, what the manifest says about the networks), how many chunks one job makes, the function
that makes a job's chunks with its arguments, and what the progress bar and the final report say.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable

#: environment variable: chunks per job for every recipe whose jobs may make several (tests and
#: benchmarks: the multi-chunk path on a CPU); still capped by :func:`zoo.generate.executors.job_size`
JOB_CHUNKS_VARIABLE = "ZOO_JOB_CHUNKS"


def forced_job_chunks() -> int | None:
    """``$ZOO_JOB_CHUNKS`` as a number (None where unset)."""
    value = os.environ.get(JOB_CHUNKS_VARIABLE, "").strip()
    if not value:
        return None
    try:
        chunks = int(value)
    except ValueError:
        chunks = 0
    if chunks < 1:
        raise ValueError(f"{JOB_CHUNKS_VARIABLE} must be a whole number >= 1, got {value!r}")
    return chunks


@dataclass
class Layout:
    """The plan as the shared orchestration sees it."""

    num_networks: int
    splits: dict[str, dict]  # split -> {"start", "count", ...}
    chunk_size: int  # networks per chunk (a kind may round the asked size, e.g. to whole runs)
    metadata: dict  # manifest keys describing the networks: kind, description, architecture, targets, source


class Recipe(ABC):
    """How a kind makes its networks. Built from the options (refusing those that do not apply)."""

    #: the unit of work: ``work(**job)`` makes one chunk and ends with
    #: :func:`zoo.generate.chunk.finish_chunk`, or, for a job of several chunks, returns the list of
    #: their results (one ``finish_chunk`` each, in chunk order); a plain module-level function, so
    #: Ray can ship it
    work: Callable[..., dict | list[dict]]
    #: what the progress bar says it is doing
    verb: str

    @abstractmethod
    def settings(self) -> dict:
        """``{"generation": ..., "architecture": ...}``: what a resumed store must have been made with."""

    def stored_settings(self, stored: dict) -> dict:
        """A stored store's settings as today's code would write them (older stores may lack keys)."""
        return stored

    @abstractmethod
    def plan(self, source) -> Layout:
        """Plan the zoo from its data source."""

    def share(self, executor) -> None:
        """Put data every chunk needs where the executor's workers read it (once per run)."""

    def chunks_per_job(self, device: str, workers: int) -> int:
        """How many consecutive missing chunks one job may make together on ``device``, shared by
        ``workers`` jobs at a time (the run caps it further: :func:`zoo.generate.executors.job_size`).
        1 unless a recipe's :meth:`job` and :attr:`work` take several; results must not depend on it."""
        return 1

    @abstractmethod
    def job(self, target, device: str) -> dict:
        """The keyword arguments of :attr:`work` for the chunk ``target`` (a
        :class:`~zoo.generate.chunk.ChunkTarget`, passed on as ``target``), or, where
        :meth:`chunks_per_job` allowed more than one, a list of consecutive missing chunks' targets
        made by one job. They must not name a path of this machine: the task may run on another one."""

    def postfix(self, result: dict) -> dict[str, str]:
        """Progress-bar fields for a finished chunk's ``result``."""
        return {}

    def report(self, table, log) -> dict:
        """After every chunk is in: say what the user must know (``log``) and return manifest keys."""
        return {}


def refuse_options(opts, defaults: dict, kind: str, applies_to: str) -> None:
    """ValueError naming the first option in ``defaults`` that was changed for a kind it does not apply to."""
    for name, default in defaults.items():
        if getattr(opts, name) != default:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} applies to {applies_to} only, not to {kind}")
