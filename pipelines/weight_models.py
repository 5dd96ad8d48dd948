"""Issue 32's weight-space models table: every ``zoo train --model`` on five tasks (the table's
columns), one protocol, filled cell by cell over days and resumed after interruption.

    python -m pipelines.weight_models --scale ci --dataset mnist      # each model's lr chosen on val (hours)
    python -m pipelines.weight_models --scale full --dataset mnist    # one cell at a time (days); rerun to go on
    python -m pipelines.weight_models --scale full --models dwsnet --lr dwsnet=1e-3   # an lr given, not from ci
    python -m pipelines.weight_models --scale ci --column sine        # sine frequency regression
    python -m pipelines.weight_models --scale ci --column generalization   # then --scale full --store ZOO
    python -m pipelines.weight_models --scale ci --column adapt       # domain adaptation (weight-space outputs)
    python -m pipelines.weight_models --summary                      # every column in one table

Columns (``--column``; ``--dataset mnist|fmnist`` names the two INR ones, as before), each on the
zoos of the paper-reproduction pipeline that owns the task (``--stores``: that pipeline's ``--out``;
a missing zoo is generated there, or ``--store PATH`` names an existing one, checked to be the zoo
that pipeline makes at the scale) and with that pipeline's training settings:

- ``mnist``, ``fmnist``: inr_classification's INRs, ``--task classify``, test accuracy. ``ci``: on the
  ci zoo (4,583 / 417 / 2,000 INRs of offline real images) at the full-scale model size (48 channels;
  NFNs and baselines sized to that DWSNet, NG and ScaleGMN at their papers' sizes) and the model's
  default batch size, 40 epochs (10 for the graph models, whose batch of 64 makes 8x the steps of an
  epoch). ``full``: the paper's 55,000 / 5,000 / 10,000 INRs, 100 epochs at the lr of the model's ci
  cell (or ``--lr MODEL=LR``), as the recorded full-scale DWSNet run; cheapest first (ci's time per
  epoch), one at a time; the neural graphs and ScaleGMN with ``--precision bf16`` (1.4-1.7x a step on a
  CPU with native bfloat16; docs/train.md, "Precision"; on one without it, 8-12x slower there, in fp32), the
  neural graphs also with ``--compile`` (1.4-1.8x more).
- ``sine``: sine_regression's zoo (ci: 320 / 50 / 100 INRs of sin(bx)), ``--task regress`` of the
  frequency, test MSE; its settings (8 channels, 2 layers, batch 32, 40 epochs). Scales smoke, ci.
- ``generalization``: generalization's Fashion-MNIST classifier zoo, ``--task regress --target
  test_accuracy``, 100 x test MSE and Kendall's tau; its settings (``--input-reduction 16``, 16
  channels, batch 32, 15 epochs, no augmentation), except the graph models' batch: the largest whose
  activations fit the default ``--max-memory`` (``GENERALIZATION_BATCH_SIZES``). ``ci``: its 40-run
  zoo; ``full``: the 200-run zoo (``--store`` an existing one), at the lr of the ci cell.
- ``adapt``: domain_adaptation's CIFAR-10 classifiers, ``--task adapt``, the adapted classifiers' test
  accuracy on corrupted images (and before adaptation); its settings (the paper's adapter, 3 epochs at
  ci); only the models whose output is a weight space (``dws.tasks.options.ADAPT_MODELS``): the
  invariant ones are refused. Scales smoke, ci.

Every column's lr is chosen on val among ``zoo train``'s candidates (``zoo train`` without ``--lr``)
at ``ci`` (``full`` takes it from there), one seed; ``smoke``: ci's protocol on a tiny zoo, seconds.

Every cell is a ``zoo train`` run directory under ``OUT/SCALE/runs``: a rerun reuses a finished
one (never retrains it) and resumes an unfinished one from its last epoch; a cell zoo train refuses
(a model it cannot size for the zoo, a budget too small) reads ``not run: REASON`` and the others go
on; so does a cell whose fixed lr diverges (``diverged at lr LR (...)``: not trained again, until
``--lr MODEL=LR`` gives another, which moves the diverged run aside to ``RUN.diverged-lrLR``).
``--normalize`` is left to ``zoo train``'s per-model default (orbit for the models that claim a
symmetry, else entry; none for adapt). Written: ``OUT/SCALE/results-COLUMN.json`` (each cell: status,
lr and where it was chosen, metrics, parameters, epochs, wall time, its commands) and
``report-COLUMN.md``, rewritten before and after every cell; ``--summary``: ``OUT/summary.md``, every
column at its table's scale (INR columns and generalization: full; sine and adapt: ci), with the
published numbers issue 32 names beside ours (``PUBLISHED``).

Cells finished on other machines stand here too: ``--record`` copies every finished cell under
``OUT`` into ``--recorded`` (default ``docs/recorded/weight-models``, committed with the code), and a
machine without a cell's run directory takes the recorded one (its metrics, and the lr a full cell
needs) instead of retraining it, where its ``zoo train`` command is the one the cell would run now
(the zoo's location aside); ``--recorded none`` ignores them. Unfinished cells travel too: ``--record``
carries each one's checkpoints, where they are small enough, and a machine without a run of the cell
resumes the carried one where it continues the same training on the same networks (``pipelines.carried``).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np

from dws.tasks.checkpoint import CHECKPOINTS, FINISHED, Checkpoint, CheckpointError, RunCheckpoints
from dws.tasks.objectives import TASKS
from dws.tasks.options import (ADAPT_MODELS, DEFAULTS, MODEL_BATCH_SIZES, MODELS as TRAIN_MODELS, NG_MODELS,
                               SCALEGMN_MODELS, TrainOptions, model_defaults, model_version, recorded_version,
                               with_task_defaults)
from dws.tasks.prepare import SPEED_ONLY, option_flag
from dws.tasks.protocol import PAPER_LRS
from dws.tasks.rundir import finished_run
from dws.tasks.run import train_run
from dws.tasks.trainer import slow_precision
from zoo.devices import resolve_device
from zoo.options import require_positive
from zoo.store import WeightStore

from . import domain_adaptation, generalization, inr_classification, sine_regression
from .carried import (carried_folder, carry, checkpoint_files, mismatch, put_back, read_about, record_zoo,
                      store_identity)
from .common import Scale, write_report
from .inr_classification import DATASETS, FMNIST, inr_store

# issue 32's rows, cheapest first (training step per network on a CPU, docs/train.md "Speed"): the
# order of the ci cells, and of the full ones whose ci cost is unknown
MODELS = ("mlp", "mlp-align", "dwsnet", "nfn-hnp", "nfn-np", "ng-gnn", "scalegmn", "ng-transformer", "scalegmn-b")
# the models --models may name: every zoo train model classifies INRs (all 13 ran at smoke, 2026-11-27)
CLASSIFY_MODELS = TRAIN_MODELS


@dataclass(frozen=True)
class Protocol:
    """A scale of the table: which zoo, how every model trains, and where its lr comes from."""

    store: str  # the scale of the zoo, in the pipeline that makes it
    train: dict  # TrainOptions for every model (lr None: chosen on val among PAPER_LRS)
    lr_from: str | None = None  # the scale whose results give each model's lr (None: this one chooses)
    epochs: dict = field(default_factory=dict)  # per-model epochs where they differ from train's
    batch_sizes: dict = field(default_factory=dict)  # per-model batch sizes where they differ from train's
    progress: bool = True  # training progress bars
    # models whose cells train with zoo train --precision bf16: the graph models' full cells, 1.4-1.7x a step on
    # a CPU with native bfloat16 (more than --compile's 1.1-1.2x alone), whose sine cells at bf16 differ from
    # fp32's by less than the seeds do (docs/train.md, "Precision"); on a CPU without it (8-12x slower there)
    # they train in fp32 (cell_precision), and a cell recorded in either precision stands for the other
    bf16: tuple = ()
    # models whose cells also train with zoo train --compile: the neural graphs' full cells, whose compiled bf16
    # step is 1.8x (ng-gnn) and 1.4x (ng-transformer) the eager one on this CPU (session 32, docs/train.md);
    # ScaleGMN's gains 1.04x, not worth its minutes of compiling; where they train in fp32 (cell_precision),
    # ng-gnn's compiled step is 1.20x its eager one on an AVX2 CPU, ng-transformer's 0.99x
    compiled: tuple = ()


# the INR columns
SCALES = {
    "smoke": Protocol("smoke", dict(epochs=2, seeds=1, lr=None, batch_size=8, hidden_channels=4), progress=False),
    "ci": Protocol("ci", dict(epochs=40, seeds=1, lr=None), epochs={m: 10 for m in MODEL_BATCH_SIZES}),
    "full": Protocol("full", dict(epochs=100, seeds=1), lr_from="ci", bf16=NG_MODELS + SCALEGMN_MODELS,
                     compiled=NG_MODELS),
}
SCALE_HELP = {"smoke": "seconds, for the tests",
              "ci": "each model's lr chosen on val, on the ci zoo (hours on a 2-core CPU, the graph models most)",
              "full": "each model 100 epochs at its ci lr on the paper's zoo, one cell at a time (days)"}
NOT_RUN, RUNNING, UNFINISHED, DONE = "not run", "running", "unfinished", "done"
# finished cells committed with the code (--record writes them): results are machine-local, and a new machine
# had lost every run directory twice (sessions 12 and 20), so without these it retrained days of cells
CHECKOUT = Path(__file__).resolve().parents[1]
RECORDED = CHECKOUT / "docs" / "recorded" / "weight-models"
TABLE = "table.md"  # RECORDED/table.md: the recorded cells as one table (write_recorded_table), linked by the README
# RECORDED/earlier.json: full-scale numbers measured before the table's protocol (fixed lr, run directories lost),
# transcribed from docs/train.md and shown below the recorded table, apart from its cells (read_earlier)
EARLIER = "earlier.json"
EARLIER_KEYS = ("column", "scale", "model", "normalize", "metric", "value", "lr", "date", "command", "documented")
# optional: how the lr was had (default "fixed"), and the options a measurement trained with besides the table's
EARLIER_TEXTS = ("lr_from", "options")
# a cell zoo train refused to train (e.g. a model it cannot size for the zoo, or a --max-memory too small):
# its reason (the cell's "refused") shown as "not run: REASON" in the tables; a rerun tries again
REFUSED = "refused"
# a cell whose fixed lr (a full cell's, from ci or --lr) diverged: zoo train keeps it so (a rerun does not train
# it again), the tables say where, and the others go on; --lr MODEL=LR with another lr trains it anew
DIVERGED = "diverged"


def not_run(cell: dict) -> str:
    """What the tables show of a cell zoo train refused: ``not run: REASON``."""
    return f"{NOT_RUN}: {cell['refused']}"


def diverged(cell: dict) -> str:
    """What the tables show of a cell whose lr diverged, and how to train it anyway."""
    return f"{DIVERGED} at lr {cell['lr']:g} ({cell['diverged']}: --lr {cell['model']}=LR)"


def shown_status(cell: dict) -> str:
    """A cell's status as the tables show it: with the reason where zoo train refused it or its lr diverged."""
    if cell["status"] == REFUSED:
        return not_run(cell)
    if cell["status"] == DIVERGED:
        return diverged(cell)
    return cell["status"]


def task_protocol(scale: Scale, lr_from: str | None = None, batch_sizes: dict | None = None, **train) -> Protocol:
    """A paper pipeline's training settings at ``scale`` (``train``: settings added) under the table's
    protocol: one seed, and the lr chosen on val (or, ``lr_from``, taken from that scale's cells);
    ``batch_sizes``: per-model batch sizes instead of the pipeline's."""
    return Protocol(scale.name, {**scale.train, "seeds": 1, "lr": None, **train}, lr_from,
                    progress=scale.name != "smoke", batch_sizes=dict(batch_sizes or {}))


@dataclass(frozen=True)
class Metric:
    """A number a column reports: the mean over the run's seeds of ``name`` in its metrics.json ``test``."""

    key: str  # in the cell's record
    header: str
    name: str
    scale: float = 1.0
    digits: int = 2

    def read(self, done: dict) -> float:
        return float(np.mean([seed[self.name] for seed in done["test"]]))

    def show(self, value: float) -> str:
        if math.isnan(value):  # Kendall's tau of constant predictions
            return "undefined (constant predictions)"
        return f"{value * self.scale:.{self.digits}f}"


@dataclass(frozen=True)
class Column:
    """A column of the table: its task, its zoo and training settings at each scale, what it reports."""

    title: str
    short: str  # the summary's header
    task: str
    scales: dict  # scale name: Protocol
    make_store: Callable  # (zoo scale, the zoo pipeline's OUT/SCALE, workers, data_root, log) -> store
    generate: Callable  # zoo scale -> that pipeline's zoo generate settings (--store is checked against them)
    selection: str  # the val metric the lr is chosen on (recorded as val_<selection>)
    metrics: tuple  # Metric, the first the table's
    stores: str  # default --stores: the zoo pipeline's --out
    table_scale: str  # the scale the summary shows
    models: tuple = CLASSIFY_MODELS  # the models it applies to


ACCURACY = Metric("test_accuracy", "test acc. %", "accuracy", 100)


def inr_column(dataset: str) -> Column:
    def make_store(scale, folder, workers, data_root, log):
        return inr_store(scale, folder, workers, dataset, data_root, log)

    def generate(scale):
        return {**inr_classification.SCALES[scale].generate, **(FMNIST if dataset == "fmnist" else {})}

    return Column(f"{DATASETS[dataset]} INR classification", f"{DATASETS[dataset]} INRs", "classify", SCALES,
                  make_store, generate, "accuracy", (ACCURACY,), "results/inr-classification", "full")


def pipeline_scales(pipeline, names, full_lr_from: str | None = None, batch_sizes: dict | None = None,
                    **train) -> dict:
    """:func:`task_protocol` of each of a paper pipeline's scales in ``names``; ``full`` takes its lr from
    ``full_lr_from``; ``batch_sizes``: per scale, per-model batch sizes instead of the pipeline's."""
    return {name: task_protocol(pipeline.SCALES[name], full_lr_from if name == "full" else None,
                                (batch_sizes or {}).get(name), **train)
            for name in names}


# The generalization column's graph models and nfn-np: they hold a state per weight of the 784-128-128-128-10
# classifiers (after --input-reduction 16, dws.nn.reduction.InputReduced: 2,048 in W_1 instead of 100,352),
# and the pipeline's batch of 32 needs more activations than zoo train's default --max-memory of 4 GiB,
# which refuses the cell. Each trains instead on the largest power-of-two batch whose activations
# (dws.stream.memory.activation_bytes x the model's ACTIVATION_PEAK) fit next to the runtime, model and
# chunks: autograd saves per network 0.12 (ng-gnn), 0.23 (scalegmn), 0.51 (ng-transformer), 0.48
# (scalegmn-b) and 0.22 GiB (nfn-np) at ci's and full's 16 channels; smoke's batch of 8 fits all of them
# (measured 2026-12-03, session 28; without the reduction ng-gnn and scalegmn took 4, ng-transformer and
# scalegmn-b 1; tests/test_weight_models_generalization.py checks that they fit). full uses ci's
# batches, so the lr chosen at ci carries over.
GRAPH_BATCH_SIZES = {"ng-gnn": 16, "scalegmn": 8, "ng-transformer": 4, "scalegmn-b": 4, "nfn-np": 8}
GENERALIZATION_BATCH_SIZES = {"smoke": {},  # smoke's batch of 8 fits every model
                              "ci": GRAPH_BATCH_SIZES, "full": GRAPH_BATCH_SIZES}


COLUMNS = {
    "mnist": inr_column("mnist"),
    "fmnist": inr_column("fmnist"),
    "sine": Column(
        "sine frequency regression", "sine", "regress", pipeline_scales(sine_regression, ("smoke", "ci")),
        lambda scale, folder, workers, data_root, log: sine_regression.sine_store(scale, folder, workers, log),
        lambda scale: sine_regression.SCALES[scale].generate, "mse", (Metric("test_mse", "test MSE", "mse", 1, 4),),
        "results/sine-regression", "ci"),
    "generalization": Column(
        "generalization prediction (Fashion-MNIST classifiers)", "generalization", "regress",
        pipeline_scales(generalization, ("smoke", "ci", "full"), "ci", GENERALIZATION_BATCH_SIZES,
                        target=generalization.TARGET),
        generalization.classifier_store, lambda scale: generalization.SCALES[scale].generate, "mse",
        (Metric("test_mse", "100 × test MSE", "mse", 100, 3), Metric("test_kendall_tau", "Kendall τ", "kendall_tau",
                                                                     1, 3)),
        "results/generalization", "full"),
    "adapt": Column(
        "domain adaptation (CIFAR-10 -> CIFAR-10-Corrupted)", "adaptation", "adapt",
        pipeline_scales(domain_adaptation, ("smoke", "ci")), domain_adaptation.cifar_store,
        lambda scale: domain_adaptation.SCALES[scale].generate, "accuracy",
        (Metric("test_accuracy", "test acc. % (adapted)", "accuracy", 100),
         Metric("test_accuracy_before", "before adaptation %", "accuracy_before", 100)),
        "results/domain-adaptation", "ci", ADAPT_MODELS),
}
# the published numbers issue 32 names, each on its own paper's networks, shown beside ours in the summary:
# (column, metric key): {model: value as the summary shows ours}. The MLPs' are the DWSNet paper's; the
# generalization column's Kendall tau is on the Small CNN Zoo's CIFAR10-GS, not our Fashion-MNIST classifiers
PUBLISHED = {
    ("mnist", "test_accuracy"): {"mlp": "17.55", "mlp-align": "58.98", "dwsnet": "85.71", "nfn-hnp": "79.11",
                                 "nfn-np": "78.50", "ng-gnn": "91.40", "scalegmn": "96.57", "scalegmn-b": "96.59"},
    ("fmnist", "test_accuracy"): {"mlp": "19.91", "mlp-align": "47.79", "dwsnet": "67.06", "nfn-hnp": "68.94",
                                  "nfn-np": "68.19", "ng-gnn": "68.00", "scalegmn": "80.46", "scalegmn-b": "80.78"},
    ("generalization", "test_kendall_tau"): {"nfn-hnp": "0.934", "nfn-np": "0.922", "ng-gnn": "0.930",
                                             "ng-transformer": "0.935"},
}
PUBLISHED_WHERE = {"generalization": "Small CNN Zoo CIFAR10-GS"}
INR_COLUMNS = tuple(DATASETS)  # named by --dataset too, as before the other columns


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


def pipeline_command(scale: str, column: str, models, out_root: Path, stores: Path, lrs: dict,
                     store: Path | None = None) -> str:
    argv = ["python", "-m", "pipelines.weight_models", "--scale", scale,
            "--dataset" if column in INR_COLUMNS else "--column", column, "--models", ",".join(models),
            "--out", str(out_root), "--stores", str(stores)]
    if store is not None:
        argv += ["--store", str(store)]
    if lrs:
        argv += ["--lr", ",".join(f"{m}={lr:g}" for m, lr in lrs.items())]
    return shlex.join(argv)


def column_models(column: str, models, log=print) -> tuple[str, ...]:
    """The column's cells: ``models`` (a model the column does not apply to refused in one line), or by
    default issue 32's rows that it applies to (the others said in one line)."""
    applies = COLUMNS[column].models
    if models is None:
        skipped = [m for m in MODELS if m not in applies]
        if skipped:
            log(f"--column {column}: no cell for {', '.join(skipped)} (invariant models: --task {COLUMNS[column].task} "
                f"needs a weight-space output)")
        return tuple(m for m in MODELS if m in applies)
    refused = [m for m in models if m not in applies]
    if refused:
        raise ValueError(f"--column {column} trains --task {COLUMNS[column].task}, which needs a model whose output "
                         f"is a weight space ({', '.join(applies)}); {', '.join(refused)} "
                         f"{'is' if len(refused) == 1 else 'are'} invariant: its cell is '— (invariant model)'")
    return tuple(models)


def column_protocol(column: str, scale_name: str) -> Protocol:
    scales = COLUMNS[column].scales
    if scale_name not in scales:
        raise ValueError(f"--column {column} has no {scale_name} scale (its scales: {', '.join(scales)})")
    return scales[scale_name]


def existing_store(path: Path, column: str, protocol: Protocol) -> Path:
    """``--store``: a complete zoo of the kind (and ``--limit``) the column's pipeline makes at the scale."""
    manifest = WeightStore(path).manifest  # StoreError (one line) where it is no complete store
    want = COLUMNS[column].generate(protocol.store)
    have = manifest.get("kind"), manifest.get("generation", {}).get("limit")
    if have != (want["kind"], want.get("limit")):
        raise ValueError(f"--store {path} is a {have[0]} zoo of --limit {have[1]}; --column {column} at "
                         f"{protocol.store} scale trains on a {want['kind']} zoo of --limit {want.get('limit')}")
    return Path(path)


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
def cell_options(protocol: Protocol, store: Path, out: Path, model: str, lr: float | None,
                 task: str = "classify") -> TrainOptions:
    """The ``zoo train`` options of one cell; its run directory is ``out/runs/STORE-MODEL-TASK``."""
    train = {**protocol.train, "epochs": protocol.epochs.get(model, protocol.train["epochs"])}
    if model in protocol.batch_sizes:
        train["batch_size"] = protocol.batch_sizes[model]
    if lr is not None:
        train["lr"] = lr
    if model in protocol.bf16:
        train["precision"] = "bf16"
    if model in protocol.compiled:
        train["compile"] = True
    run_dir = out / "runs" / f"{store.name}-{model}-{task}"
    return TrainOptions(store=str(store), model=model, task=task, out=str(run_dir), progress=protocol.progress, **train)


def planned_epochs(opts: TrainOptions) -> int:
    """Epochs of every training of the cell: one per candidate lr (lr chosen on val), then the other seeds."""
    return opts.epochs * ((len(PAPER_LRS) if opts.lr is None else 1) + opts.seeds - 1)


class Progress(NamedTuple):
    """What an unfinished cell's checkpoints say of its trainings (lr candidates, seeds) so far."""

    epochs: int  # completed, over every training
    seconds: float  # those epochs took
    best: float | None = None  # the best validation value of the task's selection metric in any epoch
    best_epoch: int | None = None  # its epoch (1-based)
    best_training: str | None = None  # the checkpoint's label (e.g. lr0.0001-seed0)
    # the mean time of the running training's last RECENT_EPOCHS epochs (None: none recorded, e.g. checkpoints
    # written before zoo train kept epoch times): the pace now, where the average over sessions mixes in
    # epochs that shared the CPU with other jobs
    recent_epoch_seconds: float | None = None
    partial: float = 0.0  # the share of the running epoch done, where zoo train saved within it (--checkpoint-minutes)


RECENT_EPOCHS = 5


def checkpoint_progress(run_dir: Path, task: str) -> Progress:
    """How far the unfinished cell's trainings are (from their checkpoints), and the best epoch of any so
    far on ``task``'s validation metric: a cell that trains for hours shows what it has reached."""
    selection = TASKS[task]
    epochs, seconds, best, recent, partial = 0, 0.0, (None, None, None), None, 0.0
    for path in sorted((run_dir / CHECKPOINTS).glob("*.pt")):
        saved = Checkpoint(path, path.stem).read()
        if saved["status"] == FINISHED:
            done = saved["outcome"]
            epochs += len(done["history"])
        else:
            done = saved["values"]
            epochs += done["epoch"]
            last = done.get("epoch_seconds", [])[-RECENT_EPOCHS:]
            recent = sum(last) / len(last) if last else recent
            within = done.get("within")  # (its seconds are in the training's)
            if within and within.get("of"):  # (saved after the epoch's last batch: not yet validated, < 100%)
                partial = min(within["batches"] / within["of"], 0.99)
        seconds += done.get("seconds", 0.0)
        for entry in done["history"]:
            value = entry.get(f"val_{selection.metric}")
            if value is not None and math.isfinite(value) and selection.better(value, best[0]):
                best = (value, entry["epoch"] + 1, path.stem)
    return Progress(epochs, seconds, *best, recent, partial)


def move_aside(run_dir: Path, suffix: str, held: str) -> Path:
    """Move a run directory that holds another cell's run (``held`` says what) to ``RUN.SUFFIX``, kept; a
    folder already there is refused, so nothing is overwritten. Returns where it went."""
    aside = run_dir.with_name(f"{run_dir.name}.{suffix}")
    if aside.exists():
        raise ValueError(f"{run_dir} holds {held}, and {aside} exists: move one of them away")
    run_dir.rename(aside)
    return aside


def refuse_other_finished(opts: TrainOptions, log=print) -> None:
    """zoo train would train a run directory over a finished run of other settings; the table never does.
    A finished run of the model's older code (dws.tasks.options.MODEL_VERSIONS) is another cell: it is
    moved aside to ``RUN.model-vN`` (kept, said in one line) and the cell trains anew."""
    config_file = Path(opts.out) / "config.json"
    if not (Path(opts.out) / "metrics.json").is_file() or not config_file.is_file():
        return
    config = json.loads(config_file.read_text())
    trained = recorded_version(config)
    if trained != model_version(opts.model):
        aside = move_aside(Path(opts.out), f"model-v{trained}", f"a finished run of {opts.model} version {trained}")
        log(f"{opts.model}: the finished run in {opts.out} is of model version {trained} (now "
            f"{model_version(opts.model)}): moved to {aside}; training the cell anew")
        return
    saved = config.get("options", {})  # resolved, as zoo train trained
    asked = asdict(with_task_defaults(opts))
    differ = [option_flag(k) for k in asked if k not in SPEED_ONLY and k != "store" and saved.get(k) != asked[k]]
    why = f"other {', '.join(differ)}" if differ else "another store or zoo train version"
    raise ValueError(f"{opts.out} holds a finished run with {why}; the table never retrains a finished cell: "
                     f"move it away to train this one, or use another --out")


def move_aside_diverged(opts: TrainOptions, log=print) -> None:
    """A cell trained at another lr than the one that diverged in its run directory (``--lr MODEL=LR`` after
    a divergence): zoo train would refuse the directory (an unfinished run of other settings), so the
    diverged run is moved aside to ``RUN.diverged-lrLR``, kept, said in one line, and the cell trains anew."""
    run_dir = Path(opts.out)
    # the unfinished run's settings (None: nothing saved; an unreadable file is zoo train's clear error)
    saved = RunCheckpoints(run_dir, {}).saved_settings() if opts.lr is not None else None
    trained_lr = (saved or {}).get("--lr")
    if trained_lr is None or trained_lr == opts.lr:
        return
    outcomes = [Checkpoint(path, path.stem).read() for path in (run_dir / CHECKPOINTS).glob("*.pt")]
    if not any(done["status"] == FINISHED and "diverged" in done["outcome"] for done in outcomes):
        return
    aside = move_aside(run_dir, f"diverged-lr{trained_lr:g}", f"a run that diverged at lr {trained_lr:g}")
    log(f"{opts.model}: the run in {run_dir} diverged at lr {trained_lr:g}: moved to {aside}; training the cell "
        f"anew at lr {opts.lr:g}")


def trained_seconds(metrics: dict) -> float:
    """A finished run's training time by zoo train's own clock, which its checkpoints carry across
    interrupted sessions: every training (lr search included), or its seed runs' for runs written
    before ``training_seconds`` was. The pipeline's own clock loses a session killed mid-cell."""
    return metrics.get("training_seconds", sum(metrics["seconds"]))


def trained_epochs(metrics: dict, planned: int) -> int:
    """The epochs a finished run's trainings completed: fewer than planned where early stopping or a
    diverged lr candidate ended one. Runs written before ``training_epochs`` was show the plan."""
    return metrics.get("training_epochs", planned)


def cell_record(opts: TrainOptions, lr_from: str, command: str, wall_seconds: float | None = None,
                params: int | None = None, running: bool = False, column: str = "mnist") -> dict:
    """What the table says of one cell now: finished (its metrics), running, unfinished or not run.
    ``params``: the model's size where the cell has not finished (known from the scale its lr came from)."""
    resolved = model_defaults(opts)  # zoo train's per-model batch size and --normalize
    record = {"model": opts.model, "lr": opts.lr, "lr_from": lr_from, "normalize": resolved.normalize,
              "batch_size": resolved.batch_size, "params": params, "epochs_planned": planned_epochs(opts),
              "wall_seconds": wall_seconds, "run_dir": opts.out, "command": command, "zoo_train": train_command(opts)}
    done = finished_run(opts)
    if done is not None:
        spec = COLUMNS[column]
        metrics = {k: done[k] for k in ("lr", "lr_search", "params", "seconds")}
        val = float(np.mean([seed[spec.selection] for seed in done["val"]]))
        return {**record, **metrics, "status": DONE, "epochs_done": trained_epochs(done, record["epochs_planned"]),
                "model_version": model_version(opts.model), **store_identity(Path(opts.store)),
                f"val_{spec.selection}": val, **{m.key: m.read(done) for m in spec.metrics},
                "wall_seconds": max(wall_seconds or 0.0, trained_seconds(done))}
    progress = checkpoint_progress(Path(opts.out), opts.task)  # (a save within its first epoch is work done too)
    status = RUNNING if running else UNFINISHED if progress.epochs or progress.partial else NOT_RUN
    return {**record, "status": status, "epochs_done": progress.epochs}


# ------------------------------------------------------------------------------ the table
def results_path(out: Path, column: str) -> Path:
    return out / f"results-{column}.json"


def read_results(path: Path) -> dict:
    """A results file as written by :func:`write_table`; {} where there is none yet (or it is unreadable)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def read_cells(path: Path) -> dict:
    return read_results(path).get("cells", {})


def superseded(cell: dict) -> bool:
    """A finished cell of the model's older code (dws.tasks.options.MODEL_VERSIONS; cells recorded before
    versions were: 1): another function than the model computes now, so neither its metrics nor its lr
    stand for the model until its column runs again (which moves the run aside and trains it anew)."""
    return cell.get("status") == DONE and recorded_version(cell) != model_version(cell["model"])


def superseded_note(cell: dict) -> str:
    return (f"superseded: model version {recorded_version(cell)}, now {model_version(cell['model'])} "
            f"(rerun the column)")


def other_cells(saved: dict, store: Path, models) -> dict:
    """The cells of the results ``saved`` (:func:`read_results`) of models other than ``models``, where they
    are of the same zoo: a run of some models (``--models``) keeps the column's other cells as they are, in
    the file and the report, so that a later scale still finds their lrs."""
    if saved.get("store") != str(store):
        return {}
    return {m: cell for m, cell in saved.get("cells", {}).items() if m not in models}


# ------------------------------------------------------------------------------ cells recorded elsewhere
def shown_path(path: Path) -> str:
    """``path`` relative to this checkout where it lies inside it, as the docs name the recorded files."""
    try:
        return str(Path(path).resolve().relative_to(CHECKOUT))
    except ValueError:
        return str(path)


def read_recorded(path: Path) -> dict:
    """A file of recorded cells; {} where there is none. Unlike this machine's results, which the pipeline
    rewrites, an unreadable one is an error: it is committed data, and passing over it would retrain days of
    cells."""
    if not path.is_file():
        return {}
    try:
        saved = json.loads(path.read_text())
        if not isinstance(saved, dict) or not isinstance(saved.get("cells"), dict):
            raise ValueError("no cells")
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a file of recorded cells ({e}); restore it from git") from None
    return saved


def recorded_cells(recorded: Path | None, scale: str, column: str) -> dict:
    """The column's finished cells at ``scale`` recorded under ``recorded`` (None: none), each with ``recorded``,
    the file that holds it; cells of older model code (superseded) left out."""
    if recorded is None:
        return {}
    path = results_path(Path(recorded) / scale, column)
    return {m: {**cell, "recorded": shown_path(path)} for m, cell in read_recorded(path).get("cells", {}).items()
            if cell.get("status") == DONE and not superseded(cell)}


def finished_here(cell: dict | None) -> bool:
    """A cell of this machine's results that finished here (not one taken from the records)."""
    return cell is not None and cell.get("status") == DONE and not superseded(cell) and "recorded" not in cell


def known_cells(out: Path, column: str, recorded: dict) -> dict:
    """The column's cells at ``out``'s scale as this machine has them, with a recorded finished cell in place
    of any this machine has not finished."""
    here = read_cells(results_path(out, column))
    return {**here, **{m: cell for m, cell in recorded.items() if not finished_here(here.get(m))}}


# the flags of the options that change only a run's speed (SPEED_ONLY: --out, --compile, ...), each with whether
# it takes a value: a cell recorded without --compile stands for the cell that now compiles its step
SPEED_FLAGS = {**{option_flag(name): not isinstance(DEFAULTS[name], bool) for name in SPEED_ONLY if name in DEFAULTS},
               "--restart": False}
# and --precision, which a cell the protocol trains in bf16 takes from the machine (cell_precision): its bf16 and
# fp32 cells differ by less than its seeds do (docs/train.md, "Precision"), so either stands for the other
UNCOMPARED_FLAGS = {**SPEED_FLAGS, "--precision": True}


def comparable_command(zoo_train: str) -> list[str]:
    """A cell's ``zoo train`` command without where its zoo and its run directory lie (the zoo's name kept) and
    without the options that change only its speed or that the machine chooses (:data:`UNCOMPARED_FLAGS`)."""
    argv, kept = shlex.split(zoo_train), []
    words = iter(argv[3:])
    for word in words:
        if word in UNCOMPARED_FLAGS:
            if UNCOMPARED_FLAGS[word]:
                next(words, None)  # its value
        else:
            kept.append(word)
    return [Path(argv[2]).name, *kept]


def recorded_store(cell: dict) -> Path:
    """The zoo a recorded cell trained on, where it lay on its machine."""
    return Path(shlex.split(cell["zoo_train"])[2])


def standing_records(recorded: dict, protocol: Protocol, out: Path, models, lrs: dict, task: str,
                     log=print) -> dict:
    """The recorded cells that stand for cells of ``models`` here: each one's ``zoo train`` command is the
    one the cell would run now (at the recorded lr where a full cell takes its lr from elsewhere), so the
    protocol and zoo train's defaults are the same; a record that differs is said in a line and the cell
    trains here."""
    standing = {}
    for model in (m for m in models if m in recorded):
        cell = recorded[model]
        lr = lrs.get(model, cell["lr"] if protocol.lr_from is not None else None)
        have = comparable_command(cell["zoo_train"])
        want = comparable_command(train_command(cell_options(protocol, recorded_store(cell), out, model, lr, task)))
        if have == want:
            standing[model] = cell
        else:
            log(f"{model}: the cell recorded in {cell['recorded']} ran `{shlex.join(have[1:])}` on {have[0]}, "
                f"where this cell runs `{shlex.join(want[1:])}` on {want[0]}: training it here")
    return standing


def record_cells(out_root: Path, recorded: Path, log=print) -> int:
    """``--record``: every cell finished under ``out_root`` (each scale and column) into ``recorded``, the files
    to commit. A recorded cell stays (a finished cell is never replaced): where this machine's differs in its
    command, lr or metrics, a line says so; one of older model code is replaced. Returns the cells added."""
    added = 0
    for here in sorted(Path(out_root).glob("*/results-*.json")):
        scale, column = here.parent.name, here.stem.removeprefix("results-")
        finished = {m: cell for m, cell in read_cells(here).items() if finished_here(cell)}
        if column not in COLUMNS or scale not in COLUMNS[column].scales or not finished:
            continue  # (e.g. a folder of runs moved aside)
        path = results_path(Path(recorded) / scale, column)
        saved = read_recorded(path) or {"scale": scale, "column": column, "cells": {}}
        compared = ("lr", "zoo_train", *(m.key for m in COLUMNS[column].metrics))
        new = 0
        for model, cell in finished.items():
            old = saved["cells"].get(model)
            if old is not None and not superseded(old):
                if any(old.get(k) != cell.get(k) for k in compared):
                    log(f"{scale} {column} {model}: recorded already in {shown_path(path)} with other results; "
                        f"kept that one (remove it there to record this machine's)")
                continue
            saved["cells"][model] = cell
            new += 1
            log(f"{scale} {column} {model}: recorded in {shown_path(path)}")
        if new:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(saved, indent=2) + "\n")
            added += new
    return added


def carry_cells(out_root: Path, recorded: Path, log=print) -> int:
    """``--record``'s other half: every unfinished cell under ``out_root`` whose checkpoints are small enough
    (:mod:`pipelines.carried`) into ``recorded/SCALE/carried``, to commit, so that a new machine resumes it
    where this one stands; a cell finished since has its carried run removed (its record stands for it). A
    carried run further on than this machine's (one this machine could not take: another zoo) is kept, said
    in a line. Returns the cells carried."""
    carried = 0
    for here in sorted(Path(out_root).glob("*/results-*.json")):
        scale, column = here.parent.name, here.stem.removeprefix("results-")
        if column not in COLUMNS or scale not in COLUMNS[column].scales:
            continue
        for model, cell in read_cells(here).items():
            folder = carried_folder(recorded, scale, column, model)
            if finished_here(cell) or "recorded" in cell:
                if folder.exists():
                    shutil.rmtree(folder)
                    log(f"{scale} {column} {model}: finished; its carried run removed from {shown_path(folder)}")
                continue
            if cell.get("status") not in (RUNNING, UNFINISHED) or not checkpoint_files(Path(cell["run_dir"])):
                continue
            progress = checkpoint_progress(Path(cell["run_dir"]), COLUMNS[column].task)
            before = read_about(folder)
            if before is not None and \
                    (before.get("epochs_done", 0), before.get("partial", 0.0)) > (progress.epochs, progress.partial):
                log(f"{scale} {column} {model}: {shown_path(folder)} carries {before['epochs_done']} epochs, this "
                    f"machine's run {progress.epochs}: kept that one")
                continue
            about = {"model": model, "scale": scale, "column": column, "zoo_train": cell["zoo_train"],
                     "command": cell["command"], "model_version": model_version(model),
                     **store_identity(recorded_store(cell)), "epochs_done": progress.epochs,
                     "partial": progress.partial, "epochs_planned": cell["epochs_planned"],
                     "best_val": progress.best, "best_epoch": progress.best_epoch,
                     "seconds": progress.seconds, "carried_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            why_not = carry(Path(cell["run_dir"]), folder, about)
            if why_not is None:
                carried += 1
                log(f"{scale} {column} {model}: {progress.epochs} of {cell['epochs_planned']} epochs carried in "
                    f"{shown_path(folder)}")
                zoo = record_zoo(recorded_store(cell), recorded, scale, column)
                if zoo is not None:
                    log(f"{scale} {column} {model}: its zoo's checksums recorded in {shown_path(zoo)}")
            else:
                log(f"{scale} {column} {model}: not carried: {why_not}")
    return carried


def resume_carried(opts: TrainOptions, folder: Path, store: Path, log=print) -> None:
    """Before a cell trains: where its run directory holds no run and ``folder`` carries one from another
    machine that continues this cell's training (:func:`pipelines.carried.mismatch`), put it back, so zoo
    train resumes it; one that does not is said in a line and the cell trains from its start."""
    run_dir = Path(opts.out)
    if any((run_dir / CHECKPOINTS).glob("*")):  # a run of its own (or what is left of one): left as it is
        return
    about = read_about(folder)
    if about is None:
        return
    why = mismatch(about, comparable_command(about["zoo_train"]), comparable_command(train_command(opts)),
                   model_version(opts.model), store_identity(store))
    if why is not None:
        log(f"{opts.model}: the run carried in {shown_path(folder)} does not continue this cell ({why}): training "
            f"it from its start")
        return
    put_back(folder, about, run_dir, store)
    log(f"{opts.model}: resuming the run carried in {shown_path(folder)}: {about['epochs_done']} of "
        f"{about['epochs_planned']} epochs done on another machine ({about['carried_at']})")


def chosen_lrs(protocol: Protocol, out: Path, column: str, models, given: dict, stores: Path,
               cells: dict | None = None) -> dict:
    """``{model: (lr, where it was chosen)}``: given on the command line, else (``lr_from``) the finished
    cell of that scale (``cells``: that scale's, default this machine's); a model with neither is refused
    in one line that names the command to run."""
    if protocol.lr_from is None:
        return {m: (given[m], "--lr") if m in given else (None, "val") for m in models}
    cells = read_cells(results_path(out.parent / protocol.lr_from, column)) if cells is None else cells
    missing = [m for m in models if m not in given
               and (cells.get(m, {}).get("status") != DONE or superseded(cells[m]))]
    if missing:
        first = pipeline_command(protocol.lr_from, column, missing, out.parent, stores, {})
        named = ", ".join(f"{m} (its cell there is of model version {recorded_version(cells[m])}, now "
                          f"{model_version(m)})" if m in cells and superseded(cells[m]) else m for m in missing)
        raise ValueError(f"no learning rate chosen at {protocol.lr_from} scale for {named}: run "
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


def table_row(cell: dict, metrics=(ACCURACY,)) -> list[str]:
    lr = "—" if cell.get("lr") is None else f"{cell['lr']:g}"
    where = {"val": "val, this scale", "--lr": "--lr"}.get(cell["lr_from"], cell["lr_from"])
    status = shown_status(cell)
    shown = [m.show(cell[m.key]) if cell["status"] == DONE else status if i == 0 else "—"
             for i, m in enumerate(metrics)]
    params = f"{cell['params']:,}" if cell.get("params") else "—"
    return [f"`{cell['model']}`", params, f"{lr} ({where})", cell["normalize"] or "—", str(cell["batch_size"]),
            *shown, f"{cell['epochs_done']} / {cell['epochs_planned']}", fmt_seconds(cell.get("wall_seconds")),
            f"`{cell['zoo_train']}`"]


def write_table(out: Path, scale_name: str, column: str, store: Path, cells: dict, models) -> Path:
    """``results-COLUMN.json`` and ``report-COLUMN.md`` of the cells as they are now."""
    spec = COLUMNS[column]
    results_path(out, column).parent.mkdir(parents=True, exist_ok=True)
    inr = {"dataset": column} if column in INR_COLUMNS else {}  # (the INR columns' files, as before the others)
    results_path(out, column).write_text(json.dumps(
        {"scale": scale_name, **inr, "column": column, "store": str(store), "cells": cells}, indent=2))
    protocol = spec.scales[scale_name]
    per_model = (f", epochs {protocol.epochs}" if protocol.epochs else "") + \
        (f", batch size {protocol.batch_sizes}" if protocol.batch_sizes else "")
    notes = [f"store: {store}", f"training: --task {spec.task}, {protocol.train}{per_model}",
             f"lr: chosen on val {spec.selection} among {', '.join(f'{lr:g}' for lr in PAPER_LRS)}"
             if protocol.lr_from is None else f"lr: the one its {protocol.lr_from} cell chose on val (or --lr)",
             "epochs: over every training of the cell (one per candidate lr, then the other seeds); "
             "wall time: this pipeline's sessions on the cell, or zoo train's own time over its trainings "
             "(kept across interrupted sessions) where that is longer",
             "`--normalize` is zoo train's per-model default (orbit where the model claims a symmetry, else entry"
             + ("; none for adapt, whose models take raw networks)" if spec.task == "adapt" else ")")]
    rows = [table_row(cells[m], spec.metrics) for m in models if m in cells]
    if any(cells.get(m, {}).get("status") == REFUSED for m in models):
        notes.append("not run: zoo train refused the cell, for the reason given (a rerun tries again)")
    taken = [m for m in models if "recorded" in cells.get(m, {})]
    if taken:
        notes.append(f"finished on another machine ({', '.join(f'`{m}`' for m in taken)}): recorded in "
                     f"{', '.join(sorted({cells[m]['recorded'] for m in taken}))}, with the commands that made them")
    return write_report(out / f"report-{column}.md", f"Weight-space models, {spec.title}, scale {scale_name}",
                        ["model", "parameters", "lr (chosen on)", "normalize", "batch",
                         *(m.header for m in spec.metrics),
                         "epochs done / planned", "wall time", "command"], rows, notes)


def summary_cell(column: str, cell: dict | None, model: str, metric: Metric, marked: bool = True) -> str:
    """A cell of the summary: the metric of a finished run (``marked``: "(recorded)" after one finished
    elsewhere), else what became of it."""
    if model not in COLUMNS[column].models:
        return "— (invariant model)"
    if cell is None or cell["status"] == NOT_RUN:
        return NOT_RUN
    if superseded(cell):
        return superseded_note(cell)
    if cell["status"] == DONE:
        return metric.show(cell[metric.key]) + (" (recorded)" if marked and "recorded" in cell else "")
    if cell["status"] in (REFUSED, DIVERGED):
        return shown_status(cell)
    # the checkpoints now (the results file says how far the cell was when the pipeline last wrote it)
    now = checkpoint_progress(Path(cell["run_dir"]), COLUMNS[column].task) if cell.get("run_dir") else Progress(0, 0.0)
    done, planned = max(now.epochs, cell["epochs_done"]), cell["epochs_planned"]
    worked = now.epochs + now.partial
    pace = now.recent_epoch_seconds or (now.seconds / worked if worked and now.seconds > 0 else None)
    to_go = f", ~{fmt_seconds((planned - done - now.partial) * pace)} to go" if pace else ""
    best = "" if now.best is None else \
        f", best val {COLUMNS[column].metrics[0].show(now.best)} (epoch {now.best_epoch}, {now.best_training})"
    within = f" and {now.partial:.0%} of the next" if now.partial else ""
    return f"{cell['status']} {done}/{planned} epochs{within}{to_go}{best}"


def carried_cell(column: str, about: dict) -> str:
    """A summary cell this machine has no run of, where another machine's is carried (``about``)."""
    best = "" if about.get("best_val") is None else \
        f", best val {COLUMNS[column].metrics[0].show(about['best_val'])} (epoch {about['best_epoch']})"
    return (f"carried {about['epochs_done']}/{about['epochs_planned']} epochs{best}: another machine's run, resumed "
            f"when its column runs")


def column_header(column: str, metric: Metric, scale: str) -> str:
    """A summary column's header: the column, the metric and the scale shown."""
    return f"{COLUMNS[column].short}, {metric.header} ({scale})"


def summary_table(found: dict, scales: dict, recorded: Path | None, marked: bool = True):
    """The summary's header and rows: issue 32's models, then any other model a column has (``found``:
    column: its cells), each metric beside the published one where the issue names one; a cell not run shows
    the carried run of another machine where ``recorded`` holds one."""
    models = list(dict.fromkeys([*MODELS, *(m for cells in found.values() for m in cells)]))
    header, rows = ["model"], [[f"`{model}`"] for model in models]
    for c, m in ((c, m) for c in scales for m in COLUMNS[c].metrics):
        header.append(column_header(c, m, scales[c]))
        for row, model in zip(rows, models):
            shown_cell = summary_cell(c, found[c].get(model), model, m, marked)
            about = None if shown_cell != NOT_RUN or recorded is None else \
                read_about(carried_folder(recorded, scales[c], c, model))
            row.append(shown_cell if about is None else carried_cell(c, about))
        published = PUBLISHED.get((c, m.key))
        if published is not None:
            header.append(f"{COLUMNS[c].short}, {m.header}, published ({PUBLISHED_WHERE.get(c, 'its paper')})")
            for row, model in zip(rows, models):
                row.append(published.get(model, "—"))
    return header, rows


def protocol_note(where: str = "in its column's report") -> str:
    """The tables' note on what each cell is; ``where``: where its parameters and command are found."""
    return (f"each cell: one seed, the lr chosen on val (at ci; full takes ci's), the model's parameters and the "
            f"command that made it {where}; `python -m pipelines.weight_models --help` says each column's protocol")


def table_scales(scales: dict | None) -> dict:
    """Each column's scale in the tables: its table scale, unless ``scales`` (column: scale) says otherwise."""
    return {c: spec.table_scale for c, spec in COLUMNS.items()} | dict(scales or {})


def write_summary(out_root: Path, scales: dict | None = None, recorded: Path | None = None) -> Path:
    """``OUT/summary.md``: one table of every column's cells at its table scale (``scales``: column: scale,
    for the columns to show otherwise); a cell this machine has not finished shows the recorded one where
    there is one (``recorded``)."""
    scales = table_scales(scales)
    found = {c: known_cells(out_root / scale, c, recorded_cells(recorded, scale, c)) for c, scale in scales.items()}
    header, rows = summary_table(found, scales, recorded)
    notes = [f"{COLUMNS[c].title}: {results_path(out_root / scale, c).with_name(f'report-{c}.md')}"
             + ("" if found[c] else " (not run yet)") for c, scale in scales.items()]
    notes.append(protocol_note())
    elsewhere = sorted({cell["recorded"] for cells in found.values() for cell in cells.values() if "recorded" in cell})
    if elsewhere:
        notes.append(f"(recorded): finished on another machine; its numbers and commands in {', '.join(elsewhere)}")
    return write_report(out_root / "summary.md", "Weight-space models (issue 32): every column", header, rows, notes)


def read_earlier(recorded: Path) -> list[dict]:
    """``RECORDED/earlier.json``'s measurements ([] where there is none), each checked: its column, scale,
    model and metric are the table's, its value a number. Committed data, so a damaged file is an error in
    one line, not a table that silently lacks them."""
    path = Path(recorded) / EARLIER
    if not path.is_file():
        return []
    try:
        items = json.loads(path.read_text())["measurements"]
        if not isinstance(items, list):
            raise ValueError("'measurements' is not a list")
        for i, item in enumerate(items):
            missing = [k for k in EARLIER_KEYS if k not in item]
            if missing:
                raise ValueError(f"measurement {i} lacks {', '.join(missing)}")
            column = COLUMNS.get(item["column"])
            if column is None or item["scale"] not in column.scales:
                raise ValueError(f"measurement {i}: no column {item['column']!r} at scale {item['scale']!r}")
            if item["model"] not in column.models or item["metric"] not in {m.key for m in column.metrics}:
                raise ValueError(f"measurement {i}: {item['model']!r} / {item['metric']!r} is no cell of --column "
                                 f"{item['column']}")
            if not isinstance(item["value"], (int, float)) or isinstance(item["value"], bool):
                raise ValueError(f"measurement {i}: value {item['value']!r} is not a number")
            texts = [k for k in EARLIER_TEXTS if not isinstance(item.get(k, ""), str)]
            if texts:
                raise ValueError(f"measurement {i}: {', '.join(texts)} is not a text")
    except (OSError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: not a file of earlier measurements ({e}); restore it from git") from None
    return items


def column_metric(column: str, key: str) -> Metric:
    return next(m for m in COLUMNS[column].metrics if m.key == key)


def earlier_section(earlier: list[dict], scales: dict, header: list[str], rows: list[list[str]]) -> list[str]:
    """The recorded table's part for ``earlier`` (:func:`read_earlier`) at the table's scales: a table of its
    own, and in the main table a "not run" cell points to it (``rows`` changed in place)."""
    shown = [e for e in earlier if scales.get(e["column"]) == e["scale"]]
    if not shown:
        return []
    models, marks = [row[0] for row in rows], {}
    lines = ["## Measured before this table's protocol (not its cells)", "",
             "| column | model | `--normalize` (other options) | value | published | lr | epochs (best) | date | "
             "documented in | command |",
             "|" + "---|" * 10]
    for item in shown:
        metric = column_metric(item["column"], item["metric"])
        value = metric.show(item["value"])
        at = (models.index(f"`{item['model']}`"), header.index(column_header(item["column"], metric, item["scale"])))
        options = item.get("options", "")
        marks.setdefault(at, []).append(" ".join(filter(None, (value, item["normalize"], options))))
        published = PUBLISHED.get((item["column"], item["metric"]), {}).get(item["model"], "—")
        best = f" ({item['best_epoch']})" if item.get("best_epoch") else ""
        lines.append(f"| {COLUMNS[item['column']].short} ({item['scale']}) | `{item['model']}` | {item['normalize']}"
                     f"{f' `{options}`' if options else ''} | {value} | {published} | "
                     f"{item['lr']:g} ({item.get('lr_from', 'fixed')}) | "
                     f"{item.get('epochs', '?')}{best} | {item['date']} | {item['documented']} | `{item['command']}` |")
    for (r, c), values in marks.items():
        if rows[r][c] == NOT_RUN:  # a recorded or carried cell shows itself
            rows[r][c] = f"{NOT_RUN} (earlier protocol: {' / '.join(values)})"
    lines += ["", f"- from [{EARLIER}]({EARLIER}), transcribed from the docs it names: one seed each, at a fixed lr "
                  "or one an earlier ci search chose (not the table's ci cell), some with other options, and their "
                  "run directories were lost with their machines, so they stand beside the table, not in it; the "
                  "queue trains those cells under the table's protocol", ""]
    return lines


def write_recorded_table(recorded: Path, scales: dict | None = None) -> Path:
    """``RECORDED/table.md``, the table the README links: the summary of the recorded cells alone (and the
    carried ones), whatever machine writes it, with the command of every cell (``scales`` as
    :func:`write_summary`'s). ``--record`` rewrites it, so that it is current wherever the records are
    committed."""
    recorded = Path(recorded)
    scales = table_scales(scales)
    found = {c: recorded_cells(recorded, scale, c) for c, scale in scales.items()}
    header, rows = summary_table(found, scales, recorded, marked=False)
    earlier = earlier_section(read_earlier(recorded), scales, header, rows)

    def link(scale: str, column: str) -> str:
        name = results_path(Path(scale), column).as_posix()
        return f"[{name}]({name})"

    cells = {c: [m for m in MODELS if m in COLUMNS[c].models] for c in scales}  # the table's rows it applies to
    counts = {c: (sum(m in found[c] for m in cells[c]), len(cells[c])) for c in scales}
    notes = [f"recorded: {sum(n for n, _ in counts.values())} of {sum(t for _, t in counts.values())} cells ("
             + ", ".join(f"{COLUMNS[c].short} ({scale}) {counts[c][0]} of {counts[c][1]}" for c, scale in scales.items())
             + ")"]
    notes += [f"{COLUMNS[c].title} ({scale}): " + (link(scale, c) if found[c] else "nothing recorded yet")
              for c, scale in scales.items()]
    notes += [protocol_note("below and in its column's file"),
              "not run: no finished cell recorded yet (the queue, `pipelines/weight_models_queue.sh`, fills them); "
              "carried: an unfinished cell's checkpoints, committed, which the next machine resumes",
              *(["not run (earlier protocol: ...): no cell recorded yet, and a number measured before the table's "
                 "protocol, in the section below"] if earlier else []),
              "written by `python -m pipelines.weight_models --record`; do not edit it by hand"]
    for c, scale in scales.items():
        for model, cell in found[c].items():
            params = f", {cell['params']:,} parameters" if cell.get("params") else ""
            if cell.get("wall_seconds"):  # the cell's own training, its lr search included (a 2-core CPU's)
                params += f", {fmt_seconds(cell['wall_seconds'])} of training"
            rebuilt = " (rebuilt from the docs' numbers: its file's `reconstructed` says what is exact)" \
                if "reconstructed" in cell else ""
            notes.append(f"{COLUMNS[c].short} ({scale}), `{model}`: lr {cell['lr']:g} (chosen on {cell['lr_from']})"
                         f"{params}: `{cell['zoo_train']}`{rebuilt}")
    return write_report(recorded / TABLE, "Weight-space models (issue 32): the recorded table", header, rows, notes,
                        earlier)


def saved_precision(run_dir: Path) -> str | None:
    """The precision of the run ``run_dir`` holds, finished or not (runs saved before ``--precision`` existed:
    fp32), or None where it holds none (or one whose files zoo train will refuse in its own clear words)."""
    try:
        config = json.loads((run_dir / "config.json").read_text())
        if (run_dir / "metrics.json").is_file():
            return config["options"].get("precision", "fp32")
    except (OSError, ValueError, KeyError, AttributeError):
        pass
    try:
        saved = RunCheckpoints(run_dir, {}).saved_settings()
    except CheckpointError:
        return None
    return None if saved is None else saved.get(option_flag("precision"), "fp32")


def cell_precision(opts: TrainOptions) -> tuple[TrainOptions, str | None]:
    """A cell the protocol trains in bf16 (``opts``) as it trains on this machine, and why it trains in fp32
    instead (None where it does not): in the precision of the run its directory holds, finished (reused) or not
    (resumed); else in bf16 where this machine has it natively or on a GPU; else in fp32, the faster one here,
    since bf16's steps run 8-12x slower on a CPU that emulates it (:func:`dws.tasks.trainer.slow_precision`:
    days more of a full cell, which would otherwise wait for another machine). A cell the protocol compiles
    compiles in fp32 too: ng-gnn's compiled fp32 step is 1.20x its eager one on an AVX2 CPU, ng-transformer's
    0.99x (docs/train.md, "Precision")."""
    if opts.precision != "bf16":
        return opts, None
    saved = saved_precision(Path(opts.out))
    why = slow_precision(opts.precision, resolve_device(opts.device)) if saved is None else None
    return replace(opts, precision=saved or ("fp32" if why else "bf16")), why


def run(scale_name: str, out: Path, workers: int, models=None, data_root=None, log=print, column: str = "mnist",
        stores: Path | None = None, lrs: dict | None = None, store: Path | None = None,
        recorded: Path | None = None) -> Path:
    """Fill the column's table at the scale under ``out`` (``OUT/SCALE``), cell by cell; ``stores``: the
    folder whose ``SCALE/stores`` hold the zoos (default: ``out``'s parent, i.e. ``--out``); ``store``: an
    existing zoo instead (checked to be the one the column's pipeline makes at the scale); ``recorded``:
    the cells finished elsewhere (:func:`record_cells`; the command line's default: :data:`RECORDED`)."""
    spec, out = COLUMNS[column], Path(out)
    protocol = column_protocol(column, scale_name)
    stores = Path(stores) if stores is not None else out.parent
    named, models, lrs = models is not None, column_models(column, models, log), dict(lrs or {})
    source = known_cells(out.parent / protocol.lr_from, column, recorded_cells(recorded, protocol.lr_from, column)) \
        if protocol.lr_from else {}
    if not named:  # by default, no cell for a model whose lr search zoo train refused
        refused = [m for m in models if m not in lrs and source.get(m, {}).get("status") == REFUSED]
        for model in refused:
            log(f"{model}: no cell (zoo train refused its {protocol.lr_from} cell: {source[model]['refused']})")
        models = tuple(m for m in models if m not in refused)
    saved = read_results(results_path(out, column))
    previous = saved.get("cells", {})
    standing = standing_records(recorded_cells(recorded, scale_name, column), protocol, out,
                                [m for m in models if not finished_here(previous.get(m))], lrs, spec.task, log)
    # refused before any zoo is made
    chosen = chosen_lrs(protocol, out, column, [m for m in models if m not in standing], lrs, stores, source) \
        | {m: (cell["lr"], cell["lr_from"]) for m, cell in standing.items()}
    if protocol.lr_from is not None:
        models = tuple(cost_order(models, source))
    given = store
    if given is not None:
        store = existing_store(given, column, protocol)
    elif models and all(m in standing for m in models):  # nothing to train: no zoo made for it
        store = Path(saved.get("store") or recorded_store(standing[models[0]]))
    else:
        store = spec.make_store(protocol.store, stores / protocol.store, workers, data_root, log)
    kept = other_cells(saved, store, models)
    planned = {m: cell_options(protocol, store, out, m, chosen[m][0], spec.task) for m in models}
    options = {m: cell_precision(opts)[0] for m, opts in planned.items()}
    commands = {m: pipeline_command(scale_name, column, [m], out.parent, stores, {m: lrs[m]} if m in lrs else {},
                                    given) for m in models}

    def record(model: str, wall_seconds=None, running=False) -> dict:
        return cell_record(options[model], chosen[model][1], commands[model], wall_seconds,
                           source.get(model, {}).get("params"), running, column)

    cells = {m: record(m, previous.get(m, {}).get("wall_seconds")) for m in models}
    for model, cell in standing.items():
        if cells[model]["status"] != DONE:
            if cells[model]["status"] != NOT_RUN:
                log(f"{model}: {options[model].out} holds an unfinished run of a cell finished elsewhere "
                    f"({cell['recorded']}): left as it is")
            cells[model] = cell

    def table() -> Path:
        return write_table(out, scale_name, column, store, {**cells, **kept}, [*models, *kept])

    table()
    for model in models:
        opts = options[model]
        if cells[model]["status"] == DONE:
            log(f"{model}: finished on another machine, recorded in {cells[model]['recorded']}: not retrained"
                if "recorded" in cells[model] else f"{model}: reusing the finished run in {opts.out}")
            continue
        refuse_other_finished(opts, log)
        move_aside_diverged(opts, log)
        if recorded is not None:
            resume_carried(opts, carried_folder(recorded, scale_name, column, model), store, log)
        opts, fp32_why = cell_precision(planned[model])  # (a carried run put back keeps its own)
        options[model] = opts
        if fp32_why is not None:
            log(f"{model}: training in fp32 on this machine, not in the protocol's bf16: {fp32_why}; a cell recorded "
                f"in either stands for the other")
        before = cells[model]["wall_seconds"] or 0.0
        cells[model] = record(model, before, running=True)
        table()
        start, refusal, divergence = time.perf_counter(), None, None
        try:
            train_run(opts, log=log)
        except ValueError as e:  # this cell cannot train as the protocol asks; the others still can
            refusal = str(e).splitlines()[0]
            log(f"{model}: {NOT_RUN}: {refusal}")
        except FloatingPointError as e:  # its given lr diverged (zoo train's Diverged); the others still train
            divergence = str(e).splitlines()[0]
            log(f"{model}: {DIVERGED} at lr {opts.lr:g}: {divergence}")
        finally:  # an interrupted cell keeps its epochs (zoo train's checkpoints) and its time so far
            cells[model] = record(model, before + time.perf_counter() - start)
            if refusal is not None:
                cells[model] |= {"status": REFUSED, "refused": refusal}
            if divergence is not None:
                cells[model] |= {"status": DIVERGED, "diverged": divergence}
            table()
    return table()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", choices=tuple(SCALE_HELP), default="ci",
                   help="; ".join(f"{s}: {text}" for s, text in SCALE_HELP.items()) + " (default: ci; sine and "
                        "adapt have smoke and ci only)")
    p.add_argument("--column", choices=tuple(COLUMNS), default=None,
                   help="the table's column: " + ", ".join(f"{k}: {v.title}" for k, v in COLUMNS.items())
                        + " (default: --dataset's, else mnist)")
    p.add_argument("--dataset", choices=INR_COLUMNS, default=None,
                   help="the INR columns' name, as before --column: "
                        + ", ".join(f"{k}: {v}" for k, v in DATASETS.items()))
    p.add_argument("--models", default=None, help=f"comma-separated (default: {','.join(MODELS)}, those the column "
                                                  f"applies to)")
    p.add_argument("--lr", action="append", metavar="MODEL=LR",
                   help="a model's learning rate instead of the one chosen on val (repeat, or comma-separate)")
    p.add_argument("--out", default="results/weight-models", help="folder for runs and tables (default: "
                                                                   "results/weight-models)")
    p.add_argument("--stores", default=None, help="the --out of the pipeline that makes the column's zoos, where "
                                                  "the table finds them (made there if missing; default: "
                                                  + ", ".join(f"{k}: {v.stores}" for k, v in COLUMNS.items()) + ")")
    p.add_argument("--store", default=None, help="an existing zoo to train on instead (e.g. the full "
                                                 "fmnist-classifiers zoo), checked to be the one the column's "
                                                 "pipeline makes at the scale")
    table_scales = ", ".join(f"{k}: {v.table_scale}" for k, v in COLUMNS.items())
    p.add_argument("--summary", action="store_true",
                   help=f"write OUT/summary.md, every column's cells at the table's scale ({table_scales}); "
                        "trains nothing")
    p.add_argument("--record", action="store_true",
                   help="copy every cell finished under --out (each scale and column) into --recorded, carry the "
                        f"unfinished ones small enough, and write the table of the recorded cells, {TABLE}, there: "
                        "the files to commit; trains nothing")
    p.add_argument("--recorded", default=shown_path(RECORDED),
                   help="cells finished on other machines, which a machine without their run directories takes "
                        "instead of retraining them (default: %(default)s; none: ignore them)")
    p.add_argument("--data-root", default=None, help="data folder for a zoo not made yet (default: ../shared/data)")
    p.add_argument("--workers", type=int, default=2, help="zoo generate workers for a zoo not made yet (default: 2)")
    return p.parse_args(argv)


def column_of(args: argparse.Namespace) -> str:
    if args.column and args.dataset and args.column != args.dataset:
        raise ValueError(f"--column {args.column} and --dataset {args.dataset} name different columns; give one")
    return args.column or args.dataset or "mnist"


def main(argv=None):
    args = parse_args(argv)
    recorded = None if args.recorded == "none" else RECORDED if args.recorded == shown_path(RECORDED) \
        else Path(args.recorded)
    try:
        if args.record:
            if recorded is None:
                raise ValueError("--record needs a --recorded folder to write to")
            added, carried = record_cells(Path(args.out), recorded), carry_cells(Path(args.out), recorded)
            table = write_recorded_table(recorded)
            print(f"{added} cell(s) recorded, {carried} unfinished cell(s) carried in {shown_path(recorded)}; "
                  f"the table: {shown_path(table)}" + (": commit them" if added or carried else ""))
            return
        if args.summary:
            print(write_summary(Path(args.out), recorded=recorded).read_text())
            return
        column = column_of(args)
        models, lrs = parse_models(args.models) if args.models else None, parse_lrs(args.lr)
        report = run(args.scale, Path(args.out) / args.scale, args.workers, models, args.data_root, column=column,
                     stores=Path(args.stores or COLUMNS[column].stores), lrs=lrs, store=args.store,
                     recorded=recorded)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"error: {e}") from None
    print(report.read_text())


if __name__ == "__main__":
    main()
