"""The weight store: Zarr v3 arrays + Parquet rows + normalization statistics + a manifest."""

from .format import (
    FORMAT_VERSION,
    DamagedStoreError,
    IncompleteStoreError,
    StoreError,
    StoreVersionError,
    parameter_shapes,
)
from .reader import WeightStore
from .verify import verify_store
from .writer import rebuild_networks_table

__all__ = [
    "DamagedStoreError",
    "FORMAT_VERSION",
    "IncompleteStoreError",
    "StoreError",
    "StoreVersionError",
    "WeightStore",
    "parameter_shapes",
    "rebuild_networks_table",
    "verify_store",
]
