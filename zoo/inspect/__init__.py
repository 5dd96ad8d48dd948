"""Human-facing views of a store: the ``zoo info`` summary and the ``zoo show`` picture, by zoo family
(INR zoos in :mod:`zoo.inspect.inrs`, classifier zoos in :mod:`zoo.inspect.classifiers`, imported plain MLPs
in :mod:`zoo.inspect.mlps`; a store still being generated in :mod:`zoo.inspect.progress`)."""

from __future__ import annotations

from pathlib import Path

from ..options import require_writable_file
from ..store import WeightStore
from ..store.format import STATUS_COMPLETE
from ..store.manifest import imported_from, read_manifest
from . import classifiers, inrs, mlps
from .inrs import coordinates, decode, spec_of  # noqa: F401  (INR helpers used by tests and pipelines)
from .progress import progress_summary

MAX_SHOWN = 100  # networks (INR zoos) or runs (trajectories) one figure draws
DEFAULT_SHOWN = 8


def family_of(store: WeightStore):
    """The module that views ``store``'s family of zoos: an imported classifier zoo (``zoo import parquet``
    of one) has no training record, so it is viewed as plain MLPs."""
    if classifiers.is_classifier_store(store):
        return mlps if imported_from(store.manifest) else classifiers
    return mlps if mlps.is_mlp_store(store) else inrs


def summary(store: WeightStore) -> str:
    return family_of(store).summary(store)


def describe(root) -> str:
    """``zoo info``: the summary of a finished store, or how far an unfinished one got. ``complete``
    says every chunk was written; whether its bytes are still those written is ``zoo verify``'s
    to say (a full read), hence the last line."""
    if read_manifest(root).get("status") != STATUS_COMPLETE:
        return progress_summary(WeightStore(root, require_complete=False))
    return (summary(WeightStore(root)) + f"\nintegrity  not checked here (info reads the manifest and the table); "
            f"`zoo verify {root}` reads every chunk against its checksum")


def check_figure_path(out) -> Path:
    """ValueError for a figure path that cannot be written: a missing or read-only folder, a folder
    given as the file, an unknown format (before the store is read)."""
    from matplotlib.figure import Figure

    out = Path(out)
    require_writable_file("--out", out)
    formats = Figure().canvas.get_supported_filetypes()
    if out.suffix.lstrip(".").lower() not in formats:
        raise ValueError(f"--out {out}: give the file one of the extensions {', '.join(sorted(formats))}")
    return out


def show(store: WeightStore, out: Path, count: int | None = None, data_root: str | None = None, log=print) -> Path:
    """Draw ``count`` networks (INR zoos) or runs (trajectory zoos) into ``out``; say what was
    changed from the request (``log``). ValueError, before drawing anything, for a count outside
    1 .. :data:`MAX_SHOWN` or an ``out`` that cannot be written."""
    if count is not None and not 1 <= count <= MAX_SHOWN:
        raise ValueError(f"--count must be between 1 and {MAX_SHOWN} (one figure), got {count}")
    if family_of(store) is mlps:
        mlps.refuse_show(store)
    out = check_figure_path(out)
    if classifiers.is_classifier_store(store):
        return classifiers.show(store, out, count, log)
    return inrs.show(store, out, DEFAULT_SHOWN if count is None else count, data_root, log)
