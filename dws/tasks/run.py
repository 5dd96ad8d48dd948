"""``zoo train`` / ``zoo eval``: a store, a model and a task in, a run directory out.

A run directory holds ``config.json`` (everything needed to rebuild the model), ``metrics.json``
(learning-rate search, per-seed validation/test metrics, mean ± std, training curves),
``best.pt`` (the best checkpoint with the normalization statistics it was trained with) and
``curve.png``.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from dws.stream import Normalizer, WeightStoreLoader, inr_augmentation
from dws.stream.augment import Compose, GaussianNoise, WeightDropout
from dws.stream.batch import weightspace_from_arrays
from zoo.devices import resolve_device
from zoo.options import require_at_least, require_positive
from zoo.store import StoreError, WeightStore
from zoo.store.derive import write_store

from .allocator import retain_freed_memory
from .models import build_model
from .objectives import get_task, output_size
from .protocol import PAPER_LRS, format_summary, run_protocol, summarize
from .trainer import TrainConfig, TrainResult, evaluate, train

ARCH_KEYS = ("widths", "activation", "w0_per_layer", "output_offset")


@dataclass
class TrainOptions:
    store: str
    model: str = "dwsnet"
    task: str = "classify"
    target: str | None = None
    out: str | None = None
    epochs: int = 10
    batch_size: int = 512
    lr: float | None = None  # None: the paper's search over PAPER_LRS on the validation split
    seeds: int = 1
    seed: int = 0
    hidden_channels: int = 48
    num_layers: int = 4
    dropout: float = 0.0
    bn: bool = True
    blocks: str = "all"
    pool: str = "max"
    augment: bool = True
    precise_bn: int = 4096  # BN statistics re-estimated on this many clean train networks per evaluation; 0: off
    loader_workers: int = 0
    device: str = "auto"
    patience: int | None = None
    train_limit: int | None = None  # train on the first N networks of the train split only
    progress: bool = True
    workers: int = 1  # > 1: data-parallel training on Ray Train (dws/tasks/distributed.py)
    address: str | None = None  # Ray cluster to join with workers > 1 (None: a local one)


class FirstBatches:
    """The first ``count`` batches of each pass over ``loader`` (a fresh shuffle every pass)."""

    def __init__(self, loader, count: int):
        self.loader, self.count = loader, count

    def __iter__(self):
        return itertools.islice(iter(self.loader), self.count)


def default_run_dir(opts: TrainOptions) -> Path:
    return Path("runs") / f"{Path(opts.store).name}-{opts.model}-{opts.task}"


def architecture_signature(store: WeightStore) -> dict:
    arch = store.manifest["architecture"]
    return {k: arch.get(k) for k in ARCH_KEYS}


def default_augmentation(store: WeightStore):
    """The appendix's augmentations: geometric ones for 2-D INRs, plus weight noise and dropout."""
    noise = Compose(GaussianNoise(0.01, relative=True), WeightDropout(0.05))
    if store.widths[0] == 2 and store.manifest["architecture"].get("activation") == "sine":
        return Compose(inr_augmentation(degrees=15.0, shift=0.05, scale=(0.95, 1.05)), noise)
    return noise


def _num_classes(store: WeightStore) -> int:
    labels = store.networks.column("label").to_numpy()
    if labels.min() < 0:
        raise StoreError(f"{store.root} has networks without a label; it is not a classification store")
    return int(labels.max()) + 1


def _aligned_store(store: WeightStore, model, run_dir: Path, log) -> WeightStore:
    """Align every network of ``store`` to the model's MergeMany reference, once, into a new store."""
    root = run_dir / "aligned-store"
    if (root / "manifest.json").exists():
        return WeightStore(root)
    start, stop = store.split_range("train")
    log(f"mlp-align: building the MergeMany reference from {min(stop - start, 1000)} train networks")
    model.prepare(weightspace_from_arrays(store.read(start, stop)))
    log("mlp-align: aligning every network to the reference")
    raw = weightspace_from_arrays(store.read(0, store.num_networks))
    aligned = model.align(raw)
    params = {}
    for m, (w, b) in enumerate(zip(aligned.weights, aligned.biases), start=1):
        params[f"W{m}"], params[f"b{m}"] = w.numpy(), b.numpy()
    meta = {k: store.manifest[k] for k in ("kind", "architecture", "targets", "source") if k in store.manifest}
    meta["generation"] = {"derived_from": str(store.root), "transform": "weight matching to a MergeMany reference"}
    write_store(root, widths=store.widths, params=params, rows=store.networks, splits=store.manifest["splits"],
                metadata=meta, chunk_size=store.chunk_size)
    return WeightStore(root)


def check_options(opts: TrainOptions) -> None:
    """Refuse option values that cannot train before anything is read or created (ValueError)."""
    require_at_least({"--epochs": (opts.epochs, 1), "--batch-size": (opts.batch_size, 1), "--seeds": (opts.seeds, 1),
                      "--hidden-channels": (opts.hidden_channels, 1), "--num-layers": (opts.num_layers, 1),
                      "--loader-workers": (opts.loader_workers, 0), "--workers": (opts.workers, 1),
                      "--patience": (opts.patience, 1), "--train-limit": (opts.train_limit, 1)})
    require_positive("--lr", opts.lr)
    if not 0 <= opts.dropout < 1:
        raise ValueError(f"--dropout must be in [0, 1), got {opts.dropout}")
    resolve_device(opts.device)


def train_run(opts: TrainOptions, log=print) -> dict:
    check_options(opts)
    if opts.workers > 1:
        from .distributed import train_distributed

        return train_distributed(opts, log)
    return fit_run(opts, log)


def setup_run(opts: TrainOptions, log=print):
    """Store, task, run directory (created), model sizes and the data store (aligned for mlp-align)."""
    store = WeightStore(opts.store)
    task = get_task(opts.task, opts.target)
    run_dir = Path(opts.out) if opts.out else default_run_dir(opts)
    if (run_dir / "metrics.json").exists():
        log(f"note: {run_dir} holds an earlier run; this one replaces it when it finishes")
    run_dir.mkdir(parents=True, exist_ok=True)
    num_classes = _num_classes(store) if task.name == "classify" else None
    out_features = output_size(task, num_classes)
    model_kw = dict(hidden_channels=opts.hidden_channels, num_layers=opts.num_layers, dropout=opts.dropout,
                    bn=opts.bn, blocks=opts.blocks, pool=opts.pool)
    data_store = store
    if opts.model == "mlp-align":
        aligner, _ = build_model("mlp-align", store.widths, out_features, **model_kw)
        data_store = _aligned_store(store, aligner, run_dir, log)
    return store, task, run_dir, num_classes, out_features, model_kw, data_store


def fit_run(opts: TrainOptions, log=print, train_fn=train, write: bool = True) -> dict:
    """Train (the lr protocol and seeds of ``opts``) with ``train_fn`` and write the run directory if ``write``."""
    store, task, run_dir, num_classes, out_features, model_kw, data_store = setup_run(opts, log)
    device = resolve_device(opts.device)
    if torch.device(device).type == "cpu":
        retain_freed_memory()  # ~20% faster DWSNet steps: no page faults for re-allocated activations
    augment = default_augmentation(store) if opts.augment else None

    def loaders(seed: int) -> dict:
        common = dict(batch_size=opts.batch_size, target=task.target, seed=seed, num_workers=opts.loader_workers)
        train = WeightStoreLoader(data_store, "train", shuffle=True, augment=augment,
                                  drop_last=task.name == "ssl", limit=opts.train_limit, **common)
        out = {
            "train": train,
            "val": WeightStoreLoader(data_store, "val", shuffle=False, **common),
            "test": WeightStoreLoader(data_store, "test", shuffle=False, **common),
        }
        # the train split un-augmented (as evaluated), sharing the training loader's arrays in memory
        if task.name == "ssl":
            out["probe"] = train.variant(shuffle=False)
        if opts.precise_bn > 0 and opts.bn:
            # a fresh random subset of the (limited) train split per pass
            out["calibrate"] = FirstBatches(train.variant(shuffle=True), math.ceil(opts.precise_bn / opts.batch_size))
        return out

    def fit(config: TrainConfig) -> TrainResult:
        torch.manual_seed(config.seed)
        model, desc = build_model(opts.model, store.widths, out_features, **model_kw)
        if opts.model == "mlp-align":
            model.align_in_forward = False  # its inputs come from the aligned store
        log(f"{opts.model}: {desc['params']:,} parameters; lr {config.lr:g}, seed {config.seed}")
        result = train_fn(model, task, loaders(config.seed), config)
        result.description = desc
        return result

    base = TrainConfig(epochs=opts.epochs, lr=opts.lr or PAPER_LRS[0], seed=opts.seed, device=device,
                       patience=opts.patience, progress=opts.progress)
    if opts.lr is None:
        outcome = run_protocol(fit, task, base, seeds=opts.seeds, log=log)
    else:
        runs = [fit(replace(base, seed=opts.seed + s)) for s in range(opts.seeds)]
        outcome = summarize(task, opts.lr, opts.seed, runs, None)
    if not write:
        return {"run_dir": str(run_dir), **outcome}
    return write_run(opts, log, store, task, run_dir, num_classes, out_features, model_kw, data_store, outcome)


def write_run(opts, log, store, task, run_dir, num_classes, out_features, model_kw, data_store, outcome) -> dict:
    """Write ``config.json``, ``metrics.json``, ``best.pt`` and ``curve.png`` of a finished protocol."""
    results: list[TrainResult] = outcome.pop("results")
    best = results[0]
    config = {
        "options": asdict(opts), "task": asdict(task), "out_features": out_features, "num_classes": num_classes,
        "widths": list(store.widths), "architecture": architecture_signature(store),
        "model_kwargs": model_kw, "model": best.description, "store": str(store.root.resolve()),
        "data_store": str(data_store.root.resolve()),
    }
    metrics = {**outcome, "params": best.description["params"], "best_epoch": [r.best_epoch for r in results],
               "seconds": [r.seconds for r in results], "history": [r.history for r in results]}
    (run_dir / "config.json").write_text(json.dumps(config, indent=2))
    (run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    torch.save({"state_dict": best.state_dict, "config": config,
                "stats": {k: [np.asarray(v[0]), np.asarray(v[1])] for k, v in data_store.stats().items()}},
               run_dir / "best.pt")
    plot_curves(metrics["history"], task.metric, run_dir / "curve.png")
    log(f"{opts.model} on {store.root.name} ({task.name}): test {task.metric} "
        f"{format_summary(outcome['summary'][task.metric], len(results))} -> {run_dir}")
    return {"run_dir": str(run_dir), **metrics}


def plot_curves(histories: list[list[dict]], metric: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.2))
    for i, hist in enumerate(histories):
        epochs = [h["epoch"] for h in hist]
        a.plot(epochs, [h["train_loss"] for h in hist], label=f"seed run {i}")
        b.plot(epochs, [h[f"val_{metric}"] for h in hist], label=f"seed run {i}")
    a.set_xlabel("epoch"), a.set_ylabel("train loss"), b.set_xlabel("epoch"), b.set_ylabel(f"val {metric}")
    a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def evaluate_run(run_dir: str | Path, store_path: str | Path, split: str = "test", batch_size: int = 512) -> dict:
    """Re-evaluate a run's best checkpoint on ``split`` of any compatible store."""
    run_dir = Path(run_dir)
    ckpt_path = run_dir / "best.pt"
    if not ckpt_path.exists():
        raise FileNotFoundError(f"{run_dir} has no best.pt; is it a `zoo train` run directory?")
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    config = ckpt["config"]
    store = WeightStore(store_path)
    mine, theirs = architecture_signature(store), config["architecture"]
    if mine != theirs:
        diff = {k: (theirs.get(k), mine.get(k)) for k in ARCH_KEYS if theirs.get(k) != mine.get(k)}
        raise StoreError(f"{store.root} is incompatible with run {run_dir}: (run, store) differ in {diff}")
    task = get_task(config["task"]["name"], config["task"]["target"])
    model, _ = build_model(config["options"]["model"], tuple(config["widths"]), config["out_features"],
                           **config["model_kwargs"])
    model.load_state_dict(ckpt["state_dict"])
    normalizer = Normalizer.from_stats({k: tuple(v) for k, v in ckpt["stats"].items()})
    if config["options"]["model"] == "mlp-align":
        model.align_in_forward = False

        def transform(ws, generator=None):
            return normalizer.normalize(model.align(ws))
    else:
        def transform(ws, generator=None):
            return normalizer.normalize(ws)

    def loader(which, shuffle=False):
        return WeightStoreLoader(store, which, batch_size=batch_size, target=task.target, shuffle=shuffle,
                                 normalize=False, augment=transform)

    metrics = evaluate(model, task, loader(split), "cpu", loader("train") if task.name == "ssl" else None)
    return {"run": str(run_dir), "store": str(store.root), "split": split, **metrics}
