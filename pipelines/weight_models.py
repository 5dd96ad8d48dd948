"""Issue 32's weight-space models table: every ``zoo train --model`` on the MNIST INR and Fashion-MNIST
INR classification tasks, one protocol, filled cell by cell over days and resumed after interruption.

    python -m pipelines.weight_models --scale ci --dataset mnist      # each model's lr chosen on val (hours)
    python -m pipelines.weight_models --scale full --dataset mnist    # one cell at a time (days); rerun to go on
    python -m pipelines.weight_models --scale full --models dwsnet --lr dwsnet=1e-3   # an lr given, not from ci

The zoos are inr_classification's (``--stores``: that pipeline's ``--out``; a missing one is
generated there). ``ci``: on the ci zoo (4,583 / 417 / 2,000 INRs of offline real images), each
model's learning rate is chosen on val among ``zoo train``'s candidates (``zoo train`` without
``--lr``), at the full-scale model size (48 channels; NFNs and baselines sized to that DWSNet, NG and ScaleGMN at their papers' sizes) and the model's default
batch size, one seed, 40 epochs (10 for the graph models, whose batch of 64 makes 8x the steps of
an epoch). ``full``: the paper's 55,000 / 5,000 / 10,000 INRs, each model one seed for 100 epochs at
the lr its ci cell chose (or ``--lr MODEL=LR``), as the recorded full-scale DWSNet run; cheapest
first (ci's time per epoch), one at a time. ``smoke``: ci's protocol on a tiny zoo, seconds.

Every cell is a ``zoo train`` run directory under ``OUT/SCALE/runs``: a rerun reuses a finished
one (never retrains it) and resumes an unfinished one from its last epoch. ``--normalize`` is left
to ``zoo train``'s per-model default (orbit for the models that claim a symmetry, else entry).
Written: ``OUT/SCALE/results-DATASET.json`` (each cell: status, lr and where it was chosen,
accuracies, parameters, epochs, wall time, its commands) and ``report-DATASET.md``, rewritten before
and after every cell.
"""

from __future__ import annotations

import argparse
import json
import shlex
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from dws.tasks.checkpoint import CHECKPOINTS, FINISHED, Checkpoint
from dws.tasks.options import (DEFAULTS, MODEL_BATCH_SIZES, MODELS as TRAIN_MODELS, TrainOptions, model_defaults,
                              with_task_defaults)
from dws.tasks.prepare import SPEED_ONLY, option_flag
from dws.tasks.protocol import PAPER_LRS
from dws.tasks.rundir import finished_run
from dws.tasks.run import train_run
from zoo.options import require_positive

from .common import write_report
from .inr_classification import DATASETS, inr_store

# issue 32's rows, cheapest first (training step per network on a CPU, docs/train.md "Speed"): the
# order of the ci cells, and of the full ones whose ci cost is unknown
MODELS = ("mlp", "mlp-align", "dwsnet", "nfn-hnp", "nfn-np", "ng-gnn", "scalegmn", "ng-transformer", "scalegmn-b")
# the models --models may name: every zoo train model classifies INRs (all 13 ran at smoke, 2026-11-27)
CLASSIFY_MODELS = TRAIN_MODELS
TASK = "classify"
# inr_classification's default --out, where its zoos are
DEFAULT_STORES = "results/inr-classification"


@dataclass(frozen=True)
class Protocol:
    """A scale of the table: which zoo, how every model trains, and where its lr comes from."""

    store: str  # the inr_classification scale whose zoo
    train: dict  # TrainOptions for every model (lr None: chosen on val among PAPER_LRS)
    lr_from: str | None = None  # the scale whose results give each model's lr (None: this one chooses)
    epochs: dict = field(default_factory=dict)  # per-model epochs where they differ from train's
    progress: bool = True  # training progress bars


SCALES = {
    "smoke": Protocol("smoke", dict(epochs=2, seeds=1, lr=None, batch_size=8, hidden_channels=4), progress=False),
    "ci": Protocol("ci", dict(epochs=40, seeds=1, lr=None), epochs={m: 10 for m in MODEL_BATCH_SIZES}),
    "full": Protocol("full", dict(epochs=100, seeds=1), lr_from="ci"),
}
SCALE_HELP = {"smoke": "seconds, for the tests",
              "ci": "each model's lr chosen on val, on the ci zoo (hours on a 2-core CPU, the graph models most)",
              "full": "each model 100 epochs at its ci lr on the paper's zoo, one cell at a time (days)"}
NOT_RUN, RUNNING, UNFINISHED, DONE = "not run", "running", "unfinished", "done"


# ------------------------------------------------------------------------------ options
def parse_lrs(values: list[str] | None, models=CLASSIFY_MODELS) -> dict[str, float]:
    """``--lr MODEL=LR`` (repeated, or comma-separated) as ``{model: lr}``; ValueError in one line."""
    lrs = {}
    for item in (part for value in values or () for part in value.split(",") if part):
        model, sep, text = item.partition("=")
        if not sep or not model or not text:
            raise ValueError(f"--lr takes MODEL=LR (e.g. --lr dwsnet=1e-3), got {item!r}")
        if model not in models:
            raise ValueError(f"--lr {item}: {model!r} is not one of {', '.join(models)}")
        try:
            lr = float(text)
        except ValueError:
            raise ValueError(f"--lr {item}: {text!r} is not a number") from None
        require_positive(f"--lr {model}=", lr)
        lrs[model] = lr
    return lrs


def parse_models(text: str | None) -> tuple[str, ...]:
    if not text:
        return MODELS
    models = tuple(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))
    unknown = [m for m in models if m not in CLASSIFY_MODELS]
    if unknown or not models:
        raise ValueError(f"--models {text!r}: {', '.join(unknown) or 'none given'}; choose from "
                         f"{', '.join(CLASSIFY_MODELS)}")
    return models


def pipeline_command(scale: str, dataset: str, models, out_root: Path, stores: Path, lrs: dict) -> str:
    argv = ["python", "-m", "pipelines.weight_models", "--scale", scale, "--dataset", dataset, "--models",
            ",".join(models), "--out", str(out_root), "--stores", str(stores)]
    if lrs:
        argv += ["--lr", ",".join(f"{m}={lr:g}" for m, lr in lrs.items())]
    return shlex.join(argv)


def train_command(opts: TrainOptions) -> str:
    """``opts`` as the ``zoo train`` command line that trains the same run (defaults left out)."""
    negated = {"bn": "--no-bn", "augment": "--no-augment", "standardize_target": "--raw-target",
               "resume": "--restart"}
    argv = ["zoo", "train", opts.store, "--model", opts.model]  # named even where it is the default
    for f in fields(opts):
        value = getattr(opts, f.name)
        if f.name in ("store", "model", "progress") or value == DEFAULTS[f.name]:
            continue
        if isinstance(value, bool):
            argv.append(option_flag(f.name) if value else negated[f.name])
        else:
            argv += [option_flag(f.name), f"{value:g}" if isinstance(value, float) else str(value)]
    return shlex.join(argv)


# ------------------------------------------------------------------------------ cells
def cell_options(protocol: Protocol, store: Path, out: Path, model: str, lr: float | None) -> TrainOptions:
    """The ``zoo train`` options of one cell; its run directory is ``out/runs/STORE-MODEL-classify``."""
    train = {**protocol.train, "epochs": protocol.epochs.get(model, protocol.train["epochs"])}
    if lr is not None:
        train["lr"] = lr
    run_dir = out / "runs" / f"{store.name}-{model}-{TASK}"
    return TrainOptions(store=str(store), model=model, task=TASK, out=str(run_dir), progress=protocol.progress, **train)


def planned_epochs(opts: TrainOptions) -> int:
    """Epochs of every training of the cell: one per candidate lr (lr chosen on val), then the other seeds."""
    return opts.epochs * ((len(PAPER_LRS) if opts.lr is None else 1) + opts.seeds - 1)


def epochs_done(run_dir: Path) -> int:
    """Epochs the unfinished cell's trainings completed (from their checkpoints)."""
    done = 0
    for path in sorted((run_dir / CHECKPOINTS).glob("*.pt")):
        saved = Checkpoint(path, path.stem).read()
        done += len(saved["outcome"]["history"]) if saved["status"] == FINISHED else saved["values"]["epoch"]
    return done


def refuse_other_finished(opts: TrainOptions) -> None:
    """zoo train would train a run directory over a finished run of other settings; the table never does."""
    config_file = Path(opts.out) / "config.json"
    if not (Path(opts.out) / "metrics.json").is_file() or not config_file.is_file():
        return
    saved = json.loads(config_file.read_text()).get("options", {})  # resolved, as zoo train trained
    asked = asdict(with_task_defaults(opts))
    differ = [option_flag(k) for k in asked if k not in SPEED_ONLY and k != "store" and saved.get(k) != asked[k]]
    why = f"other {', '.join(differ)}" if differ else "another store or zoo train version"
    raise ValueError(f"{opts.out} holds a finished run with {why}; the table never retrains a finished cell: "
                     f"move it away to train this one, or use another --out")


def cell_record(opts: TrainOptions, lr_from: str, command: str, wall_seconds: float | None = None,
                params: int | None = None, running: bool = False) -> dict:
    """What the table says of one cell now: finished (its metrics), running, unfinished or not run.
    ``params``: the model's size where the cell has not finished (known from the scale its lr came from)."""
    resolved = model_defaults(opts)  # zoo train's per-model batch size and --normalize
    record = {"model": opts.model, "lr": opts.lr, "lr_from": lr_from, "normalize": resolved.normalize,
              "batch_size": resolved.batch_size, "params": params, "epochs_planned": planned_epochs(opts),
              "wall_seconds": wall_seconds, "run_dir": opts.out, "command": command, "zoo_train": train_command(opts)}
    done = finished_run(opts)
    if done is not None:
        metrics = {k: done[k] for k in ("lr", "lr_search", "params", "seconds")}
        return {**record, **metrics, "status": DONE, "epochs_done": record["epochs_planned"],
                "val_accuracy": done["val"][0]["accuracy"], "test_accuracy": done["summary"]["accuracy"]["mean"],
                "wall_seconds": sum(done["seconds"]) if wall_seconds is None else wall_seconds}
    done_epochs = epochs_done(Path(opts.out))
    status = RUNNING if running else UNFINISHED if done_epochs else NOT_RUN
    return {**record, "status": status, "epochs_done": done_epochs}


# ------------------------------------------------------------------------------ the table
def results_path(out: Path, dataset: str) -> Path:
    return out / f"results-{dataset}.json"


def read_cells(path: Path) -> dict:
    try:
        return json.loads(path.read_text())["cells"]
    except (OSError, ValueError, KeyError):
        return {}


def chosen_lrs(protocol: Protocol, out: Path, dataset: str, models, given: dict, stores: Path) -> dict:
    """``{model: (lr, where it was chosen)}``: given on the command line, else (``lr_from``) the finished
    cell of that scale; a model with neither is refused in one line that names the command to run."""
    if protocol.lr_from is None:
        return {m: (given[m], "--lr") if m in given else (None, "val") for m in models}
    cells = read_cells(results_path(out.parent / protocol.lr_from, dataset))
    missing = [m for m in models if m not in given and cells.get(m, {}).get("status") != DONE]
    if missing:
        first = pipeline_command(protocol.lr_from, dataset, missing, out.parent, stores, {})
        raise ValueError(f"no learning rate chosen at {protocol.lr_from} scale for {', '.join(missing)}: run "
                         f"`{first}` first, or pass --lr MODEL=LR")
    return {m: (given[m], "--lr") if m in given else (cells[m]["lr"], f"{cells[m]['lr_from']} at {protocol.lr_from}")
            for m in models}


def cost_order(models, cells: dict) -> list[str]:
    """Cheapest first by seconds per planned epoch of each model's cell in ``cells`` (unknown: last, as listed)."""
    def cost(model):
        cell = cells.get(model, {})
        known = cell.get("status") == DONE and cell.get("wall_seconds") and cell.get("epochs_planned")
        return (0, cell["wall_seconds"] / cell["epochs_planned"]) if known else (1, 0.0)

    return sorted(models, key=cost)  # stable: ties keep the given order


def fmt_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min" if seconds >= 60 \
        else f"{seconds:.0f} s"


def table_row(cell: dict) -> list[str]:
    lr = "—" if cell.get("lr") is None else f"{cell['lr']:g}"
    where = {"val": "val, this scale", "--lr": "--lr"}.get(cell["lr_from"], cell["lr_from"])
    accuracy = f"{100 * cell['test_accuracy']:.2f}" if cell["status"] == DONE else cell["status"]
    params = f"{cell['params']:,}" if cell.get("params") else "—"
    return [f"`{cell['model']}`", params, f"{lr} ({where})", cell["normalize"], str(cell["batch_size"]), accuracy,
            f"{cell['epochs_done']} / {cell['epochs_planned']}", fmt_seconds(cell.get("wall_seconds")),
            f"`{cell['zoo_train']}`"]


def write_table(out: Path, scale_name: str, dataset: str, store: Path, cells: dict, models) -> Path:
    """``results-DATASET.json`` and ``report-DATASET.md`` of the cells as they are now."""
    results_path(out, dataset).parent.mkdir(parents=True, exist_ok=True)
    results_path(out, dataset).write_text(json.dumps(
        {"scale": scale_name, "dataset": dataset, "store": str(store), "cells": cells}, indent=2))
    protocol = SCALES[scale_name]
    per_model = f", epochs {protocol.epochs}" if protocol.epochs else ""
    notes = [f"store: {store}", f"training: {protocol.train}{per_model}",
             f"lr: chosen on val among {', '.join(f'{lr:g}' for lr in PAPER_LRS)}" if protocol.lr_from is None else
             f"lr: the one its {protocol.lr_from} cell chose on val (or --lr)",
             "epochs: over every training of the cell (one per candidate lr, then the other seeds); "
             "wall time: this pipeline's sessions on the cell",
             "`--normalize` is zoo train's per-model default (orbit where the model claims a symmetry, else entry)"]
    rows = [table_row(cells[m]) for m in models if m in cells]
    return write_report(out / f"report-{dataset}.md",
                        f"Weight-space models, {DATASETS[dataset]} INR classification, scale {scale_name}",
                        ["model", "parameters", "lr (chosen on)", "normalize", "batch", "test acc. %",
                         "epochs done / planned", "wall time", "command"], rows, notes)


def run(scale_name: str, out: Path, workers: int, models=None, data_root=None, log=print, dataset: str = "mnist",
        stores: Path | None = None, lrs: dict | None = None) -> Path:
    """Fill the scale's table under ``out`` (``OUT/SCALE``), cell by cell; ``stores``: the folder whose
    ``SCALE/stores`` hold the zoos (default: ``out``'s parent, i.e. ``--out``)."""
    protocol, out = SCALES[scale_name], Path(out)
    stores = Path(stores) if stores is not None else out.parent
    models, lrs = tuple(models or MODELS), dict(lrs or {})
    chosen = chosen_lrs(protocol, out, dataset, models, lrs, stores)  # refused before any zoo is made
    source = read_cells(results_path(out.parent / protocol.lr_from, dataset)) if protocol.lr_from else {}
    if protocol.lr_from is not None:
        models = tuple(cost_order(models, source))
    store = inr_store(protocol.store, stores / protocol.store, workers, dataset, data_root, log)
    previous = read_cells(results_path(out, dataset))
    options = {m: cell_options(protocol, store, out, m, chosen[m][0]) for m in models}
    commands = {m: pipeline_command(scale_name, dataset, [m], out.parent, stores, {m: lrs[m]} if m in lrs else {})
                for m in models}

    def record(model: str, wall_seconds=None, running=False) -> dict:
        return cell_record(options[model], chosen[model][1], commands[model], wall_seconds,
                           source.get(model, {}).get("params"), running)

    cells = {m: record(m, previous.get(m, {}).get("wall_seconds")) for m in models}
    write_table(out, scale_name, dataset, store, cells, models)
    for model in models:
        opts = options[model]
        if cells[model]["status"] == DONE:
            log(f"{model}: reusing the finished run in {opts.out}")
            continue
        refuse_other_finished(opts)
        before = cells[model]["wall_seconds"] or 0.0
        cells[model] = record(model, before, running=True)
        write_table(out, scale_name, dataset, store, cells, models)
        start = time.perf_counter()
        try:
            train_run(opts, log=log)
        finally:  # an interrupted cell keeps its epochs (zoo train's checkpoints) and its time so far
            cells[model] = record(model, before + time.perf_counter() - start)
            write_table(out, scale_name, dataset, store, cells, models)
    return write_table(out, scale_name, dataset, store, cells, models)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", choices=tuple(SCALE_HELP), default="ci",
                   help="; ".join(f"{s}: {text}" for s, text in SCALE_HELP.items()) + " (default: ci)")
    p.add_argument("--dataset", choices=tuple(DATASETS), default="mnist",
                   help="the INRs: " + ", ".join(f"{k}: {v}" for k, v in DATASETS.items()) + " (default: mnist)")
    p.add_argument("--models", default=None, help=f"comma-separated (default: {','.join(MODELS)})")
    p.add_argument("--lr", action="append", metavar="MODEL=LR",
                   help="a model's learning rate instead of the one chosen on val (repeat, or comma-separate)")
    p.add_argument("--out", default="results/weight-models", help="folder for runs and tables (default: "
                                                                   "results/weight-models)")
    p.add_argument("--stores", default=DEFAULT_STORES, help="inr_classification's --out, whose zoos the table trains "
                                                            f"on (made there if missing; default: {DEFAULT_STORES})")
    p.add_argument("--data-root", default=None, help="data folder for a zoo not made yet (default: ../shared/data)")
    p.add_argument("--workers", type=int, default=2, help="zoo generate workers for a zoo not made yet (default: 2)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        models, lrs = parse_models(args.models), parse_lrs(args.lr)
        report = run(args.scale, Path(args.out) / args.scale, args.workers, models, args.data_root,
                     dataset=args.dataset, stores=Path(args.stores), lrs=lrs)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"error: {e}") from None
    print(report.read_text())


if __name__ == "__main__":
    main()
