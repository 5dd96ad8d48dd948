"""The images a classifier zoo trains and tests on, as its networks see them, and each run's batches.

Inputs: an image ``[H, W, C]`` becomes the vector of its channel planes, each row-major
(``C x H x W``, what ``torchvision.transforms.ToTensor()`` then ``flatten()`` gives, and the byte
order of a CIFAR-10 batch row), and every value ``(pixel / 255 - mean[c]) / std[c]``, computed in
float32 in that order (so numpy reproduces it bit for bit). Networks train on the official train
split and are tested on the official test split, each on the images of its own classes.

Batches (:func:`batch_plan`): a run's training pool is the train images of its classes (a fixed
random fraction of them where the run's ``data_fraction`` < 1); it takes
``epochs * ceil(len(full pool) / batch_size)`` steps over an endless sequence of passes over its
pool, each pass in a fresh random order and cut into batches, the last one shorter. Every draw
comes from the run's own seed, so the batches do not depend on which runs train together.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from ..sources.errors import DataError
from ..sources.images import ImageSource
from .runs import DATA_STREAM, RunSettings
from .schedule import TrainSchedule


@dataclass(frozen=True)
class ClassifierData:
    """Official train and test images as uint8 input vectors, their labels and the normalization."""

    train_pixels: np.ndarray  # uint8 [N, C*H*W]
    train_labels: np.ndarray  # int64 [N]
    test_pixels: np.ndarray
    test_labels: np.ndarray
    image_shape: tuple[int, int, int]  # H, W, C
    mean: tuple[float, ...]  # per channel, of pixel / 255
    std: tuple[float, ...]
    pixel_scale: float = 255.0

    @property
    def input_size(self) -> int:
        return self.train_pixels.shape[1]

    @cached_property
    def key(self) -> str:
        """Identifies the content (the per-process cache of normalized inputs is keyed by it)."""
        return _content_key(self)

    def input_manifest(self) -> dict:
        return input_manifest(self.image_shape, self.mean, self.std, self.pixel_scale)


def _content_key(data: ClassifierData) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for array in (data.train_pixels, data.train_labels, data.test_pixels, data.test_labels):
        digest.update(np.ascontiguousarray(array).data)
    digest.update(repr((data.image_shape, data.mean, data.std, data.pixel_scale)).encode())
    return digest.hexdigest()


def input_manifest(image_shape, mean, std, pixel_scale: float = 255.0) -> dict:
    """How an image becomes a network's input, as a store's manifest states it."""
    h, w, c = image_shape
    return {
        "image_shape": [h, w, c],
        "flatten": "C x H x W: the channel planes one after the other, each row-major (torchvision ToTensor() "
                   "then flatten(); a CIFAR-10 batch row as stored)",
        "index": "x[c*H*W + y*W + x] for pixel (y, x) of channel c",
        "pixel_scale": pixel_scale,
        "mean": list(mean),
        "std": list(std),
        "value": "(float32(pixel) / float32(pixel_scale) - float32(mean[c])) / float32(std[c]), in float32, "
                 "in that order",
    }


def input_vectors(images: np.ndarray) -> np.ndarray:
    """uint8 ``[N, H, W, C]`` -> ``[N, C*H*W]`` in the input order (channel planes, row-major)."""
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2).reshape(len(images), -1))


def classifier_data(source, mean, std) -> ClassifierData:
    """The official splits of an image source, with the kind's per-channel normalization."""
    if not isinstance(source, ImageSource):
        raise DataError(f"classifier zoos train on images; data source {getattr(source, 'name', source)!r} "
                        f"has none (use an image data set: mnist, fashion-mnist, cifar10)")
    train, test = source.official("train"), source.official("test")
    channels = source.shape[2]
    if len(mean) != channels or len(std) != channels:
        raise ValueError(f"normalization for {len(mean)} channel(s), but {source.name} images have {channels}")
    return ClassifierData(
        train_pixels=input_vectors(train.images), train_labels=train.labels.astype(np.int64),
        test_pixels=input_vectors(test.images), test_labels=test.labels.astype(np.int64),
        image_shape=tuple(source.shape), mean=tuple(float(m) for m in mean), std=tuple(float(s) for s in std),
        pixel_scale=float(source.pixel_scale),
    )


_NORMALIZED: dict[tuple, torch.Tensor] = {}


def normalized(data: ClassifierData, split: str, device="cpu") -> torch.Tensor:
    """float32 ``[N, C*H*W]`` inputs of ``split`` ("train" or "test") on ``device``.

    Kept per process for the latest data set: Ray reuses worker processes across chunks, and the
    conversion of 50,000 CIFAR images takes about a second.
    """
    cache_key = (data.key, split, str(device))
    if cache_key not in _NORMALIZED:
        for key in [k for k in _NORMALIZED if k[0] != data.key]:
            del _NORMALIZED[key]
        pixels = data.train_pixels if split == "train" else data.test_pixels
        h, w, c = data.image_shape
        mean = torch.tensor(data.mean, dtype=torch.float32).repeat_interleave(h * w)
        std = torch.tensor(data.std, dtype=torch.float32).repeat_interleave(h * w)
        values = torch.tensor(pixels, dtype=torch.float32)  # a copy: Ray hands workers read-only arrays
        values.div_(data.pixel_scale).sub_(mean).div_(std)
        _NORMALIZED[cache_key] = values.to(device)
    return _NORMALIZED[cache_key]


@dataclass(frozen=True)
class BatchPlan:
    """One run's batches: ``indices`` ``[T, B]`` into the train images, ``targets`` ``[T, B]`` the
    position of each image's label in the run's classes (-1 pads a shorter batch)."""

    indices: np.ndarray
    targets: np.ndarray
    pass_steps: int  # steps of one pass over the run's pool

    @property
    def steps(self) -> int:
        return len(self.indices)


def pool_size(labels: np.ndarray, classes) -> int:
    """Number of train images of ``classes``: what the number of steps is counted from."""
    return int(np.isin(labels, classes).sum())


def class_pool(labels: np.ndarray, classes) -> np.ndarray:
    """Positions of the train images of ``classes``, in order: a run's training pool."""
    return np.flatnonzero(np.isin(labels, classes))


def batch_plan(run: RunSettings, labels: np.ndarray, schedule: TrainSchedule,
               pool: np.ndarray | None = None) -> BatchPlan:
    """The batches of ``run`` (see the module doc); ``labels`` are the official train labels and
    ``pool`` their :func:`class_pool` for the run's classes, where the caller has it (runs of the
    same classes share it: 5,000 CIFAR-10 runs draw from 45 pairs)."""
    pool = class_pool(labels, run.classes) if pool is None else pool
    if len(pool) == 0:
        raise DataError(f"run {run.run}: no training image of classes {list(run.classes)}")
    steps = schedule.total_steps(len(pool))
    rng = np.random.default_rng([run.seed, DATA_STREAM])
    if run.data_fraction < 1:
        keep = max(1, math.ceil(run.data_fraction * len(pool)))
        pool = pool[np.sort(rng.permutation(len(pool))[:keep])]
    batch = schedule.batch_size
    per_pass = math.ceil(len(pool) / batch)
    passes = []  # each pass over the pool: a fresh permutation cut into batches, the last one short
    for _ in range(math.ceil(steps / per_pass)):
        padded = np.zeros(per_pass * batch, np.int64)
        padded[: len(pool)] = pool[rng.permutation(len(pool))]
        passes.append(padded.reshape(per_pass, batch))
    indices = np.concatenate(passes)[:steps]
    counts = np.full(per_pass, batch, np.int64)
    counts[-1] = len(pool) - (per_pass - 1) * batch
    counts = np.tile(counts, len(passes))[:steps]
    position = np.full(max(int(labels.max()), *run.classes) + 1, -1, np.int64)
    position[list(run.classes)] = np.arange(len(run.classes))
    targets = position[labels[indices]]
    targets[np.arange(batch)[None, :] >= counts[:, None]] = -1
    return BatchPlan(indices, targets, per_pass)
