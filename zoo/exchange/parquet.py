"""Export to plain Parquet: one row per network, for tools that know nothing of Zarr.

``OUT/{split}.parquet`` for each non-empty split (the file names Hugging Face ``datasets`` takes as
split names: ``load_dataset("parquet", data_dir=OUT)``; ``pandas.read_parquet(OUT / "train.parquet")``).
A row holds every column of ``networks.parquet`` and one column per parameter array (``W1, b1,
...``), a ``fixed_size_list<float32>`` of the array flattened row-major (``W`` is out x in, as in
the store). The schema's ``weightzoo`` metadata (JSON) gives each array's shape, the architecture
and the store's content ID, so ``np.asarray(row["W1"]).reshape(shape)`` is the network's ``W1``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .common import iterate_chunks, staged_folder

LAYOUT = "parquet"
METADATA_KEY = b"weightzoo"


def parameter_column(values: np.ndarray) -> pa.FixedSizeListArray:
    """``[n, ...]`` float32 -> n fixed-size lists of the flattened values (no copy of the data)."""
    flat = np.ascontiguousarray(values, dtype=np.float32).reshape(len(values), -1)
    return pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), flat.shape[1])


def export(store, out, *, overwrite: bool = False, progress: bool | None = None) -> Path:
    """Write ``store`` as ``{split}.parquet`` files, one row group per store chunk (one chunk in memory)."""
    rows = store.networks
    split_of = rows.column("split").to_pylist()
    metadata = {METADATA_KEY: json.dumps({
        "parameters": store.manifest["parameters"],
        "flattening": "row-major (C order) per network; W is out x in",
        "architecture": store.manifest.get("architecture"),
        "content_id": store.manifest.get("content_id"),
    }).encode()}
    with staged_folder(out, overwrite=overwrite) as stage:
        writers: dict[str, pq.ParquetWriter] = {}
        try:
            for lo, params in iterate_chunks(store, f"export {LAYOUT}", progress):
                n = next(iter(params.values())).shape[0]
                chunk = rows.slice(lo, n)
                for name, values in params.items():
                    chunk = chunk.append_column(name, parameter_column(values))
                for split in dict.fromkeys(split_of[lo:lo + n]):  # the splits in this chunk, in order
                    first = split_of.index(split, lo)
                    count = split_of[lo:lo + n].count(split)  # splits are contiguous
                    part = chunk.slice(first - lo, count)
                    if split not in writers:
                        writers[split] = pq.ParquetWriter(stage / f"{split}.parquet",
                                                          part.schema.with_metadata(metadata))
                    writers[split].write_table(part.replace_schema_metadata(metadata))
        finally:
            for writer in writers.values():
                writer.close()
    return Path(out)
