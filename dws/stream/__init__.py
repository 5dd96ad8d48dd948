"""Streaming weight stores into training: batches, normalization and augmentations.

See ``docs/stream.md``.
"""

from .augment import (
    Compose,
    GaussianNoise,
    RandomPermutation,
    RandomRotation,
    RandomScale,
    RandomTranslation,
    WeightDropout,
    inr_augmentation,
    rotate_inr,
    rotation_matrix,
    scale_inr,
    translate_inr,
    warp_inputs,
)
from .batch import Batch
from .loader import WeightStoreLoader
from .normalize import Normalizer, denormalize
from .rows import describe_excluded, excluded, usable_mask
from .targets import read_targets

__all__ = [
    "Batch",
    "WeightStoreLoader",
    "Normalizer",
    "denormalize",
    "read_targets",
    "usable_mask",
    "excluded",
    "describe_excluded",
    "Compose",
    "GaussianNoise",
    "WeightDropout",
    "RandomRotation",
    "RandomTranslation",
    "RandomScale",
    "RandomPermutation",
    "inr_augmentation",
    "warp_inputs",
    "rotation_matrix",
    "rotate_inr",
    "translate_inr",
    "scale_inr",
]
