"""Which network gets which index: the fixed order every worker and every rerun agrees on.

Networks are laid out split by split (train, val, test), item by item within a split, and view by
view within an item. ``--limit`` keeps a subset of each split (:func:`limited_counts`: ``N`` in the
proportions of the kind's paper zoo, so that a small zoo still has a validation split worth
selecting on; ``split=k,...`` exactly the splits named), chosen by a fixed permutation
(:func:`subset`) so that a subset of a file sorted by class stays balanced.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..sources import SPLITS, Source
from ..sources.images import ImageSplit


@dataclass
class Plan:
    columns: dict[str, np.ndarray]  # per-network rows known before fitting
    targets: torch.Tensor  # [num_items, P, d_out], one entry per distinct source item
    item_row: np.ndarray  # [N] network -> row of ``targets``
    splits: dict[str, dict]  # split -> {"start", "count", "items"}
    peak: np.ndarray  # [N] peak value for PSNR (1 for images, peak-to-peak for signals)

    @property
    def num_networks(self) -> int:
        return len(self.item_row)


def limited_counts(sizes: dict[str, int], limit: int | dict[str, int] | None,
                   proportions: dict[str, int] | None = None) -> dict[str, int]:
    """How many of each split's ``sizes`` items ``--limit`` keeps.

    ``N``: N items in all, in ``proportions`` (the kind's paper zoo; default: the sizes themselves):
    each split keeps ``floor(N * its share)`` and at least one, the largest split the remainder; a
    split with fewer items than its share keeps all of them and the others share the rest.
    ``{split: k}``: at most k items of each split named, none of the splits not named.
    """
    if isinstance(limit, dict):
        unknown = set(limit) - set(sizes)
        if unknown:
            raise ValueError(f"--limit names unknown split(s) {sorted(unknown)}; splits are {list(sizes)}")
        return {s: min(n, limit.get(s, 0)) for s, n in sizes.items()}
    if limit is None or limit >= sum(sizes.values()):
        return dict(sizes)
    open_ = [s for s, n in sizes.items() if n]
    if limit < len(open_):
        raise ValueError(f"--limit {limit} is smaller than the number of splits")
    weight = {s: (proportions or sizes)[s] for s in open_}
    counts, left = {s: 0 for s in sizes}, limit
    while True:
        share = {s: left * weight[s] / sum(weight[t] for t in open_) for s in open_}
        full = [s for s in open_ if share[s] >= sizes[s]]
        if not full:
            break
        for s in full:  # keeps everything; the others share what is left
            counts[s], left = sizes[s], left - sizes[s]
            open_.remove(s)
    for s in open_:
        counts[s] = max(1, int(share[s]))
    for s in sorted(open_, key=weight.get, reverse=True):  # the remainder, largest split first
        counts[s] += min(limit - sum(counts.values()), sizes[s] - counts[s])
    return counts


LIMIT_RULE = ("per split: sorted(numpy.random.default_rng(0).permutation(n)[:k]) for k of the split's n items "
              "(all items when not limited); --limit N: k = max(1, floor(N * the split's share of the kind's paper "
              "zoo)), the largest split taking the remainder, a split with fewer items than its share keeping all "
              "of them and the others sharing the rest; --limit split=k,...: k of each split named, none of the "
              "others")


def subset(n: int, k: int) -> np.ndarray:
    """Positions of the ``k`` items kept out of ``n`` (see :data:`LIMIT_RULE`)."""
    if k >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(0).permutation(n)[:k])


def build_plan(source: Source, limit: int | dict[str, int] | None = None, views: int = 1,
               proportions: dict[str, int] | None = None) -> Plan:
    """The networks of a zoo of ``source``: ``limit`` and ``proportions`` as in :func:`limited_counts`."""
    if views < 1:
        raise ValueError("--views must be at least 1")
    data = {s: source.split(s) for s in SPLITS}
    counts = limited_counts({s: len(d) for s, d in data.items()}, limit, proportions)
    cols: dict[str, list] = {k: [] for k in ("split", "source_item", "view", "label", "amplitude", "frequency")}
    targets, splits, start, item_base = [], {}, 0, 0
    for split in SPLITS:
        d, n = data[split], counts[split]
        keep = subset(len(d), n)
        targets.append(source.targets(split)[torch.from_numpy(keep)])
        is_image = isinstance(d, ImageSplit)
        for i in keep:
            for v in range(views):
                cols["split"].append(split)
                cols["source_item"].append(int(d.item_ids[i]))
                cols["view"].append(v)
                cols["label"].append(int(d.labels[i]) if is_image else -1)
                cols["amplitude"].append(np.nan if is_image else float(d.amplitude[i]))
                cols["frequency"].append(np.nan if is_image else float(d.frequency[i]))
        splits[split] = {"start": start, "count": n * views, "items": n}
        start += n * views
        item_base += n
    targets_all = torch.cat(targets, dim=0)
    item_row = np.repeat(np.arange(item_base), views)
    if isinstance(data["train"], ImageSplit):
        peak = np.ones(len(item_row), np.float32)
    else:
        flat = targets_all.reshape(targets_all.shape[0], -1)
        peak = (flat.amax(1) - flat.amin(1)).clamp_min(1e-6).numpy()[item_row]
    columns = {
        "index": np.arange(len(item_row), dtype=np.int64),
        "split": np.array(cols["split"], dtype=object),
        "source_item": np.array(cols["source_item"], dtype=np.int64),
        "view": np.array(cols["view"], dtype=np.int32),
        "label": np.array(cols["label"], dtype=np.int64),
        "amplitude": np.array(cols["amplitude"], dtype=np.float32),
        "frequency": np.array(cols["frequency"], dtype=np.float32),
    }
    return Plan(columns, targets_all, item_row, splits, peak.astype(np.float32))
