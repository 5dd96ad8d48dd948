"""The paper's batch-norm / data-augmentation table (MNIST INRs): DWSNet with and without each.

    python -m pipelines.bn_augmentation --scale ci|xl|full
"""

from __future__ import annotations

from pathlib import Path

from .common import parse_args, variant_table
from .inr_classification import SCALES, mnist_store

PAPER = {"DWSNet": "77.20 ± 0.41", "DWSNet + DA": "80.20 ± 0.28", "DWSNet + BN": "83.05 ± 1.35",
         "DWSNet + DA + BN": "85.71 ± 0.57"}
VARIANTS = {"DWSNet": dict(bn=False, augment=False), "DWSNet + DA": dict(bn=False, augment=True),
            "DWSNet + BN": dict(bn=True, augment=False), "DWSNet + DA + BN": dict(bn=True, augment=True)}


def run(scale_name: str, out: Path, workers: int, data_root=None, log=print) -> Path:
    store = mnist_store(scale_name, out, workers, data_root, log)
    return variant_table(store, out, "Batch norm and data augmentation (MNIST INRs)", scale_name,
                         SCALES[scale_name].train, VARIANTS, PAPER, log=log)


def main():
    args = parse_args(__doc__, "results/bn-augmentation", SCALES)
    print(run(args.scale, Path(args.out) / args.scale, args.workers, args.data_root).read_text())


if __name__ == "__main__":
    main()
