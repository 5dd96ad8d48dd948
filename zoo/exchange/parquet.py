"""Plain Parquet: one row per network, for tools that know nothing of Zarr; and back (``zoo import parquet``).

``OUT/{split}.parquet`` for each non-empty split (the file names Hugging Face ``datasets`` takes as
split names: ``load_dataset("parquet", data_dir=OUT)``; ``pandas.read_parquet(OUT / "train.parquet")``).
A row holds every column of ``networks.parquet`` and one column per parameter array (``W1, b1,
...``), a ``fixed_size_list<float32>`` of the array flattened row-major (``W`` is out x in, as in
the store). The schema's ``weightzoo`` metadata (JSON) gives each array's shape, the architecture
and the store's content ID, so ``np.asarray(row["W1"]).reshape(shape)`` is the network's ``W1``.

Import reads such a folder back into a store (the same networks and columns, new statistics and IDs), one
chunk of rows in memory at a time; the metadata is what makes a folder of Parquet files a zoo, so a
folder without it is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..store.format import FAMILY_MLPS, SPLITS, StoreError, layers_from_arrays, parameter_shapes
from .common import LayoutError, iterate_chunks, progress_bar, require_new_folder, split_counts, staged_folder

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
        "kind": store.manifest.get("kind"),
        "targets": store.manifest.get("targets") or [],
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


def split_files(src) -> dict[str, Path]:
    """``{split: OUT/split.parquet}`` of the splits a folder has (a train split at least)."""
    root = Path(src)
    if not root.is_dir():
        raise LayoutError(f"{root}: no such folder (parquet imports a folder of {{split}}.parquet files, as "
                          f"`zoo export --layout parquet` writes them)")
    files = {s: root / f"{s}.parquet" for s in SPLITS if (root / f"{s}.parquet").is_file()}
    if "train" not in files:
        raise LayoutError(f"{root}: no train.parquet (a store's statistics come from its train split)")
    return files


def exported_metadata(files: dict[str, Path]) -> dict:
    """The ``weightzoo`` metadata every file carries, the same in each (LayoutError otherwise)."""
    found = {}
    for split, path in files.items():
        try:
            raw = (pq.read_schema(path).metadata or {}).get(METADATA_KEY)
        except (pa.ArrowInvalid, OSError) as exc:
            raise LayoutError(f"{path}: not a readable Parquet file ({str(exc).splitlines()[0]})") from None
        if raw is None:
            raise LayoutError(f"{path}: no weightzoo metadata in its schema, so nothing says which columns are "
                              f"parameters of which shape; import reads folders `zoo export --layout parquet` wrote")
        found[split] = json.loads(raw)
    first = next(iter(found.values()))
    other = next((s for s, m in found.items() if m.get("parameters") != first.get("parameters")
                  or m.get("architecture") != first.get("architecture")), None)
    if other is not None:
        raise LayoutError(f"{files[other]}: its parameters or architecture differ from {files['train'].name}'s; "
                          f"a store holds one architecture")
    return first


def widths_of_shapes(shapes: dict[str, tuple[int, ...]], where: Path) -> tuple[int, ...]:
    """An M-layer MLP's widths from its arrays' shapes (``W1 [d1, d0], b1 [d1], ...``), checked."""
    try:
        weights, _ = layers_from_arrays(shapes)
        widths = (int(weights[0][1]), *(int(w[0]) for w in weights))
    except (StoreError, IndexError, TypeError, ValueError):
        widths = None
    if widths is None or parameter_shapes(widths) != shapes:
        raise LayoutError(f"{where}: parameters {shapes} are not an MLP's W1, b1, ..., WM, bM")
    return widths


def read_parameters(files: dict[str, Path], shapes: dict, batch: int):
    """Every network's parameters in order (train, val, test), ``batch`` rows at a time:
    ``{name: [n, ...] float32}``."""
    for path in files.values():
        for block in pq.ParquetFile(path).iter_batches(batch_size=batch, columns=list(shapes)):
            out = {}
            for name, shape in shapes.items():
                column = block.column(name)
                size = int(np.prod(shape))
                if column.null_count or not pa.types.is_fixed_size_list(column.type) or column.type.list_size != size:
                    raise LayoutError(f"{path}: column {name} is not {size} floats in every row ({column.type}, "
                                      f"{column.null_count} empty)")
                out[name] = column.flatten().to_numpy(zero_copy_only=False).astype(np.float32).reshape(
                    len(column), *shape)
            yield out


def import_store(src, out, *, chunk_size: int = 1024, overwrite: bool = False, dataset: str | None = None,
                 command: list[str] | None = None, progress: bool | None = None) -> Path:
    """The store of a folder ``src`` that :func:`export` wrote, at ``out`` (whole or not at all)."""
    from ..store.derive import write_store_by_chunk

    require_new_folder(out, overwrite)
    files = split_files(src)
    metadata = exported_metadata(files)
    shapes = {name: tuple(shape) for name, shape in (metadata.get("parameters") or {}).items()}
    widths = widths_of_shapes(shapes, files["train"])
    parts = []
    for split, path in files.items():
        names = [c for c in pq.read_schema(path).names if c not in shapes and c != "index"]
        part = pq.read_table(path, columns=names)
        if "split" in part.column_names and set(part.column("split").to_pylist()) - {split}:
            raise LayoutError(f"{path}: rows of another split than {split!r} in it")
        parts.append(part.drop_columns(["split"]) if "split" in part.column_names else part)
    split_of = [s for s, part in zip(files, parts) for _ in range(part.num_rows)]
    splits = split_counts(split_of, Path(src))
    rows = pa.concat_tables(parts, promote_options="permissive")
    rows = rows.add_column(0, "split", pa.array(split_of, pa.string()))
    rows = rows.add_column(0, "index", pa.array(np.arange(rows.num_rows), pa.int64()))
    kind = metadata.get("kind")
    described = {
        "kind": "imported-parquet",
        "description": f"networks imported from a weightzoo Parquet export ({Path(src).name})"
                       + (f" of a {kind} store" if kind else ""),
        "architecture": metadata.get("architecture") or {"family": FAMILY_MLPS, "widths": list(widths)},
        "targets": [t for t in metadata.get("targets", ["label"]) if t in rows.column_names],  # older exports: label
        "generation": {**({"dataset": dataset} if dataset else {}),
                       "import": {"layout": LAYOUT, "path": str(Path(src))}},
        "source": {"kind": LAYOUT, "path": str(Path(src)), "exported_content_id": metadata.get("content_id")},
        **({"command": command} if command else {}),
    }
    blocks = read_parameters(files, shapes, chunk_size)
    held: dict[str, np.ndarray] = {}
    bar = progress_bar(rows.num_rows, f"import {LAYOUT}", progress)

    def chunk(lo: int, hi: int):  # called in order; the blocks are read as far as needed
        nonlocal held
        while not held or len(next(iter(held.values()))) < hi - lo:
            block = next(blocks)
            held = block if not held else {k: np.concatenate([held[k], block[k]]) for k in held}
        taken = {k: v[:hi - lo] for k, v in held.items()}
        held = {k: v[hi - lo:] for k, v in held.items()}
        bar.update(hi - lo)
        return taken, rows.slice(lo, hi - lo)

    try:
        with staged_folder(out, overwrite=overwrite, flag="--out") as stage:
            write_store_by_chunk(stage, widths=widths, num_networks=rows.num_rows, chunk=chunk, splits=splits,
                                 metadata=described, chunk_size=chunk_size)
    finally:
        bar.close()
    return Path(out)
