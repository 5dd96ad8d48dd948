"""The paper's block ablation (MNIST INRs): DWSNet with only some of its blocks.

    python -m pipelines.ablation --scale ci|xl|full

Variants: ``--blocks`` B2B, W2W, W2W+B2B, diagonal and all (the full DWSNet), same training.
"""

from __future__ import annotations

from pathlib import Path

from .common import parse_args, variant_table
from .inr_classification import SCALES, mnist_store

PAPER = {"B2B": "65.87 ± 0.37", "W2W": "84.75 ± 1.11", "W2W+B2B": "85.23 ± 0.01", "diagonal": "85.68 ± 0.42",
         "all": "85.71 ± 0.57"}


def run(scale_name: str, out: Path, workers: int, data_root=None, log=print) -> Path:
    store = mnist_store(scale_name, out, workers, data_root, log)
    variants = {blocks: dict(blocks=blocks) for blocks in PAPER}
    return variant_table(store, out, "Block ablation (MNIST INRs)", scale_name, SCALES[scale_name].train,
                         variants, PAPER, log=log)


def main():
    args = parse_args(__doc__, "results/ablation", SCALES)
    print(run(args.scale, Path(args.out) / args.scale, args.workers, args.data_root).read_text())


if __name__ == "__main__":
    main()
