"""What a zoo kind decides when ``zoo generate`` makes its store, and what stays shared.

The shared orchestration (:mod:`zoo.generate.run`) creates or resumes the store, checks a resumed
store's settings, fans chunks out (in-process or Ray), shows progress, handles Ctrl-C, merges the
rows, reduces the statistics and finishes the manifest. A :class:`Recipe` supplies the rest: which
options apply, the settings a resume must match, the plan (how many networks, the splits, the
chunking, what the manifest says about the networks), the function that makes one chunk with its
arguments, and what the progress bar and the final report say.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable


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
    #: :func:`zoo.generate.chunk.finish_chunk`; a plain module-level function, so Ray can ship it
    work: Callable[..., dict]
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

    @abstractmethod
    def job(self, target, device: str) -> dict:
        """The keyword arguments of :attr:`work` for the chunk ``target`` (a
        :class:`~zoo.generate.chunk.ChunkTarget`, passed on as ``target``). They must not name a
        path of this machine: the task may run on another one."""

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
