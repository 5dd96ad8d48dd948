"""One chunk as the task that makes it sees it, and what every kind's chunk task does last.

A task may run on another machine than the driver (a Ray cluster), so it never touches a path of
the driver's machine. Where the store is behind a URL that every machine reaches (``s3://...``,
or ``file://`` on a shared file system), the task writes its chunk there itself; where the store
is a local folder, which may exist only on the driver's machine, it hands the chunk back and the
driver writes it. Whoever writes a chunk computes its train networks' moments (:func:`train_moments`),
from which the driver reduces the statistics without reading the chunk again: where the driver
writes, its background writer does it while the next chunk is made, so the task's thread goes on
making chunks at once. A task that makes several chunks (a job of several,
:mod:`zoo.generate.executors`) finishes each of them on its own, in chunk order, and returns the
list of their results.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..store.stats import TrainMoments, chunk_train_moments, row_status
from ..store.writer import write_chunk


@dataclass(frozen=True)
class ChunkTarget:
    chunk: int
    start: int  # networks start .. stop-1
    stop: int
    train_stop: int  # train networks are those below this index
    layout: dict  # what writing needs of the manifest (zoo.store.writer.chunk_layout)
    url: str | None  # the store, where the task writes itself; None: hand the chunk back


def finish_chunk(target: ChunkTarget, params: dict[str, np.ndarray], rows: pa.Table, **fields) -> dict:
    """The result of a chunk task: ``chunk``, ``networks``, the kind's ``fields``, and either
    ``fragment`` (the written fragment's checksum) and ``moments`` (:func:`train_moments`), or
    ``params`` and ``rows`` for the driver to write (and to take the moments of)."""
    values = {name: np.ascontiguousarray(v, dtype=np.float32) for name, v in params.items()}
    result = {"chunk": target.chunk, "networks": target.stop - target.start, **fields}
    if target.url is not None:
        result["fragment"] = write_chunk(target.url, target.chunk, values, rows, target.layout)
        result["moments"] = train_moments(target.start, target.stop, target.train_stop, values, rows)
    else:
        result["params"], result["rows"] = values, rows
    return result


def train_moments(start: int, stop: int, train_stop: int, values: dict[str, np.ndarray], rows: pa.Table,
                  threads: int = 1) -> TrainMoments | None:
    """The moments of the train networks among a chunk's (``start..stop-1``, train below
    ``train_stop``), from its float32 ``values`` and its ``rows`` (their status); None where it
    holds none. ``threads``: :meth:`zoo.store.stats.Moments.of`."""
    if start >= train_stop:
        return None
    return chunk_train_moments(values, start, train_stop, row_status(rows, start, stop), threads)
