"""Per-chunk work every kind shares: the moments of a chunk's train networks for the statistics.

Networks whose row says they did not train normally (``status`` other than ``ok``: a classifier
whose loss turned non-finite) are left out: their parameters may be huge and would swamp the
normalization of every other network.
"""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq

from ..store.format import fragment_name
from ..store.reader import WeightStore
from ..store.stats import Moments


def chunk_moments(root: str, chunk: int, train_stop: int, normal_only: bool = True) -> Moments:
    """Moments of this chunk's train rows (train networks are indices ``0 .. train_stop-1``);
    ``normal_only`` leaves out the rows whose status is not ``ok``."""
    store = WeightStore(root, require_complete=False)
    start, stop = store.chunk_bounds(chunk)
    stop = min(stop, train_stop)
    if stop <= start:
        return Moments.of({n: np.zeros((0, *s)) for n, s in store.manifest["parameters"].items()})
    values = store.read(start, stop)
    rows = pq.read_table(store.root / fragment_name(chunk), columns=None)
    if normal_only and "status" in rows.column_names:
        index = rows.column("index").to_numpy()
        normal = np.asarray(rows.column("status").to_pylist(), dtype=object) == "ok"
        keep = np.sort(index[normal & (index < stop)]) - start
        values = {name: v[keep] for name, v in values.items()}
    return Moments.of(values)
