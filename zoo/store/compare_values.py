"""Whether two zoos hold the same networks, from their decoded values (``zoo compare --values``).

The checksum comparison (:mod:`zoo.store.compare`) matches files, so it cannot pair two stores whose
files are cut differently: another chunk size, a zoo exported to another lab's layout and imported back
(``zoo export`` / ``zoo import``), a store rewritten by another tool. Their content and networks IDs
differ even when every weight is the same, since both hash chunk files. Decoding both stores answers what
their user asks: the same networks or not, parameter by parameter and network by network, bit for bit.
Each chunk of each store is decoded once and compared a window of networks at a time, so memory is
bounded by one chunk of each, not by the stores.

"The same networks" is what a training on either store reads: the architecture as a function (its
provenance keys, such as how the networks were initialized, are reported but not counted: an import
cannot know them), the network count and splits, every parameter, the normalization statistics and the
table's ``index``, ``split`` and target columns. The other columns (fit diagnostics, an import's
``source_file``) are reported, not counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from .identity import column_digests, read_columns
from .reader import WeightStore, _ranges as network_ranges

#: architecture keys that say how the networks were made, not which function they compute
PROVENANCE_KEYS = ("init", "init_ranges", "source_network")
#: networks compared at a time hold about this many bytes a side (the comparison's temporaries)
WINDOW_BYTES = 64 << 20
#: the relative difference of two statistics that is float rounding (float32's epsilon is 1.2e-7)
STATS_ROUNDING = 1e-6


@dataclass
class ValueComparison:
    """What differs between two stores' decoded contents (see the module)."""

    a: str
    b: str
    #: mismatches of what the networks are (architecture, count, splits, targets), each one line
    mismatches: list[str] = field(default_factory=list)
    #: how the networks were made, where it differs: the kind, architecture keys in ``PROVENANCE_KEYS``
    provenance: list[str] = field(default_factory=list)
    networks: int = 0  # networks compared (the smaller count)
    chunk_sizes: tuple[int, int] = (0, 0)
    #: parameter -> indices of the compared networks whose values differ in it
    differing: dict[str, np.ndarray] = field(default_factory=dict)
    #: parameter -> the largest absolute difference of its values
    largest: dict[str, float] = field(default_factory=dict)
    statistics_differ: list[str] = field(default_factory=list)
    #: the largest relative difference of statistics that differ by float rounding only (0: bit for bit)
    statistics_rounding: float = 0.0
    columns_equal: list[str] = field(default_factory=list)
    columns_differ: list[str] = field(default_factory=list)
    columns_only_a: list[str] = field(default_factory=list)
    columns_only_b: list[str] = field(default_factory=list)
    #: the table's columns a training reads (``index``, ``split``, either side's targets)
    training_columns: tuple[str, ...] = ()

    @property
    def training_columns_differ(self) -> list[str]:
        """The training columns that differ or are on one side only."""
        return [c for c in self.columns_differ + self.columns_only_a + self.columns_only_b
                if c in self.training_columns]

    @property
    def same_networks(self) -> bool:
        return not (self.mismatches or self.differing or self.statistics_differ or self.training_columns_differ)

    def summary(self) -> str:
        sizes = (f"chunks of {self.chunk_sizes[0]} and {self.chunk_sizes[1]} networks"
                 if self.chunk_sizes[0] != self.chunk_sizes[1] else f"chunks of {self.chunk_sizes[0]} networks")
        lines = [f"A: {self.a}", f"B: {self.b}", f"compared by value: {self.networks} networks ({sizes})"]
        lines += [f"mismatch    {m}" for m in self.mismatches]
        if self.provenance:
            lines.append(f"provenance  how the networks were made differs (not counted): {', '.join(self.provenance)}")
        if self.differing:
            every = np.unique(np.concatenate(list(self.differing.values())))
            lines.append(f"parameters  {every.size} of {self.networks} networks differ: {network_ranges(every)}")
            lines += [f"{'':<11} {name}: {idx.size} networks, largest difference {self.largest[name]:.3g}"
                      for name, idx in self.differing.items()]
        else:
            lines.append(f"parameters  equal: every value of the {self.networks} networks, bit for bit")
        if self.statistics_differ:
            lines.append(f"statistics  differ: {', '.join(self.statistics_differ)}")
        elif self.statistics_rounding:
            lines.append(f"statistics  equal up to float rounding (relative {self.statistics_rounding:.1e}: "
                         f"summed in another chunk order)")
        else:
            lines.append("statistics  equal, bit for bit")
        table = [f"{len(self.columns_equal)} columns equal"]
        table += [f"{word}: {', '.join(cols)}" for word, cols in (("differ", self.columns_differ),
                                                                  ("only in A", self.columns_only_a),
                                                                  ("only in B", self.columns_only_b)) if cols]
        lines.append("table       " + "; ".join(table))
        read = self.training_columns_differ
        lines.append("the same networks: what training reads (architecture, splits, parameters, statistics, "
                     f"{', '.join(self.training_columns)}) is equal" if self.same_networks else
                     "different networks" + (f" (columns a training reads: {', '.join(read)})" if read else ""))
        return "\n".join(lines)


def compare_values(a, b, progress: bool = False) -> ValueComparison:
    """Decode the complete stores ``a`` and ``b`` (folders or URLs) and compare them (see the module)."""
    sa, sb = WeightStore(a), WeightStore(b)
    ma, mb = sa.manifest, sb.manifest
    found = ValueComparison(str(a), str(b), chunk_sizes=(sa.chunk_size, sb.chunk_size),
                            training_columns=tuple(dict.fromkeys(read_columns(ma) + read_columns(mb))))
    arch_a, arch_b = ma.get("architecture") or {}, mb.get("architecture") or {}
    keys = sorted(k for k in set(arch_a) | set(arch_b) if arch_a.get(k) != arch_b.get(k))
    found.provenance = ([f"kind {ma.get('kind')} vs {mb.get('kind')}"] if ma.get("kind") != mb.get("kind") else []) \
        + [k for k in keys if k in PROVENANCE_KEYS]
    function = [k for k in keys if k not in PROVENANCE_KEYS]
    if function:
        found.mismatches.append(f"architecture differs in {', '.join(function)}")
    if sa.num_networks != sb.num_networks:
        found.mismatches.append(f"network count {sa.num_networks} vs {sb.num_networks} (the first "
                                f"{min(sa.num_networks, sb.num_networks)} are compared)")
    splits = {s: (v["start"], v["count"]) for s, v in ma["splits"].items()}, \
        {s: (v["start"], v["count"]) for s, v in mb["splits"].items()}
    if splits[0] != splits[1]:
        found.mismatches.append(f"splits differ: {_splits(splits[0])} vs {_splits(splits[1])}")
    if (ma.get("targets") or []) != (mb.get("targets") or []):
        found.mismatches.append(f"targets differ: {ma.get('targets')} vs {mb.get('targets')}")
    if dict(ma["parameters"]) != dict(mb["parameters"]):
        found.mismatches.append("parameter shapes differ: "
                                f"{dict(ma['parameters'])} vs {dict(mb['parameters'])}")
        return _with_tables(found, sa, sb)
    found.networks = min(sa.num_networks, sb.num_networks)
    _compare_parameters(found, sa, sb, progress)
    _compare_statistics(found, sa.stats(), sb.stats())
    return _with_tables(found, sa, sb)


def _compare_statistics(found: ValueComparison, stats_a: dict, stats_b: dict) -> None:
    """Bit for bit, else up to ``STATS_ROUNDING``: the statistics are float64 sums over the train networks
    in chunk order, rounded to float32, so the same networks in other chunks give sums in another order,
    a float32 unit in the last place apart (a mean's rounding measured against its entry's spread)."""
    for name, (mean_a, std_a) in stats_a.items():
        mean_b, std_b = stats_b[name]
        for kind, x, y, spread in (("mean", mean_a, mean_b, std_a), ("std", std_a, std_b, 0.0)):
            if _bitwise_equal(x, y):
                continue
            x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
            gap = float((np.abs(x - y) / (np.abs(x) + np.abs(y) + spread + 1e-30)).max()) if x.shape == y.shape \
                else np.inf
            if gap <= STATS_ROUNDING:
                found.statistics_rounding = max(found.statistics_rounding, gap)
            else:
                found.statistics_differ.append(f"{name}_{kind}")


def _compare_parameters(found: ValueComparison, sa: WeightStore, sb: WeightStore, progress: bool) -> None:
    per_network = sum(int(np.prod(shape)) * 4 for shape in sa.manifest["parameters"].values())
    window = max(1, WINDOW_BYTES // per_network)
    sides = _ChunkCache(sa), _ChunkCache(sb)
    differing: dict[str, list[np.ndarray]] = {}
    with tqdm(total=found.networks, desc="comparing networks", unit="net", disable=not progress,
              leave=False) as bar:
        for start, stop in windows(found.networks, (sa.chunk_size, sb.chunk_size), window):
            xa, xb = (side.read(start, stop) for side in sides)
            for name in sa.parameter_names:
                x, y = xa[name].reshape(stop - start, -1), xb[name].reshape(stop - start, -1)
                rows = np.flatnonzero((x.view(np.uint32) != y.view(np.uint32)).any(axis=1))
                if rows.size:
                    differing.setdefault(name, []).append(rows + start)
                    gap = float(np.abs(x[rows].astype(np.float64) - y[rows]).max())
                    found.largest[name] = max(found.largest.get(name, 0.0), gap)
            bar.update(stop - start)
    found.differing = {name: np.concatenate(parts) for name, parts in differing.items()}


def windows(networks: int, chunk_sizes: tuple[int, ...], most: int):
    """``(start, stop)`` spans covering ``0..networks``, each inside one chunk of every side and at most
    ``most`` networks long, in order: every chunk of each side is then decoded once (a crc32c-checked chunk
    is read whole, so a span across chunks would decode them again)."""
    edges = sorted({networks, *(e for size in chunk_sizes for e in range(0, networks, size))})
    for lo, hi in zip(edges, edges[1:]):
        for start in range(lo, hi, most):
            yield start, min(start + most, hi)


class _ChunkCache:
    """One store's chunk being compared, decoded once (``WeightStore.read_chunk``: checksums, NaN)."""

    def __init__(self, store: WeightStore):
        self.store, self.chunk, self.values = store, None, {}

    def read(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Networks ``start..stop - 1``, all inside one chunk."""
        chunk = start // self.store.chunk_size
        if chunk != self.chunk:
            self.chunk, self.values = None, {}  # the last chunk's memory freed before the next is read
            self.values, self.chunk = self.store.read_chunk(chunk), chunk
        first = chunk * self.store.chunk_size
        return {name: values[start - first:stop - first] for name, values in self.values.items()}


def _with_tables(found: ValueComparison, sa: WeightStore, sb: WeightStore) -> ValueComparison:
    """The table's columns by value, as the networks ID takes them (``identity.column_digests``: NaN equal
    to NaN, the Parquet bytes left out)."""
    da, db = (column_digests(s.root, s.manifest) for s in (sa, sb))
    found.columns_equal = [c for c in da if c in db and da[c] == db[c]]
    found.columns_differ = [c for c in da if c in db and da[c] != db[c]]
    found.columns_only_a = [c for c in da if c not in db]
    found.columns_only_b = [c for c in db if c not in da]
    return found


def _bitwise_equal(x: np.ndarray, y: np.ndarray) -> bool:
    x, y = np.ascontiguousarray(x, np.float32), np.ascontiguousarray(y, np.float32)
    return x.shape == y.shape and bool((x.view(np.uint32) == y.view(np.uint32)).all())


def _splits(splits: dict) -> str:
    return ", ".join(f"{s} {start}+{count}" for s, (start, count) in splits.items())
