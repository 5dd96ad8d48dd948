"""CIFAR-10-shaped batch pickles of random pixels, for timing ``zoo generate cifar10-classifiers`` on a
machine that has no CIFAR-10 copy (the GPU session: its payload cannot carry the 178 MB of batches).

    python benchmarks/synthetic_cifar.py OUT_DIR     # data_batch_1..5 + test_batch, 60,000 images

The files have the official pickles' layout (``data`` uint8 [10000, 3072], ``labels``), so
``--dataset cifar10-unverified --data-root OUT_DIR`` reads them (recorded as unverified). The pixels
are noise: the speed of a zoo does not depend on them, its accuracies do (they are ~chance).
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import numpy as np


def write_batches(out: Path, seed: int = 0) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for name in [f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]:
        batch = {b"batch_label": name.encode(), b"labels": rng.integers(0, 10, 10_000).tolist(),
                 b"data": rng.integers(0, 256, (10_000, 3072), dtype=np.uint8),
                 b"filenames": [f"{name}_{i}.png".encode() for i in range(10_000)]}
        with open(out / name, "wb") as f:
            pickle.dump(batch, f, protocol=2)


if __name__ == "__main__":
    write_batches(Path(sys.argv[1]))
