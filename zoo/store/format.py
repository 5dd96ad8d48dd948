"""Weight-store format v2: names, layout and the errors a reader raises.

A store is a folder or a URL (see ``docs/store-format.md``)::

    manifest.json            format version, architecture, generation config, provenance, chunks,
                             the checksums of the files below that zarr does not check itself
    arrays/                  Zarr v3 group (v1: the store's own folder); one float32 array per
      W1/ b1/ ...            parameter tensor, chunked along N, every chunk with a crc32c checksum
      stats/W1_mean, ...     normalization statistics over the train split ([d_m, ...])
    networks.parquet         one row per network (written when the store is complete)
    fragments/chunk-*.parquet  per-chunk rows, written with each chunk (kept for resuming)
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence, TypeVar

FORMAT_NAME = "weightzoo-store"
FORMAT_VERSION = 2
MANIFEST = "manifest.json"
ARRAYS_GROUP = "arrays"  # v2: the Zarr hierarchy's folder, so that zarr never meets the other files
NETWORKS_TABLE = "networks.parquet"
FRAGMENTS_DIR = "fragments"
STATS_GROUP = "stats"
SPLITS = ("train", "val", "test")

STATUS_IN_PROGRESS = "in_progress"
STATUS_COMPLETE = "complete"
#: ``architecture.family`` of the zoos that are not INRs: this project's classifier zoos, imported plain MLPs
FAMILY_CLASSIFIERS, FAMILY_MLPS = "mlp-classifier", "mlp"


def weight_name(m: int) -> str:
    """Array name of layer ``m``'s weight matrix (1-based, as in the paper)."""
    return f"W{m}"


def bias_name(m: int) -> str:
    return f"b{m}"


def parameter_shapes(widths) -> dict[str, tuple[int, ...]]:
    """Per-network shape of every parameter array, in storage order ``W1, b1, W2, b2, ...``."""
    shapes = {}
    for m, (d_in, d_out) in enumerate(zip(widths[:-1], widths[1:]), start=1):
        shapes[weight_name(m)] = (d_out, d_in)
        shapes[bias_name(m)] = (d_out,)
    return shapes


def values_per_network(manifest: dict) -> int:
    """How many parameter values one network of a store has (its manifest's ``parameters``)."""
    return sum(math.prod(shape) for shape in manifest["parameters"].values())


T = TypeVar("T")


def layers_from_arrays(arrays: Mapping[str, T]) -> tuple[list[T], list[T]]:
    """``{W1, b1, ..., WM, bM}`` -> ``([W1, ..., WM], [b1, ..., bM])``: the one place that reads the
    parameter names. Any values (arrays, ``(mean, std)`` pairs); :class:`StoreError` if the names are
    not exactly those of an M-layer network."""
    num_layers = len(arrays) // 2
    expected = [name for m in range(1, num_layers + 1) for name in (weight_name(m), bias_name(m))]
    if num_layers == 0 or sorted(arrays) != sorted(expected):
        raise StoreError(f"parameters must be named W1, b1, ..., WM, bM; got {sorted(arrays)}")
    return ([arrays[weight_name(m)] for m in range(1, num_layers + 1)],
            [arrays[bias_name(m)] for m in range(1, num_layers + 1)])


def arrays_from_layers(weights: Sequence[T], biases: Sequence[T]) -> dict[str, T]:
    """The inverse of :func:`layers_from_arrays`, in storage order ``W1, b1, W2, b2, ...``."""
    if len(weights) != len(biases) or not weights:
        raise ValueError(f"need one bias per weight matrix, got {len(weights)} weights and {len(biases)} biases")
    arrays = {}
    for m, (w, b) in enumerate(zip(weights, biases), start=1):
        arrays[weight_name(m)], arrays[bias_name(m)] = w, b
    return arrays


def fragment_name(chunk: int) -> str:
    return f"{FRAGMENTS_DIR}/chunk-{chunk:06d}.parquet"


def arrays_path(manifest: dict) -> str:
    """Folder of the Zarr group inside the store: ``arrays`` from v2 on, the store itself in v1
    (where zarr warned about the manifest and the Parquet files beside its arrays)."""
    return manifest.get("arrays", ARRAYS_GROUP) if manifest["format_version"] >= 2 else ""


def array_codecs(manifest: dict) -> dict:
    """``create_array`` arguments for the codecs of a store's arrays: uncompressed float32, plus
    (v2) a crc32c checksum of every chunk through zarr's own codec pipeline. Zarr's only slot for
    bytes-to-bytes codecs is named ``compressors``; the checksum compresses nothing."""
    if manifest["format_version"] < 2:
        return {"compressors": None}
    from zarr.codecs import Crc32cCodec

    return {"compressors": [Crc32cCodec()]}


class StoreError(ValueError):
    """A store cannot be used as it is; the message says why and what to do."""


class StoreVersionError(StoreError):
    """The store was written by a newer format version than this code reads."""


class IncompleteStoreError(StoreError):
    """Some chunks of the store were never written (an interrupted or running generation)."""


class DamagedStoreError(StoreError):
    """A complete store lost or corrupted data after it was written (a chunk file deleted,
    truncated or overwritten): regenerate it or restore it from a copy."""


REPAIR_HINT = (
    "rerun the `zoo generate` command that made it (`zoo verify STORE` prints it), which rewrites exactly "
    "the damaged parts, or restore it from a copy"
)
