"""A store whose networks are another store's, each mapped by a function of weight spaces: aligned
(``mlp-align``), canonicalized (``zoo derive``) or moved by a group element (the invariance tests).

Rows, splits and chunking are the source's; the new store is complete, with its own statistics,
checksums, content ID and card (:func:`zoo.store.derive.write_store_by_chunk`). One source chunk is
read, mapped and written at a time, so memory stays at a chunk whatever the store's size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from tqdm import tqdm

from dws.weightspace import WeightSpace
from zoo.store import WeightStore
from zoo.store.derive import write_store_by_chunk
from zoo.store.location import UrlRoot

from .batch import arrays_from_weightspace, weightspace_from_arrays


def write_mapped_store(store: WeightStore, out, transform: Callable[[WeightSpace], WeightSpace], *,
                       metadata: dict, overwrite: bool = False, desc: str | None = None) -> Path | UrlRoot:
    """Write ``transform`` of every network of ``store`` to ``out``, chunk by chunk in store order;
    ``metadata``: the new manifest's description of the networks; ``desc``: a progress bar's label
    (None: no bar)."""
    rows = store.networks
    with tqdm(total=store.num_networks, desc=desc, unit="net", disable=None if desc else True, leave=False,
              dynamic_ncols=True) as bar:
        def chunk(lo: int, hi: int):
            part = arrays_from_weightspace(transform(weightspace_from_arrays(store.read(lo, hi))))
            bar.update(hi - lo)
            return part, rows.slice(lo, hi - lo)

        return write_store_by_chunk(out, widths=store.widths, num_networks=store.num_networks, chunk=chunk,
                                    splits=store.manifest["splits"], metadata=metadata,
                                    chunk_size=store.chunk_size, overwrite=overwrite)
