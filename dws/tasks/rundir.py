"""The run directory: written when ``zoo train`` finishes, read by ``zoo eval`` and the pipelines.

* ``config.json``: everything needed to rebuild the model (options, task, sizes, the architecture
  of the networks it was trained on, the store and the store it trained on);
* ``metrics.json``: learning-rate search, per-seed validation/test metrics, mean ± std,
  per-epoch history, best epochs (counted from 0), seconds;
* ``best.pt``: the best checkpoint with the normalization statistics it was trained with;
* ``curve.png``: training loss and validation metric per epoch;
* for a task with one predicted number per network (``regress`` with one target):
  ``test_predictions.csv`` (seed run, store row, target, prediction on the test split, every seed
  run) and ``predictions.png`` (predicted against actual, the checkpoint in ``best.pt``).

A model's ``prepare_store`` hook may add its own folder (``mlp-align``: ``aligned-store/``). While
a run is unfinished, ``checkpoints/`` holds its trainings' states (:mod:`dws.tasks.checkpoint`);
it is removed once the run is written.
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from dws.stream import Normalizer, WeightStoreLoader
from dws.stream.memory import activation_bytes, model_bytes, plan_memory
from dws.stream.rows import LIMIT_SELECTION, selected_mask
from dws.weightspace import WeightSpace
from zoo.options import DEFAULT_MAX_MEMORY
from zoo.store import StoreError, WeightStore

from .models import build_model, evaluation_transform, rebuilds_exactly
from .objectives import Task, get_task
from .options import (ACTIVATION_PEAK, TrainOptions, default_run_dir, model_version, recorded_version,
                      with_task_defaults)
from .prepare import LEGACY_SETTINGS, SPEED_ONLY, PreparedRun, resume_settings
from .protocol import format_report
from .trainer import Predictions, TrainResult, evaluate

ARCH_KEYS = ("widths", "activation", "w0_per_layer", "output_offset")


def architecture_signature(store: WeightStore) -> dict:
    arch = store.manifest["architecture"]
    return {k: arch.get(k) for k in ARCH_KEYS}


def write_run(run: PreparedRun, outcome: dict, log=print) -> dict:
    """Write ``config.json``, ``metrics.json``, ``best.pt`` and ``curve.png`` of a finished protocol."""
    results: list[TrainResult] = outcome.pop("results")
    best = results[0]
    config = {
        "options": asdict(run.opts), "task": asdict(run.task), "out_features": run.out_features,
        "num_classes": run.num_classes, "widths": list(run.store.widths),
        "architecture": architecture_signature(run.store), "model_kwargs": run.model_kwargs,
        "model": best.description, "store": str(run.store.root.resolve()),
        "store_created": run.store.manifest.get("created"),
        "data_store": str(run.data_store.root.resolve()),
        # what --train-limit selected (absent: a run written when it kept the train split's first N)
        **({"train_limit_selects": LIMIT_SELECTION} if run.opts.train_limit is not None else {}),
        "model_version": model_version(run.opts.model),  # absent: 1 (dws.tasks.options.MODEL_VERSIONS)
    }
    metrics = {**outcome, "params": best.description["params"], "best_epoch": [r.best_epoch for r in results],
               "seconds": [r.seconds for r in results], "history": [r.history for r in results]}
    run_dir = run.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(config, indent=2))
    (run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    torch.save({"state_dict": best.state_dict, "config": config,
                "stats": {k: [np.asarray(v[0]), np.asarray(v[1])]  # what the loaders normalized with (--normalize)
                          for k, v in (run.statistics or run.data_store.stats()).items()}},
               run_dir / "best.pt")
    plot_curves(metrics["history"], run.task.metric, run_dir / "curve.png")
    if run.task.scalar_predictions:
        write_predictions([r.test_predictions for r in results], run_dir / "test_predictions.csv")
        plot_predictions(best.test_predictions, run_dir / "predictions.png",
                         f"{run.opts.model} on {run.store.root.name}: test {run.task.target}", run.task)
    if run.checkpoints is not None:
        run.checkpoints.clear()  # the run is complete: nothing left to resume
    log(f"{run.opts.model} on {run.store.root.name} ({run.task.name}): test "
        f"{format_report(run.task, outcome['test'])} -> {run_dir}")
    return {"run_dir": str(run_dir), **metrics}


def finished_run(opts: TrainOptions) -> dict | None:
    """What :func:`write_run` returned for the finished run in ``opts``' run directory, if that run
    was trained on the same store (same creation) with the same settings as ``opts`` would train
    (the speed-only options aside); None otherwise. Lets a multi-session pipeline skip what it has."""
    run_dir = Path(opts.out) if opts.out else default_run_dir(opts)
    try:
        config = json.loads((run_dir / "config.json").read_text())
        metrics = json.loads((run_dir / "metrics.json").read_text())
        saved = config["options"]
    except (OSError, ValueError, KeyError):
        return None
    try:
        store = WeightStore(opts.store)
    except StoreError:
        return None
    # saved before the options of LEGACY_SETTINGS existed: those take the values it was trained with
    saved = {**{name: value(with_task_defaults(opts)) for name, value in LEGACY_SETTINGS.items()}, **saved}
    names = {f.name for f in fields(TrainOptions)}
    # written by another version of the options, whose defaults may have moved; an option added since
    # that changes only the speed (SPEED_ONLY) takes its default in TrainOptions(**saved) and is not compared
    if set(saved) - names or not names - set(saved) <= set(SPEED_ONLY):
        return None

    if (config.get("store"), config.get("store_created")) != (str(store.root.resolve()), store.manifest.get("created")):
        return None  # another store, or this one regenerated since

    def settings(o: TrainOptions) -> dict:
        return json.loads(json.dumps(resume_settings(with_task_defaults(o), store)))

    if settings(TrainOptions(**saved)) != settings(opts):
        return None
    if saved.get("train_limit") is not None and config.get("train_limit_selects") != LIMIT_SELECTION:
        return None  # trained on the train split's first N networks, before --train-limit spread them
    if recorded_version(config) != model_version(opts.model):
        return None  # the model's code computes another function since (dws.tasks.options.MODEL_VERSIONS)
    return {"run_dir": str(run_dir), **metrics}


def plot_curves(histories: list[list[dict]], metric: str, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig = curve_figure(histories, metric)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def curve_figure(histories: list[list[dict]], metric: str):
    """Training loss and validation ``metric`` per epoch, one line per seed run; epochs counted from 1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.2))
    for i, hist in enumerate(histories):
        epochs = [h["epoch"] + 1 for h in hist]  # the history counts from 0, as best_epoch does
        a.plot(epochs, [h["train_loss"] for h in hist], marker=".", label=f"seed run {i}")
        b.plot(epochs, [h[f"val_{metric}"] for h in hist], marker=".", label=f"seed run {i}")
    for ax, label in ((a, "train loss"), (b, f"val {metric}")):
        ax.set_xlabel("epoch"), ax.set_ylabel(label)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    a.legend(fontsize=7)
    fig.tight_layout()
    return fig


def write_predictions(per_seed_run: list[Predictions], path: Path) -> None:
    """``seed_run, index, target, prediction`` rows, one per test network and seed run."""
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["seed_run", "index", "target", "prediction"])
        for k, p in enumerate(per_seed_run):
            for i, t, o in zip(p.index.tolist(), p.target.flatten().tolist(), p.output.flatten().tolist()):
                out.writerow([k, i, f"{t:.6g}", f"{o:.6g}"])


def plot_predictions(predictions: Predictions, path: Path, title: str, task: Task) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.2, 4))
    prediction_axes(ax, predictions, title, task)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def prediction_axes(ax, predictions: Predictions, title: str, task: Task) -> None:
    """Predicted against actual on ``ax``: the points, the diagonal, a least-squares line (as the
    paper's figure draws it), and the task's reported metrics (the CLI's units: 100 x MSE for
    accuracies, and Kendall's tau) in the title."""
    from .objectives import kendall_tau

    actual, predicted = predictions.target.flatten().double().numpy(), predictions.output.flatten().double().numpy()
    metrics = {"mse": float(np.mean((predicted - actual) ** 2)),
               "kendall_tau": kendall_tau(predictions.output, predictions.target)}
    ax.scatter(actual, predicted, s=10, alpha=0.6, linewidths=0)
    lo, hi = float(min(actual.min(), predicted.min())), float(max(actual.max(), predicted.max()))
    ax.plot([lo, hi], [lo, hi], color="0.6", linestyle="--", linewidth=1, label="predicted = actual")
    if np.ptp(actual) > 0:
        slope, intercept = np.polyfit(actual, predicted, 1)
        ax.plot([lo, hi], [slope * lo + intercept, slope * hi + intercept], color="black", linewidth=1.2,
                label="linear fit")
    ax.set_xlabel("actual"), ax.set_ylabel("predicted")
    ax.set_title(f"{title}\n{task.report(metrics)}", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")


@dataclass
class LoadedRun:
    """A run directory's best model, ready to evaluate networks of any compatible store."""

    run_dir: Path
    config: dict
    task: Task
    model: nn.Module  # in eval mode, on the CPU
    normalizer: Normalizer  # the statistics it was trained with
    transform: Callable[[WeightSpace], WeightSpace] | None  # the model's evaluation_transform

    def loader(self, store: str | Path | WeightStore, split: str = "test", batch_size: int = 512,
               shuffle: bool = False, **served) -> WeightStoreLoader:
        """``split`` of ``store`` as this model's inputs; refuses networks of another architecture.
        ``served``: ``in_memory`` / ``buffer_chunks`` (:meth:`dws.stream.memory.SplitPlan.loader_options`)."""
        store = self.check(store if isinstance(store, WeightStore) else WeightStore(store))

        def inputs(ws, generator=None):
            ws = ws if self.transform is None else self.transform(ws)
            return ws if self.task.outputs_weights else self.normalizer.normalize(ws)  # adapters take raw networks

        return WeightStoreLoader(store, split, batch_size=batch_size, target=self.task.target, shuffle=shuffle,
                                 normalize=False, augment=inputs, **served)

    def check(self, store: WeightStore) -> WeightStore:
        """``store``, if its networks have the architecture this run was trained on (else StoreError)."""
        mine, theirs = architecture_signature(store), self.config["architecture"]
        if mine != theirs:
            diff = {k: (theirs.get(k), mine.get(k)) for k in ARCH_KEYS if theirs.get(k) != mine.get(k)}
            raise StoreError(f"{store.root} is incompatible with run {self.run_dir}: (run, store) differ in {diff}")
        return store

    def bind(self, store: WeightStore, data_root: str | None = None) -> Task:
        """The run's task for ``store`` (``adapt``: its images; default: the run's own --data-root)."""
        options = self.config["options"]
        return self.task.bind(store, data_root or options.get("data_root"), options.get("image_batch", 128))


def load_run(run_dir: str | Path) -> LoadedRun:
    """The best checkpoint of a ``zoo train`` run directory, rebuilt."""
    run_dir = Path(run_dir)
    ckpt_path = run_dir / "best.pt"
    if not ckpt_path.exists():
        raise FileNotFoundError(f"{run_dir} has no best.pt; is it a `zoo train` run directory?")
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    config = ckpt["config"]
    task = get_task(config["task"]["name"], config["task"]["target"])
    name, trained = config["options"]["model"], recorded_version(config)
    model, _ = build_model(name, tuple(config["widths"]), config["out_features"], **config["model_kwargs"],
                           version=trained)
    try:
        model.load_state_dict(ckpt["state_dict"])
    except RuntimeError as e:  # parameters of another shape or name: a version today's code cannot build
        if rebuilds_exactly(name, trained):
            raise
        raise ValueError(f"{run_dir} was trained as {name} version {trained}, whose parameters today's code "
                         f"(version {model_version(name)}, dws.tasks.options.MODEL_VERSIONS) cannot load; evaluate "
                         f"it with the code it was trained with") from e
    model.eval()
    normalizer = Normalizer.from_stats({k: tuple(v) for k, v in ckpt["stats"].items()})
    return LoadedRun(run_dir, config, task, model, normalizer, evaluation_transform(model))


def probe_selection(config: dict) -> dict:
    """The train networks a run's linear probe fitted on while it trained (its ``--train-limit`` and
    ``--train-views``, as loader options), so that ``zoo eval`` probes on the same selection."""
    options = config["options"]
    return {k: options.get(o) for k, o in (("limit", "train_limit"), ("views", "train_views"))
            if options.get(o) is not None}


def evaluate_run(run_dir: str | Path, store_path: str | Path, split: str = "test", batch_size: int | None = None,
                 data_root: str | None = None, max_memory: int = DEFAULT_MAX_MEMORY) -> dict:
    """Re-evaluate a run's best checkpoint on ``split`` of any compatible store, holding at most
    ``max_memory`` bytes (a split that does not fit is streamed chunk by chunk); in batches of
    ``batch_size`` networks (None: the run's own, as its training evaluated them)."""
    run = load_run(run_dir)
    store = run.check(WeightStore(store_path))
    task = run.bind(store, data_root)
    options = run.config["options"]
    batch_size = batch_size or options.get("batch_size") or 512
    activations = activation_bytes(run.model, store.widths, batch_size, ACTIVATION_PEAK[options["model"]][1])
    read = [split] + (["train"] if task.probe and split != "train" else [])
    sizes = {name: len(range(*store.split_range(name))) for name in read}
    probed = probe_selection(run.config) if task.probe else {}
    if probed and split != "train":  # the probe reads fewer train networks than the whole split
        keep = selected_mask(store, *store.split_range("train"), **probed)
        sizes["train"] = sizes["train"] if keep is None else int(keep.sum())
    memory = plan_memory(max_memory, store, sizes, shuffled=None, batch_size=batch_size,
                         model_bytes=model_bytes(run.model), training=False, activations=activations)
    probe = (run.loader(store, "train", batch_size, **probed, **memory.splits["train"].loader_options())
             if task.probe else None)
    loader = run.loader(store, split, batch_size, **memory.splits[split].loader_options())
    metrics = evaluate(run.model, task, loader, "cpu", probe)
    left_out = {"excluded": dict(loader.excluded)} if loader.excluded else {}  # diverged networks (status)
    notes = []
    trained, now = recorded_version(run.config), model_version(options["model"])
    if not rebuilds_exactly(options["model"], trained):
        notes.append(f"trained as {options['model']} version {trained}, rebuilt as version {now} "
                     f"(dws.tasks.options.MODEL_VERSIONS): its metrics may differ from those the run recorded")
    if probed.get("limit") is not None and run.config.get("train_limit_selects") != LIMIT_SELECTION:
        notes.append(f"trained with --train-limit {probed['limit']} on the train split's first networks, before "
                     f"the limit spread them: the probe now fits on the spread selection, not the one it trained with")
    moved = {"note": "; ".join(notes)} if notes else {}
    return {"run": str(run.run_dir), "store": str(store.root), "split": split, "networks": loader.num_networks,
            **left_out, **moved, "report": f"{split} {task.report(metrics)}", **metrics}
