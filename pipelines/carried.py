"""Unfinished cells carried across machines: a cell's checkpoints, committed beside the recorded cells.

A cell of issue 32's table trains for up to days of a 2-core CPU, across sessions, and a session may begin
on a new machine without the earlier one's run directories (sessions 12, 20 and 22 lost every cell in
progress: ng-gnn's full MNIST cell twice, after 88 and 17 of its 100 epochs). So ``--record`` also copies
each unfinished cell's ``checkpoints/`` folder, where it is small enough to commit (:data:`CARRY_LIMIT`),
to ``RECORDED/SCALE/carried/COLUMN-MODEL/``, with what it was trained on (:data:`ABOUT`); a machine with
no run of the cell puts it back into the cell's run directory, and zoo train resumes it after its last
saved step as it would have on the machine that saved it.

It is put back only where it continues the same training: the same ``zoo train`` command (where the zoo
and the run directory lie aside), the same model code version, and a zoo of the same networks: the
store's ``content_id`` (``zoo/store/identity.py``), which is the same for the same networks generated
anywhere and differs where one value does, or failing that its ``networks_id``, which is the same where
only what training does not read differs (the fit's final MSE and PSNR, whose last bits depend on the
machine's BLAS code path: MKL's Intel-only kernels). The run's settings then name the zoo here (its path and
creation time, which is all that differs); a carried cell that does not fit is said in one line, and the
cell trains from its start. Nothing here knows the table: ``pipelines.weight_models`` decides which cell
is whose.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from pathlib import Path

from dws.tasks.checkpoint import CHECKPOINTS, SETTINGS, Checkpoint, CheckpointError
from zoo.store import WeightStore

CARRIED = "carried"  # the folder beside a scale's recorded results
ABOUT = "carried.json"  # in each carried cell's folder: what its checkpoints were trained on
# the most a cell's checkpoints may weigh to be committed, about what one session's commit may add to the
# repository (the queue trains one cell at a time): four floats a parameter (model, best model and AdamW's two
# moments), so ng-gnn's full cell (98,122 parameters) is 1.7 MB and the DWSNet's and the NFNs' full INR cells
# (543k-557k parameters, each ~1.6-4.4 h here) 8.4-8.9 MiB, which a new machine lost (sessions 33, 35) when
# the limit was 4 MiB; a ScaleGMN cell (2.0M parameters, ~33 MB) is not carried
CARRY_LIMIT = 10 * 2**20


class CarriedError(ValueError):
    """A carried cell whose files cannot be used: damaged or incomplete."""


def carried_folder(recorded: Path, scale: str, column: str, model: str) -> Path:
    return Path(recorded) / scale / CARRIED / f"{column}-{model}"


def checkpoint_files(run_dir: Path) -> list[Path]:
    """The files of a run directory's unfinished run: its settings and one checkpoint per training."""
    folder = Path(run_dir) / CHECKPOINTS
    files = sorted(folder.glob("*.pt"))
    return [folder / SETTINGS, *files] if files and (folder / SETTINGS).is_file() else []


def store_identity(store: Path) -> dict:
    """The zoo's ``content_id`` and ``networks_id`` (each None: a store finished before content IDs, or
    not finished)."""
    from zoo.store.identity import networks_id

    opened = WeightStore(store)
    return {"content_id": opened.manifest.get("content_id"), "networks_id": networks_id(opened.root, opened.manifest)}


def read_about(folder: Path) -> dict | None:
    """A carried cell's description (None: nothing carried there); an unreadable one is an error, as
    a damaged record is: it is committed data, and passing over it would retrain what it saved."""
    path = Path(folder) / ABOUT
    if not path.is_file():
        return None
    try:
        about = json.loads(path.read_text())
        if not isinstance(about, dict) or not isinstance(about.get("files"), list):
            raise ValueError("no files")
    except (OSError, ValueError) as e:
        raise CarriedError(f"{path}: not a carried cell ({e}); restore it from git, or delete {folder} to "
                           f"train the cell from its start") from None
    return about


def write_folder(folder: Path, copies: list[Path], texts: dict[str, str], replace: bool) -> None:
    """Make ``folder`` hold copies of ``copies`` and the files ``texts`` (name: content), whole or not at all:
    written beside it, then renamed into place. ``replace``: a folder there is replaced; otherwise it must be
    empty (OSError where it is not, and it is kept)."""
    tmp = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in copies:  # each checkpoint is replaced atomically by zoo train: a copy is one whole save
        shutil.copy2(f, tmp / f.name)
    for name, text in texts.items():
        (tmp / name).write_text(text)
    old = folder.with_name(f".{folder.name}.{os.getpid()}.old")
    if folder.is_dir():
        if replace:
            folder.rename(old)
        else:
            folder.rmdir()
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


def carry(run_dir: Path, folder: Path, about: dict, limit: int | None = None) -> str | None:
    """Copy ``run_dir``'s unfinished run into ``folder`` (replacing what was carried there) with ``about``
    (the cell's command, model version, zoo identity and epochs done). Returns why not (None: carried):
    no unfinished run, or more than ``limit`` bytes (default :data:`CARRY_LIMIT`)."""
    files, limit = checkpoint_files(run_dir), CARRY_LIMIT if limit is None else limit
    if not files:
        return f"{run_dir} holds no unfinished run"
    size = sum(f.stat().st_size for f in files)
    if size > limit:
        return f"its checkpoints are {size / 2**20:.1f} MiB, more than the {limit / 2**20:.0f} MiB carried in git"
    write_folder(Path(folder), files, {ABOUT: json.dumps({**about, "files": [f.name for f in files], "bytes": size},
                                                         indent=2) + "\n"}, replace=True)
    return None


def mismatch(about: dict, ran: list[str], runs: list[str], model_version: int, identity: dict) -> str | None:
    """Why a carried cell does not continue the training a cell would run now (None: it does). ``ran``,
    ``runs``: its ``zoo train`` command and the cell's now, without where the zoo and run directory lie;
    ``identity``: the zoo's here (:func:`store_identity`)."""
    if ran != runs:
        return f"it ran `{shlex.join(ran[1:])}` on {ran[0]}, where this cell runs `{shlex.join(runs[1:])}` on {runs[0]}"
    if about.get("model_version") != model_version:
        return f"it is of model version {about.get('model_version')}, now {model_version}"
    content_id, networks = identity.get("content_id"), identity.get("networks_id")
    if content_id is not None and about.get("content_id") == content_id:
        return None
    if networks is not None and about.get("networks_id") == networks:
        return None  # the same networks, statistics and targets; only the fit's diagnostics differ
    if content_id is None or about.get("content_id") is None:
        return "its zoo or this one has no content ID to tell whether they hold the same networks"
    if about.get("networks_id") is None:
        return (f"it trained on a zoo of content {about['content_id']}, and this one is {content_id}: other "
                f"networks, or the same ones with other diagnostics (its record has no networks ID to tell: "
                f"`zoo compare` of the two zoos says which)")
    return (f"it trained on a zoo of content {about['content_id']}, and this one is {content_id}: other networks "
            f"({about['networks_id']} there, {networks} here: made on another kind of machine, or with other "
            f"package versions)")


def put_back(folder: Path, about: dict, run_dir: Path, store: Path) -> None:
    """Put the cell carried in ``folder`` (``about``: its :func:`read_about`) into ``run_dir``'s ``checkpoints/``
    (absent or empty), its settings naming ``store`` (the same networks, checked by :func:`mismatch`, where they
    lie here); each checkpoint is read first, so a damaged one is refused (CarriedError, one line) before
    anything is written."""
    missing = [name for name in about["files"] if not (Path(folder) / name).is_file()]
    if missing or SETTINGS not in about["files"]:
        raise CarriedError(f"{folder}: {', '.join(missing) or SETTINGS} missing; restore it from git, or delete "
                           f"{folder} to train the cell from its start")
    for name in about["files"]:
        try:
            if name == SETTINGS:
                settings = json.loads((Path(folder) / name).read_text())
            else:
                Checkpoint(Path(folder) / name, name).read()
        except (CheckpointError, ValueError) as e:
            raise CarriedError(f"{Path(folder) / name} cannot be read ({type(e).__name__}); restore it from git, or "
                               f"delete {folder} to train the cell from its start") from None
    here = WeightStore(store)
    settings.update({"STORE": str(here.root.resolve()), "STORE created": here.manifest.get("created")})
    write_folder(Path(run_dir) / CHECKPOINTS, [Path(folder) / name for name in about["files"] if name != SETTINGS],
                 {SETTINGS: json.dumps(settings, indent=2)}, replace=False)


ZOO_CHECKSUMS = "zoo-checksums"  # the folder beside a scale's recorded results: the zoos carried cells trained on


def record_zoo(store: Path, recorded: Path, scale: str, column: str) -> Path | None:
    """Keep the checksum record (``zoo checksums``) of the zoo a carried cell trains on in
    ``recorded/SCALE/zoo-checksums/COLUMN-ID.json``, so that the next machine, whose zoo is remade, can
    tell with ``zoo compare`` which of its parts differ (where its IDs do). A record of the same content
    there gains what it lacks (the networks ID and column digests of records written before them) and
    this machine's CPU in ``machines`` (each CPU that made this content). Returns the file written (None:
    already complete, or the store has no content ID)."""
    from zoo.store.compare import record
    from zoo.store.identity import short
    from zoo.store.manifest import machine_description

    made = record(store)
    if made["content_id"] is None:
        return None
    path = Path(recorded) / scale / ZOO_CHECKSUMS / f"{column}-{short(made['content_id'])}.json"
    cpu = (made.get("machine") or machine_description())["cpu"]
    if path.is_file():
        kept = json.loads(path.read_text())
        if kept.get("content_id") != made["content_id"]:
            raise CarriedError(f"{path} records another zoo ({kept.get('content_id')}); restore it from git")
        machines = kept.get("machines") or [(kept.get("machine") or {"cpu": kept.get("cpu")}).get("cpu")]
        changed = {k: made[k] for k in ("networks_id", "columns", "checksum_record") if kept.get(k) is None}
        if not any(_same_cpu(cpu, known) for known in machines if known):
            changed["machines"] = [*[m for m in machines if m], cpu]
        if not changed:
            return None
        made = {**kept, **changed}
    else:
        made["machines"] = [cpu]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(made, indent=1) + "\n")
    return path


def _same_cpu(a: dict, b: dict) -> bool:
    return all(a.get(k) == b.get(k) for k in ("model name", "cpu family", "model"))
