"""Small synthetic image data sets on disk for the classifier-zoo tests, in the official formats.

Each class has its own random prototype image; an image is its class's prototype plus noise, so
a classifier learns something in a few steps but not everything (accuracies spread).
"""

from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np


def synthetic_images(n: int, shape, seed: int, noise: float = 90.0, classes: int = 10):
    rng = np.random.default_rng(seed)
    prototypes = np.random.default_rng(1234).integers(0, 256, (classes, *shape))
    labels = rng.integers(0, classes, n)
    images = np.clip(prototypes[labels] + rng.normal(0, noise, (n, *shape)), 0, 255).astype(np.uint8)
    return images, labels.astype(np.uint8)


def write_idx(path: Path, array: np.ndarray) -> Path:
    """A gzip'd IDX file of a uint8 array (the MNIST format)."""
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(gzip.compress(header + np.ascontiguousarray(array, np.uint8).tobytes()))
    return path


def write_mnist_like(root: Path, n_train: int = 600, n_test: int = 300, seed: int = 0) -> Path:
    """MNIST-format files (28x28) in ``root``: read them with ``source_options={"verify": False}``."""
    root.mkdir(parents=True, exist_ok=True)
    for prefix, n, s in (("train", n_train, seed), ("t10k", n_test, seed + 1)):
        images, labels = synthetic_images(n, (28, 28), s)
        write_idx(root / f"{prefix}-images-idx3-ubyte.gz", images)
        write_idx(root / f"{prefix}-labels-idx1-ubyte.gz", labels)
    return root


def write_cifar_like(root: Path, per_batch: int = 60, n_test: int = 200, seed: int = 0) -> Path:
    """CIFAR-10 python batches (``data_batch_1..5``, ``test_batch``) in ``root/cifar-10-batches-py``."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for i, name in enumerate(names):
        images, labels = synthetic_images(n_test if name == "test_batch" else per_batch, (32, 32, 3), seed + i,
                                          noise=110.0)
        data = images.transpose(0, 3, 1, 2).reshape(len(images), -1)  # the official layout: RGB planes
        (folder / name).write_bytes(pickle.dumps({"data": data, "labels": labels.tolist()}, protocol=2))
    return root


def trajectory_options(root, **kw) -> dict:
    """``GenerateOptions`` of a tiny trajectory zoo of the images written by :func:`write_mnist_like` at
    ``root``: 8 runs of 4 checkpoints (12 steps, one every 4), chunks of 8 networks; ``kw`` overrides."""
    return dict(kind="mnist-classifiers", data_root=str(root), source_options={"verify": False}, limit=8,
                batch_size=32, steps=12, checkpoint_every=4, chunk_size=8, progress=False) | kw
