"""One chunk as the task that makes it sees it, and what every kind's chunk task does last.

A task may run on another machine than the driver (a Ray cluster), so it never touches a path of
the driver's machine. Where the store is behind a URL that every machine reaches (``s3://...``,
or ``file://`` on a shared file system), the task writes its chunk there itself; where the store
is a local folder, which may exist only on the driver's machine, it hands the chunk back and the
driver writes it. Either way the task returns its train networks' moments, from which the driver
reduces the statistics without reading the chunk again. A task that makes several chunks (a job of
several, :mod:`zoo.generate.executors`) finishes each of them on its own, in chunk order, and returns
the list of their results.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..store.stats import chunk_train_moments, row_status
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
    """The result of a chunk task: ``chunk``, ``networks``, ``moments``, the kind's ``fields``, and
    either ``fragment`` (the written fragment's checksum) or ``params`` and ``rows`` to write."""
    values = {name: np.ascontiguousarray(v, dtype=np.float32) for name, v in params.items()}
    result = {"chunk": target.chunk, "networks": target.stop - target.start, **fields,
              "moments": (chunk_train_moments(values, target.start, target.train_stop,
                                              row_status(rows, target.start, target.stop))
                          if target.start < target.train_stop else None)}
    if target.url is not None:
        result["fragment"] = write_chunk(target.url, target.chunk, values, rows, target.layout)
    else:
        result["params"], result["rows"] = values, rows
    return result
