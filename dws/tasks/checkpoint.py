"""Training that survives interruption: a training's whole state saved after every epoch (and, in long
epochs, within them), restored on rerun.

A training loop names its stateful objects -- anything with ``state_dict()`` / ``load_state_dict()``
(modules, optimizers, schedulers, loaders: :meth:`dws.stream.WeightStoreLoader.state_dict` is the
loader's position) or a ``torch.Generator`` -- and its own bookkeeping as plain values (epoch,
history, best so far). :meth:`Checkpoint.save` writes them together with the process's global random
generators (torch, CUDA, numpy, python), so that :meth:`Checkpoint.resume` continues exactly where the
last completed epoch left off: a resumed training computes what an uninterrupted one would have.
Nothing here knows which loop it serves; ``dws.tasks.trainer.train`` is one user.

Files are replaced atomically (a temporary file in the same folder, then ``os.replace``), so a kill
during a write leaves the previous checkpoint intact; a damaged file is refused with its name and
how to start over. :class:`RunCheckpoints` is a run directory's ``checkpoints/`` folder: the
settings of the unfinished run (a rerun with other settings is refused, every difference named) and
one :class:`Checkpoint` per training, which ends holding that training's outcome.

Data-parallel training: every rank calls :meth:`Checkpoint.save` (each rank's random generators are
gathered, since dropout draws differ between shards); rank 0 writes; every rank resumes from the
file and takes its own generators back.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from zoo.options import settings_diff

CHECKPOINTS = "checkpoints"  # the folder in a run directory
SETTINGS = "settings.json"  # the unfinished run's settings, in that folder
TRAINING, FINISHED = "training", "finished"
RESTART = "--restart"  # the `zoo train` flag that discards an unfinished run


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: damaged, or saved with other settings."""


# ------------------------------------------------------------------------------ files
def save_atomically(obj: Any, path: Path) -> None:
    """``torch.save`` ``obj`` to ``path`` so that ``path`` is always either the old or the new file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename makes it the checkpoint
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def load_file(path: Path, what: str) -> Any:
    """``torch.load`` a checkpoint of this project (``what``: how to redo it), refusing a damaged one clearly."""
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # truncated zip, bad pickle, EOF: all mean the same to the user
        raise CheckpointError(f"{path} is damaged ({type(exc).__name__}: {exc}); delete it to {what}, "
                              f"or rerun with {RESTART} to start the whole run over") from exc


# ------------------------------------------------------------------------------ state
def global_random_state() -> dict:
    """The process's global random generators: torch (and CUDA, if initialized), numpy, python."""
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_global_random_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def capture(objects: Mapping[str, Any]) -> dict:
    """``{name: state}`` of stateful objects (``state_dict()``, or a ``torch.Generator``'s state)."""
    states = {}
    for name, obj in objects.items():
        if isinstance(obj, torch.Generator):
            states[name] = obj.get_state()
        elif hasattr(obj, "state_dict"):
            states[name] = obj.state_dict()
        else:
            raise TypeError(f"{name}: a {type(obj).__name__} has no state_dict() to checkpoint")
    return states


class Captured:
    """A state captured earlier, saved in its object's place: a save within an epoch records the training
    loader's position at the epoch's start (its batches are then skipped on resume), not the position its
    iteration has advanced to."""

    def __init__(self, state: Any):
        self.state = state

    def state_dict(self) -> Any:
        return self.state


def restore(objects: Mapping[str, Any], states: Mapping[str, Any]) -> None:
    """Put :func:`capture`'s states back into the same named objects (all of them, no others)."""
    if set(objects) != set(states):
        raise CheckpointError(f"the checkpoint holds the state of {sorted(states)}, the training has {sorted(objects)}")
    for name, obj in objects.items():
        if isinstance(obj, torch.Generator):
            obj.set_state(states[name])
        else:
            obj.load_state_dict(states[name])


# ------------------------------------------------------------------------------ one training
class Checkpoint:
    """One training's file: its state after the last completed epoch, then its outcome.

    ``rank`` / ``world``: this process's place among data-parallel workers (rank 0 writes).
    """

    def __init__(self, path: Path, label: str, rank: int = 0, world: int = 1, before_write=None):
        self.path, self.label, self.rank, self.world = Path(path), label, rank, world
        self.before_write = before_write  # called before every write (the folder made ready)

    def read(self) -> dict | None:
        """The file's content (None: no file yet)."""
        if not self.path.exists():
            return None
        saved = load_file(self.path, f"redo {self.label} from its first epoch")
        if not isinstance(saved, dict) or saved.get("status") not in (TRAINING, FINISHED):
            raise CheckpointError(f"{self.path} is not a training checkpoint; move it away, or rerun with {RESTART} "
                                  f"to start the whole run over")
        return saved

    def save(self, objects: Mapping[str, Any], values: dict) -> None:
        """The state now (after a completed epoch, or a step within one): ``objects``' states, ``values``,
        the random generators."""
        rng = global_random_state()
        if self.world > 1:  # a list indexed by rank; a collective call, so every rank comes here
            gathered = [None] * self.world
            torch.distributed.all_gather_object(gathered, rng)
            rng = gathered
        if self.rank == 0:
            self._write({"status": TRAINING, "label": self.label, "objects": capture(objects), "random": rng,
                         "values": values})

    def resume(self, objects: Mapping[str, Any]) -> dict | None:
        """Restore ``objects`` and the random generators from the file; its ``values`` (None: nothing saved)."""
        saved = self.read()
        if saved is None:
            return None
        if saved["status"] != TRAINING:
            raise CheckpointError(f"{self.path} holds a finished training; it is not resumed but reused")
        restore(objects, saved["objects"])
        rng = saved["random"]
        if isinstance(rng, list):
            if len(rng) != self.world:
                raise CheckpointError(f"{self.path} was saved by {len(rng)} data-parallel workers, not {self.world}")
            rng = rng[self.rank]
        set_global_random_state(rng)
        return saved["values"]

    def finish(self, outcome: dict) -> None:
        """Replace the training state by the training's outcome (rank 0 writes)."""
        if self.rank == 0:
            self._write({"status": FINISHED, "label": self.label, "outcome": outcome})

    def _write(self, content: dict) -> None:
        if self.before_write is not None:
            self.before_write()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        save_atomically(content, self.path)

    def outcome(self) -> dict | None:
        """The outcome of a training that finished (None: not finished, or not started)."""
        saved = self.read()
        return saved["outcome"] if saved is not None and saved["status"] == FINISHED else None


# ------------------------------------------------------------------------------ a run's folder
class RunCheckpoints:
    """A run directory's ``checkpoints/``: the unfinished run's settings and one file per training.

    ``settings``: what must not change for a run to be resumed (flag -> value). With ``resume``, an
    unfinished run with other settings is refused when opened; without, the run starts over and
    :meth:`begin` discards whatever the folder holds.
    """

    def __init__(self, run_dir: Path, settings: dict, resume: bool = True):
        self.folder, self.resume = Path(run_dir) / CHECKPOINTS, resume
        self.settings = json.loads(json.dumps(settings))  # as read back: tuples become lists
        self._settings_written = False

    def unfinished(self) -> list[str]:
        """Labels of the trainings an unfinished run saved (empty: nothing to resume)."""
        if not self.resume or not self.folder.is_dir():
            return []
        return sorted(p.stem for p in self.folder.glob("*.pt"))

    def saved_settings(self) -> dict | None:
        """The settings the unfinished run was saved with (None: nothing to resume)."""
        if not self.unfinished():
            return None
        try:
            return json.loads((self.folder / SETTINGS).read_text())
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{self.folder} holds an unfinished run whose {SETTINGS} cannot be read ({exc}); "
                                  f"rerun with {RESTART} to start over") from exc

    def check(self, saved_before: Mapping[str, Any] | None = None) -> None:
        """Refuse to resume an unfinished run saved with other settings (CheckpointError naming them);
        ``saved_before``: the values of settings added since, for a run saved without them."""
        saved = self.saved_settings()
        if saved is None:
            return
        saved = {**(saved_before or {}), **saved}
        differences = settings_diff(saved, self.settings, labels=("unfinished run", "now"))
        if differences:
            lines = "\n  ".join(differences)
            raise CheckpointError(
                f"{self.folder.parent} holds an unfinished run with other settings:\n  {lines}\n"
                f"rerun with its settings to resume it, with {RESTART} to discard it and start over, "
                f"or use another --out")

    def begin(self, writer: bool = True) -> None:
        """Before the first training: discard an old run unless resuming (the writer, rank 0, does).

        Nothing is written yet: the folder and its settings appear with the first checkpoint, so a
        run refused later (a damaged store found when its networks are read) leaves nothing behind.
        """
        if writer and not self.resume:
            self.clear()

    def _ready(self) -> None:
        """Before a checkpoint is written: the folder exists and records the run's settings."""
        if self._settings_written:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        for stale in self.folder.glob(".*.tmp"):  # a write cut short by a kill
            stale.unlink(missing_ok=True)
        tmp = self.folder / f".{SETTINGS}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(self.settings, indent=2))
        os.replace(tmp, self.folder / SETTINGS)
        self._settings_written = True

    def training(self, lr: float, seed: int, rank: int = 0, world: int = 1) -> Checkpoint:
        """The checkpoint of the training with learning rate ``lr`` and seed ``seed``."""
        return Checkpoint(self.folder / f"lr{float(lr)!r}-seed{seed}.pt", f"lr {lr:g}, seed {seed}", rank, world,
                          before_write=self._ready)

    def clear(self) -> None:
        """Remove the folder (the run finished, or starts over)."""
        shutil.rmtree(self.folder, ignore_errors=True)
