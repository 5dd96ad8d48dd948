"""Human-facing views of a classifier zoo: the ``zoo info`` summary and the ``zoo show`` figure."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..options import plural
from .figures import save_figure
from .format import disk_line, head_lines, percentiles, shown, widths_text
from ..store import WeightStore
from ..store.format import FAMILY_CLASSIFIERS


LABELLED_RUNS = 10  # runs named in the legend; more are drawn under one label


def is_classifier_store(store: WeightStore) -> bool:
    return store.manifest.get("architecture", {}).get("family") == FAMILY_CLASSIFIERS


def _columns(store: WeightStore) -> dict[str, np.ndarray]:
    table = store.networks
    accuracy = table.column("test_accuracy").to_numpy(zero_copy_only=False).astype(np.float64)
    loss = table.column("train_loss").to_numpy(zero_copy_only=False).astype(np.float64)
    return {
        "run": table.column("trajectory_id").to_numpy(),
        "step": table.column("step").to_numpy(),
        "accuracy": accuracy,  # NaN where null (diverged)
        "loss": loss,
        "split": np.asarray(table.column("split").to_pylist(), dtype=object),
        "status": np.asarray(table.column("status").to_pylist(), dtype=object),
        "classes": table.column("classes").to_pylist(),
    }


def _finals(cols) -> np.ndarray:
    """Row of each run's last checkpoint."""
    last = np.ones(len(cols["run"]), bool)
    last[:-1] = cols["run"][1:] != cols["run"][:-1]
    return last


def summary(store: WeightStore) -> str:
    m = store.manifest
    arch, gen, train = m["architecture"], m["generation"], m["generation"]["train"]
    cols = _columns(store)
    runs, per_run = m["runs"]["count"], m["runs"]["checkpoints_per_run"]
    images = m["source"].get("images", {})
    ok = ~np.isnan(cols["accuracy"])
    final = _finals(cols)
    length = f"{train['steps']} steps" if train.get("steps") else plural(train['epochs'], 'epoch')
    every = f", a checkpoint every {train['checkpoint_every']} steps" if train.get("checkpoint_every") else ""
    lines = [
        *head_lines(store),
        f"source     {m['source'].get('source')}: official train {images.get('train', '?')} / test "
        f"{images.get('test', '?')} images  (seed {gen['seed']})",
        f"arch       {widths_text(arch)}  MLP, activation {arch['activation']}",
        f"training   Adam lr {train['lr']:g}, batch {train['batch_size']}, {length}{every}"
        + (", hyperparameters sampled per run" if gen.get("diversity") else ""),
        f"networks   {m['num_networks']} in {plural(m['num_chunks'], 'chunk')} of {m['chunk_size']}: "
        f"{plural(runs, 'run')} x {plural(per_run, 'checkpoint')}",
        "splits     " + ", ".join(f"{s} {v['count']} ({plural(v['runs'], 'run')})" for s, v in m["splits"].items()),
        "test acc   " + percentiles(cols["accuracy"][ok], 3) + ("  (all checkpoints)" if per_run > 1 else ""),
    ]
    if per_run > 1:
        lines.append("final acc  " + percentiles(cols["accuracy"][ok & final], 3) + "  (last checkpoint of each run)")
    losses = cols["loss"][final & ~np.isnan(cols["loss"])]
    if len(losses):
        lines.append(f"train loss final: median {np.median(losses):.4f}, mean {losses.mean():.4f}")
    pairs = {tuple(c) for c in cols["classes"]}
    if len(next(iter(pairs))) < arch["widths"][-1]:
        per_pair = np.unique([str(c) for c, f in zip(cols["classes"], final) if f], return_counts=True)[1]
        lines.append(f"classes    {len(pairs)} class sets of {len(next(iter(pairs)))}, "
                     f"{per_pair.min()}-{per_pair.max()} runs each")
    diverged = sorted(set(cols["run"][cols["status"] != "ok"].tolist()))
    lines.append("status     " + (f"{plural(len(diverged), 'run')} diverged: {diverged[:10]}" if diverged
                                  else "every run trained with finite losses"))
    lines.append(disk_line(store))
    return "\n".join(lines)


def show(store: WeightStore, out: Path, count: int | None = None, log=print) -> Path:
    """Test-accuracy histogram per split; beside it, accuracy against step for ``count`` runs
    (default 8; labelled up to :data:`LABELLED_RUNS`) and the median over all runs (trajectories),
    or the mean accuracy per class pair (pair zoos, which take no ``count``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = _columns(store)
    ok = ~np.isnan(cols["accuracy"])
    per_run = store.manifest["runs"]["checkpoints_per_run"]
    num_classes = store.manifest["architecture"]["widths"][-1]
    fig, (hist, right) = plt.subplots(1, 2, figsize=(11, 4))
    bins = np.linspace(np.nanmin(cols["accuracy"]) if ok.any() else 0, 1, 31)
    for split in ("train", "val", "test"):
        rows = ok & (cols["split"] == split)
        if rows.any():
            hist.hist(cols["accuracy"][rows], bins=bins, alpha=0.6, label=f"{split} ({rows.sum()})")
    hist.set_xlabel("test accuracy")
    hist.set_ylabel("networks")
    hist.legend()
    hist.set_title("all checkpoints" if per_run > 1 else "final networks")
    if per_run > 1:
        runs = np.unique(cols["run"])
        drawn = runs[np.linspace(0, len(runs) - 1, shown(count or 8, len(runs), "runs", log)).round().astype(int)]
        for k, run in enumerate(drawn):
            rows = cols["run"] == run
            label = f"run {run}" if len(drawn) <= LABELLED_RUNS else (f"{len(drawn)} runs" if k == 0 else None)
            right.plot(cols["step"][rows], cols["accuracy"][rows], lw=0.8, alpha=0.7, label=label)
        steps = np.unique(cols["step"])
        median = [np.nanmedian(cols["accuracy"][cols["step"] == s]) for s in steps]
        right.plot(steps, median, color="black", lw=2, label="median, all runs")
        right.set_xlabel("step")
        right.set_ylabel("test accuracy")
        right.legend(fontsize=7)
        right.set_title("accuracy along training")
    else:
        if count is not None:
            log("note: --count does not apply to a zoo of final networks: it draws the mean accuracy per class pair")
        grid = np.full((num_classes, num_classes), np.nan)
        sums, counts = np.zeros_like(grid), np.zeros_like(grid)
        for classes, acc in zip(cols["classes"], cols["accuracy"]):
            if len(classes) == 2 and not np.isnan(acc):
                sums[classes[0], classes[1]] += acc
                counts[classes[0], classes[1]] += 1
        grid[counts > 0] = sums[counts > 0] / counts[counts > 0]
        image = right.imshow(grid, cmap="viridis")
        fig.colorbar(image, ax=right, label="mean test accuracy")
        names = store.manifest["source"].get("classes") or [str(c) for c in range(num_classes)]
        right.set_xticks(range(num_classes), names, rotation=90, fontsize=7)
        right.set_yticks(range(num_classes), names, fontsize=7)
        right.set_xlabel("second class")
        right.set_ylabel("first class")
        right.set_title("mean accuracy per class pair")
    fig.suptitle(f"{store.manifest['kind']}: {store.num_networks} networks")
    fig.tight_layout()
    return save_figure(fig, out)
