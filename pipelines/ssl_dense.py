"""The paper's self-supervised dense-representation table and t-SNE picture (sine-wave INRs).

    python -m pipelines.ssl_dense --scale ci       # minutes on 2 cores
    python -m pipelines.ssl_dense --scale full     # 5,000 INRs of a sin(bx), 500 epochs

SimCLR-style NT-Xent (temperature 0.1) with views made by Gaussian noise (σ 0.2) and masking
(p 0.5) into a 16-dim embedding; a linear regressor from the embedding predicts (a, b); the
report gives its test MSE beside the paper's, and ``tsne.png`` the 2-D t-SNE of test embeddings.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from dws.tasks.rundir import load_run

from .common import Scale, fmt, make_store, parse_args, train, write_report

PAPER = {"mlp": "7.39 ± 0.19", "mlp-perm": "5.65 ± 0.01", "mlp-align": "4.47 ± 0.15", "inr2vec": "3.86 ± 0.32",
         "transformer": "5.11 ± 0.12", "dwsnet": "1.39 ± 0.06"}
SCALES = {
    "smoke": Scale("smoke", dict(kind="sine-ssl", limit=40, chunk_size=16, steps=20),
                   dict(epochs=2, lr=1e-3, seeds=1, batch_size=8, hidden_channels=8)),
    "ci": Scale("ci", dict(kind="sine-ssl", limit={"train": 640, "val": 80, "test": 160}, chunk_size=80),
                dict(epochs=40, lr=1e-3, seeds=1, batch_size=64, hidden_channels=16)),
    "full": Scale("full", dict(kind="sine-ssl", chunk_size=512),
                  dict(epochs=500, lr=None, seeds=3, batch_size=512, hidden_channels=16)),
}
MODELS = {"smoke": ("dwsnet", "mlp"), "ci": ("dwsnet", "mlp", "inr2vec"), "full": tuple(PAPER)}


def embeddings(run_dir: Path, store: Path) -> tuple[np.ndarray, np.ndarray]:
    """Test-split embeddings of a run's best model and the (a, b) they should encode."""
    run = load_run(run_dir)
    batches = list(run.loader(store, "test", batch_size=256))
    with torch.no_grad():
        z = torch.cat([run.model(b.ws) for b in batches]).numpy()
    return z, torch.cat([b.target for b in batches]).numpy()


def plot_tsne(z: np.ndarray, y: np.ndarray, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.manifold import TSNE

    xy = TSNE(n_components=2, perplexity=min(30, max(2, len(z) // 4)), random_state=0).fit_transform(z)
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.6))
    for ax, k, name in zip(axes, (0, 1), ("amplitude a", "frequency b")):
        sc = ax.scatter(xy[:, 0], xy[:, 1], c=y[:, k], s=8, cmap="viridis")
        fig.colorbar(sc, ax=ax, label=name)
        ax.set_xticks([]), ax.set_yticks([])
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(scale_name: str, out: Path, workers: int, models=None, log=print) -> Path:
    scale = SCALES[scale_name]
    store = make_store(out, f"{scale_name}-sine-ssl", log=log, workers=workers, progress=False, **scale.generate)
    models = models or MODELS[scale_name]
    results, cells = {}, {}
    for model in models:
        metrics = train(store, out, model, "ssl", log=log, progress=False, **scale.train)
        results[model], cells[model] = metrics["summary"], fmt(metrics, "probe_mse")
        z, y = embeddings(Path(metrics["run_dir"]), store)
        plot_tsne(z, y, out / f"tsne-{model}.png", f"{model}: t-SNE of test embeddings")
    (out / "results.json").write_text(json.dumps(results, indent=2))
    rows = [[m, PAPER[m], cells[m]] for m in models]
    return write_report(
        out / "report.md", f"Self-supervised dense representation (sine INRs), scale {scale_name}",
        ["model", "paper (linear-probe MSE)", "ours (linear-probe MSE)"], rows,
        ["linear regressor from the 16-dim embedding to (a, b), fitted on train embeddings, test MSE",
         "t-SNE pictures: tsne-<model>.png", f"store: {store}; training: {scale.train}"],
    )


def main():
    args = parse_args(__doc__, "results/ssl-dense", SCALES)
    out = Path(args.out) / args.scale
    print(run(args.scale, out, args.workers, args.models.split(",") if args.models else None).read_text())


if __name__ == "__main__":
    main()
