"""The weight store: Zarr v3 arrays + Parquet rows + normalization statistics + a manifest."""

from .format import (
    FORMAT_VERSION,
    IncompleteStoreError,
    StoreError,
    StoreVersionError,
    parameter_shapes,
)
from .reader import WeightStore

__all__ = [
    "FORMAT_VERSION",
    "IncompleteStoreError",
    "StoreError",
    "StoreVersionError",
    "WeightStore",
    "parameter_shapes",
]
