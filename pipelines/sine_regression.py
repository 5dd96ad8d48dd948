"""The paper's sine-frequency regression figure: test MSE against the number of training INRs.

    python -m pipelines.sine_regression --scale ci      # minutes on 2 cores
    python -m pipelines.sine_regression --scale full    # the paper's 800/100/100 zoo, 100 epochs

INRs of ``sin(bx)``, ``b ~ U(0.5, 10)``; each model predicts ``b`` from the weights. Writes
``report.md`` (a table, log-scale MSE in the figure) and ``mse_vs_train_size.png``.
"""

from __future__ import annotations

import json
from pathlib import Path

from .common import Scale, fmt, make_store, parse_args, train, write_report

SCALES = {
    "smoke": Scale("smoke", dict(kind="sine-regression", limit=24, chunk_size=16, steps=20),
                   dict(epochs=2, lr=1e-3, seeds=1, batch_size=8, hidden_channels=8, num_layers=2)),
    "ci": Scale("ci", dict(kind="sine-regression", limit={"train": 320, "val": 50, "test": 100}, chunk_size=64),
                dict(epochs=40, lr=1e-3, seeds=1, batch_size=32, hidden_channels=8, num_layers=2)),
    "full": Scale("full", dict(kind="sine-regression", chunk_size=256),
                  dict(epochs=100, lr=None, seeds=3, batch_size=32, hidden_channels=8, num_layers=2)),
}
SIZES = {"smoke": (4, 16), "ci": (20, 80, 320), "full": (10, 25, 50, 100, 200, 400, 800)}
MODELS = {"smoke": ("dwsnet", "mlp"), "ci": ("dwsnet", "mlp", "mlp-perm"),
          "full": ("dwsnet", "mlp", "mlp-perm", "mlp-align", "inr2vec", "transformer")}


def sine_store(scale_name: str, out: Path, workers: int, log=print) -> Path:
    """The scale's zoo of sine INRs (also the weight-space models table's sine column)."""
    return make_store(out, f"{scale_name}-sine-regression", log=log, workers=workers, progress=False,
                      **SCALES[scale_name].generate)


def run(scale_name: str, out: Path, workers: int, models=None, log=print) -> Path:
    scale = SCALES[scale_name]
    store = sine_store(scale_name, out, workers, log)
    models = models or MODELS[scale_name]
    results: dict[str, dict[int, dict]] = {m: {} for m in models}
    cells: dict[tuple[str, int], str] = {}
    for size in SIZES[scale_name]:
        for model in models:
            metrics = train(store, out / f"n{size}", model, "regress", log=log, train_limit=size, progress=False,
                            **scale.train)
            results[model][size], cells[model, size] = metrics["summary"]["mse"], fmt(metrics, "mse", digits=4)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    plot(results, out / "mse_vs_train_size.png")
    rows = [[str(size)] + [cells[m, size] for m in models] for size in SIZES[scale_name]]
    return write_report(
        out / "report.md", f"Sine frequency regression, scale {scale_name}", ["train INRs"] + list(models), rows,
        ["test MSE of the predicted frequency b (lower is better); figure: mse_vs_train_size.png",
         "paper (Figure 3): DWSNets has the lowest MSE at every training-set size, by a wide margin",
         f"store: {store}; training: {scale.train}"],
    )


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for model, by_size in results.items():
        sizes = sorted(by_size)
        ax.errorbar(sizes, [by_size[s]["mean"] for s in sizes], yerr=[by_size[s]["std"] for s in sizes],
                    marker="o", label=model)
    ax.set_xscale("log"), ax.set_yscale("log")
    ax.set_xlabel("training INRs"), ax.set_ylabel("test MSE (frequency)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    args = parse_args(__doc__, "results/sine-regression", SCALES)
    out = Path(args.out) / args.scale
    report = run(args.scale, out, args.workers, args.models.split(",") if args.models else None)
    print(report.read_text())


if __name__ == "__main__":
    main()
