"""Everything a run needs before its first step, checked before anything is written.

:func:`prepare_run` opens the store, checks it against the task and the options (the targets on
every split used, full batches where the task needs them), builds the model once (so that options
it cannot be built with are refused here) and asks it for the store it trains on (the
``prepare_store`` hook of :mod:`dws.tasks.models`). Nothing is written before that hook, and the
run directory itself is created when something is first written into it. An unfinished run in the
run directory (its ``checkpoints/``) is resumed only with the same settings (:func:`resume_settings`);
with others it is refused here, before the hook could re-derive the store it trains on.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
from torch import nn

from dws.stream import Normalizer, WeightStoreLoader, describe_excluded, excluded, inr_augmentation, usable_mask
from dws.stream.orbit import normalization_statistics
from dws.stream.memory import MemoryPlan, activation_bytes, model_bytes, plan_memory
from dws.stream.rows import LIMIT_SELECTION, selected_mask, strata, view_mask
from dws.stream.augment import Compose, GaussianNoise, WeightDropout
from zoo.devices import resolve_device
from zoo.options import DEFAULT_MAX_MEMORY, MIN_SELECTION_NETWORKS, MIN_SELECTION_RUNS, format_size, plural
from zoo.store import StoreError, WeightStore
from zoo.store.manifest import imported_from

from .checkpoint import RESTART, CheckpointError, RunCheckpoints
from .models import build_model, training_store, weight_spread
from .objectives import Task, get_task
from .options import (ACTIVATION_PEAK, CLAIMED_SYMMETRY, TrainOptions, default_run_dir, model_version,
                      with_task_defaults)
from .trainer import least_batch, slow_precision


class FirstBatches:
    """The first ``count`` batches of each pass over ``loader`` (a fresh shuffle every pass)."""

    def __init__(self, loader, count: int):
        self.loader, self.count = loader, count

    def __iter__(self):
        return itertools.islice(iter(self.loader), self.count)

    def state_dict(self) -> dict:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(state)


def default_augmentation(store: WeightStore):
    """The appendix's augmentations: geometric ones for 2-D INRs, plus weight noise and dropout."""
    noise = Compose(GaussianNoise(0.01, relative=True), WeightDropout(0.05))
    if store.widths[0] == 2 and store.manifest["architecture"].get("activation") == "sine":
        return Compose(inr_augmentation(degrees=15.0, shift=0.05, scale=(0.95, 1.05)), noise)
    return noise


@dataclass
class PreparedRun:
    """A checked run: what it trains on, how its models are built, where it writes."""

    opts: TrainOptions
    store: WeightStore  # the store named on the command line
    task: Task
    run_dir: Path
    num_classes: int | None
    out_features: int
    model_kwargs: dict
    data_store: WeightStore  # the store the model trains on (``store``, or what its hook derived)
    device: str
    augment: Callable | None = None  # the training augmentation (None: --no-augment)
    checkpoints: RunCheckpoints | None = None  # where each training's state is saved, to resume
    # {name: (mean, std)} the loaders normalize with (--normalize; best.pt keeps them); None: raw networks
    statistics: dict | None = None
    memory: MemoryPlan | None = None  # which splits are held and the shuffle window (--max-memory); None: each loader's default

    def build_model(self, log=print) -> tuple[nn.Module, dict]:
        """A freshly initialized model (seed the global RNG first), ready for ``data_store``'s networks."""
        model, desc = build_model(self.opts.model, self.store.widths, self.out_features, **self.model_kwargs,
                                  backend=self.opts.backend)
        training_store(model, self.store, self.run_dir, log)
        return model, desc

    def loaders(self, seed: int) -> dict:
        """``train``, ``val``, ``test`` (and ``probe`` / ``calibrate`` where used) for one seed."""
        opts, task = self.opts, self.task
        common = dict(batch_size=opts.batch_size, target=task.target, seed=seed, num_workers=opts.loader_workers,
                      normalize=False if self.statistics is None else Normalizer.from_stats(self.statistics))
        served = {name: {} if self.memory is None else self.memory.splits[name].loader_options()
                  for name in ("train", "val", "test")}
        train = WeightStoreLoader(self.data_store, "train", shuffle=True, augment=self.augment,
                                  drop_last=task.full_batches, limit=opts.train_limit, views=opts.train_views,
                                  **served["train"], **common)
        evaluated = None if opts.train_views is None else 1  # --train-views: the same val/test networks for every K
        out = {
            "train": train,
            "val": WeightStoreLoader(self.data_store, "val", shuffle=False, views=evaluated, **served["val"], **common),
            "test": WeightStoreLoader(self.data_store, "test", shuffle=False, views=evaluated, **served["test"],
                                      **common),
        }
        # the train split un-augmented (as evaluated), sharing the training loader's arrays in memory
        if task.probe:
            out["probe"] = train.variant(shuffle=False)
        if opts.precise_bn > 0 and opts.bn:
            # a fresh random subset of the (limited) train split per pass
            out["calibrate"] = FirstBatches(train.variant(shuffle=True), math.ceil(opts.precise_bn / opts.batch_size))
        return out


def split_ranges(store: WeightStore) -> dict[str, tuple[int, int]]:
    """The splits' networks: ``{split: (start, stop)}`` (``--train-limit`` keeps a subset of the train
    range's networks: :func:`train_subset`)."""
    ranges = {}
    for split in ("train", "val", "test"):
        start, stop = store.split_range(split)
        if stop <= start:
            raise StoreError(f"{store.root}: split {split!r} is empty; a run needs networks to train, select and test on")
        ranges[split] = (start, stop)
    return ranges


def train_subset(store: WeightStore, opts: TrainOptions, ranges: dict[str, tuple[int, int]]):
    """``--train-limit``'s networks as a mask over the train range (the training loader's, which
    :func:`dws.stream.rows.selected_mask` chooses), and their number; (None, the range's size) without
    a limit, as counted before limits existed (which keeps an unlimited run's memory plan)."""
    start, stop = ranges["train"]
    if opts.train_limit is None:
        return None, stop - start
    keep = selected_mask(store, start, stop, views=opts.train_views, limit=opts.train_limit)
    return keep, stop - start if keep is None else int(keep.sum())


def check_store(store: WeightStore, task: Task, opts: TrainOptions, ranges: dict[str, tuple[int, int]],
                train_networks: int) -> None:
    """Refuse a store the task cannot train on, with what the store has instead (ValueError/StoreError);
    ``ranges``: :func:`split_ranges`; ``train_networks``: the networks trained on (:func:`train_subset`)."""
    for split, (start, stop) in ranges.items():
        if not usable_mask(store, start, stop).any():
            raise StoreError(f"{store.root}: no network of split {split!r} trained normally (status: "
                             f"{dict(excluded(store, start, stop))}); a run needs networks to train, select and test on")
    task.check_store(store, ranges)
    if opts.train_views is not None:  # refuses a store without views, or with fewer than asked for
        view_mask(store, *ranges["train"], opts.train_views)
    if task.full_batches and train_networks < opts.batch_size:
        raise ValueError(f"--task {task.name} trains on full batches of --batch-size {opts.batch_size}, and the "
                         f"train split has {train_networks} networks{' (--train-limit)' if opts.train_limit else ''}: "
                         f"lower --batch-size")


# options that change how fast a run goes, not what it computes (beyond float rounding): a resumed
# run may change them; every other option (also one added later) must match the unfinished run
SPEED_ONLY = ("out", "progress", "loader_workers", "compile", "device", "backend", "address", "resume",
              "checkpoint_minutes")


# options added after runs were first checkpointed (2026-11-27, --precision 2026-11-28), and the value that
# reproduces a run saved before they existed: per-entry normalization, as every run normalized then (adapt:
# none, its models take raw networks); the default budget (before it, each split was held whole up to 2 GiB,
# which the default budget also holds whole unless the model's share leaves less room); float32 steps
LEGACY_SETTINGS = {"normalize": lambda opts: None if opts.normalize is None else "entry",
                   "max_memory": lambda opts: DEFAULT_MAX_MEMORY,
                   "precision": lambda opts: "fp32", "weight_decay": lambda opts: 5e-4, "warmup_steps": lambda opts: 0,
                   "clip_grad": lambda opts: None, "amsgrad": lambda opts: False}


def option_flag(name: str) -> str:
    """``max_memory`` -> ``--max-memory``."""
    return f"--{name.replace('_', '-')}"


# recorded beside --train-limit (dws.stream.rows.LIMIT_SELECTION): what the limit selected. A run
# saved before it existed took the train split's first N networks, and is not resumed as this one
LIMIT_SETTING = "--train-limit selects"


# the model's code version (dws.tasks.options.MODEL_VERSIONS), recorded from version 2 on
VERSION_SETTING = "--model version"


def resume_settings(opts: TrainOptions, store: WeightStore) -> dict:
    """What an unfinished run and its rerun must agree on: the options by flag, and which store (and
    with ``--train-limit``, which networks it selects: :data:`LIMIT_SETTING`; from version 2 on, the
    model's code version: :data:`VERSION_SETTING`)."""
    settings = {option_flag(name): value for name, value in asdict(opts).items()
                if name not in SPEED_ONLY and name != "store"}
    if opts.train_limit is not None:
        settings[LIMIT_SETTING] = LIMIT_SELECTION
    if model_version(opts.model) > 1:  # absent at version 1, as in every run saved before versions existed
        settings[VERSION_SETTING] = model_version(opts.model)
    return {"STORE": str(store.root.resolve()), "STORE created": store.manifest.get("created"), **settings}


def refuse_prefix_limit(saved: dict | None, run_dir: Path) -> None:
    """Refuse (CheckpointError, one line) to resume an unfinished run begun when ``--train-limit N``
    kept the train split's first N networks: the networks it trained on are not the ones it would
    resume on. Runs without a limit resume as before."""
    if saved is None or saved.get("--train-limit") is None or LIMIT_SETTING in saved:
        return
    raise CheckpointError(f"{run_dir} holds an unfinished run begun when --train-limit {saved['--train-limit']} "
                          f"meant the train split's first {saved['--train-limit']} networks; it now means as many "
                          f"spread over the split (a fixed random subset), so it cannot be resumed: rerun with "
                          f"{RESTART} to start it over, or use another --out")


def with_legacy_settings(opts: TrainOptions, saved: dict | None, log) -> tuple[TrainOptions, dict]:
    """``opts`` for resuming an unfinished run whose ``saved`` settings lack options added since
    (:data:`LEGACY_SETTINGS`): those take the values it was trained with, said in one line; and those
    values by flag (empty: nothing filled in)."""
    missing = {name: value(opts) for name, value in LEGACY_SETTINGS.items()
               if saved is not None and option_flag(name) not in saved}
    if not missing:
        return opts, {}
    values = ", ".join(f"{option_flag(name)} {format_size(value) if name == 'max_memory' else value}"
                       for name, value in missing.items())
    log(f"note: the unfinished run was saved before {' and '.join(map(option_flag, missing))} existed; it resumes "
        f"with {values}, which reproduce how it began ({RESTART} starts over with the options given)")
    return replace(opts, **missing), {option_flag(name): value for name, value in missing.items()}


def warn_small_val(store: WeightStore, opts: TrainOptions, log) -> None:
    """One line when the val split is too small for what is chosen on it: fewer than
    MIN_SELECTION_NETWORKS networks, or (classifier zoos, whose checkpoints are alike within a run)
    fewer than MIN_SELECTION_RUNS runs."""
    start, stop = store.split_range("val")
    per_run = (store.manifest.get("runs") or {}).get("checkpoints_per_run")
    runs = (stop - start) // per_run if per_run else None
    if stop - start >= MIN_SELECTION_NETWORKS and (runs is None or runs >= MIN_SELECTION_RUNS):
        return
    chosen = "the learning rate and the best epoch are" if opts.lr is None else "the best epoch is"
    of_runs = "" if runs is None else f" of {plural(runs, 'run')}"
    enough = (f"{MIN_SELECTION_NETWORKS} or more" if runs is None else
              f"{MIN_SELECTION_RUNS} or more runs and {MIN_SELECTION_NETWORKS} or more networks")
    log(f"warning: {chosen} chosen on {plural(stop - start, 'val network')}{of_runs}; {enough} give a choice worth "
        f"making ({_larger_val_hint(store)})")


#: where an imported zoo's splits come from, by layout (``generation.import.layout``)
IMPORTED_SPLITS = {"dwsnets": "the DWSNets splits JSON's val list",
                   "nfn-siren": "zoo import nfn-siren --split-points VAL,TEST",
                   "state-dicts": "the CSV's split column"}


def _larger_val_hint(store: WeightStore) -> str:
    """How to give ``store`` a larger val split: its import's split source, or zoo generate's --limit."""
    layout = (imported_from(store.manifest) or {}).get("layout")
    return IMPORTED_SPLITS.get(layout, "zoo generate --limit train=N,val=N,test=N")


def log_excluded(store: WeightStore, ranges: dict[str, tuple[int, int]], log=print) -> None:
    """Say how many networks of each split the loaders leave out (a status other than ``ok``) and why."""
    for split, (start, stop) in ranges.items():
        counts = excluded(store, start, stop)
        if counts:
            log(f"note: {describe_excluded(counts, stop - start, split)}; they are neither trained on nor evaluated")


def log_train_subset(store: WeightStore, opts: TrainOptions, train: tuple[int, int], subset, log=print) -> None:
    """Say which networks ``--train-limit`` trains on (``subset``: :func:`train_subset`'s mask)."""
    start, stop = train
    chosen = np.arange(stop - start) if subset is None else np.flatnonzero(subset)
    how = "stratified by label" if strata(store, start, stop, chosen) is not None else "no labels to stratify by"
    log(f"note: --train-limit {opts.train_limit}: training on {len(chosen):,} of the {stop - start:,} train "
        f"networks, a fixed random subset spread over the split ({how}), the same for every seed")


def prepare_run(opts: TrainOptions, log=print) -> PreparedRun:
    """Check ``opts`` against the store and set the run up (see the module docstring)."""
    opts = with_task_defaults(opts)
    store = WeightStore(opts.store)
    task = get_task(opts.task, opts.target)
    ranges = split_ranges(store)  # refuses an empty split
    subset, train_networks = train_subset(store, opts, ranges)
    check_store(store, task, opts, ranges, train_networks)
    warn_small_val(store, opts, log)
    log_excluded(store, ranges, log)
    if opts.train_limit is not None:
        log_train_subset(store, opts, ranges["train"], subset, log)
    task = task.bind(store, opts.data_root, opts.image_batch)
    run_dir = Path(opts.out) if opts.out else default_run_dir(opts)
    saved = RunCheckpoints(run_dir, {}, opts.resume).saved_settings()
    refuse_prefix_limit(saved, run_dir)
    opts, legacy = with_legacy_settings(opts, saved, log)
    checkpoints = RunCheckpoints(run_dir, resume_settings(opts, store), opts.resume)
    checkpoints.check(saved_before=legacy)
    num_classes, out_features = task.num_classes(store), task.output_size(store)
    model_kwargs = dict(hidden_channels=opts.hidden_channels, num_layers=opts.num_layers, dropout=opts.dropout,
                        bn=opts.bn, blocks=opts.blocks, pool=opts.pool, input_reduction=opts.input_reduction,
                        activation=store.manifest["architecture"].get("activation"))  # ScaleGMN's symmetry follows it
    # the train split's per-entry statistics, read once: the NFNs' Fourier scale and the normalization (below)
    stats = None if task.outputs_weights else store.stats()
    if task.outputs_weights:
        model_kwargs["equivariant"] = True
    else:  # the loaders standardize (below): what they divide a typical weight by (the NFNs' Fourier scale)
        model_kwargs["weight_std"] = weight_spread(stats)
    scale = task.target_scale(store, *ranges["train"], subset) if opts.standardize_target else None
    if scale is not None:
        model_kwargs["target_scale"] = scale
    # refuses what cannot be built (plain: no kernel build for a check)
    model, _ = build_model(opts.model, store.widths, out_features, **model_kwargs, backend="plain")
    least, why = least_batch(model, task)
    if opts.batch_size // opts.workers < least:
        workers = f" on {opts.workers} workers" if opts.workers > 1 else ""
        raise ValueError(f"--batch-size {opts.batch_size}{workers}: --model {opts.model} --task {task.name} {why}, so "
                         f"no batch would train; use --batch-size {least * opts.workers} or more")
    device = resolve_device(opts.device)
    slow = slow_precision(opts.precision, device)
    if slow:
        log(f"warning: {slow}; train in fp32 here, or in bf16 on a GPU or a CPU that has it")
    # a data-parallel worker runs its model on its rows of each batch; SSL runs two views per step
    shard_rows = -(-opts.batch_size // opts.workers)

    def step_activations() -> int:
        return activation_bytes(model, store.widths, shard_rows, ACTIVATION_PEAK[opts.model][0],
                                forwards=2 if task.name == "ssl" else 1)

    # a model with a store hook may need what it prepares to run forward (mlp-align): probed after it
    hooked = hasattr(model, "prepare_store")

    def plan(reading: WeightStore, activations: int) -> MemoryPlan:  # refuses a budget below one chunk and one batch
        networks = {split: train_networks if split == "train" else stop - start
                    for split, (start, stop) in ranges.items()}
        return plan_memory(opts.max_memory, reading, networks,
                           shuffled="train", batch_size=opts.batch_size, model_bytes=model_bytes(model),
                           training=True, workers=opts.loader_workers, activations=activations,
                           activations_on_host=device == "cpu", sharers=opts.workers)

    memory = plan(store, 0 if hooked else step_activations())
    if (run_dir / "metrics.json").exists() and not checkpoints.unfinished():
        log(f"note: {run_dir} holds an earlier run; this one replaces it when it finishes")
    data_store = training_store(model, store, run_dir, log)
    if hooked or data_store is not store:  # (its chunks may differ)
        memory = plan(data_store, step_activations())
    if not all(split.in_memory for split in memory.splits.values()) or opts.workers > 1:
        log(memory.describe())
    if "--max-memory" in legacy and not memory.splits["train"].in_memory:
        log("warning: the train split now streams in shuffle windows; the epochs after the resume see another "
            "order of networks than the run began with")
    augment = default_augmentation(store) if opts.augment and not task.outputs_weights else None
    # a residual-weight model (adapt) takes raw networks
    statistics = None if task.outputs_weights else normalization_statistics(
        stats if data_store is store else data_store.stats(), opts.normalize, CLAIMED_SYMMETRY.get(opts.model))
    return PreparedRun(opts, store, task, run_dir, num_classes, out_features, model_kwargs, data_store,
                       device, augment, checkpoints, statistics, memory)
