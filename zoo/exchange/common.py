"""What every layout shares: untrusted ``.pth`` files read safely, state dicts <-> layers, an import
written as a store chunk by chunk, and an output folder that appears whole or not at all.

A layout module describes its source as a :class:`SourceZoo` (the files in store order, their rows,
splits and architecture); :func:`write_imported_store` does the rest. Exports write their files
into :func:`staged_folder`.
"""

from __future__ import annotations

import os
import pickle
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from ..store import staging
from ..store.format import SPLITS, arrays_from_layers, layers_from_arrays


class LayoutError(ValueError):
    """A source (or an export target) is not what its layout says; the message names the file."""


# --------------------------------------------------------------------------- state dicts
def load_state_dict(path: Path) -> dict:
    """A ``.pth`` file's state dict, read as untrusted data: ``torch.load(weights_only=True)``
    rebuilds tensors and plain containers only, so a pickle that would run code is refused before
    any of it runs."""
    import torch

    if not path.is_file():
        raise LayoutError(f"{path}: no such file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, TypeError, AttributeError,
            ImportError, IndexError, KeyError, OSError) as exc:  # what a damaged or hostile file raises
        raise LayoutError(f"{path}: refused, not a plain tensor state dict (torch.load with weights_only=True: "
                          f"{_load_failure(exc)})") from None
    if not isinstance(state, dict):
        raise LayoutError(f"{path}: holds a {type(state).__name__}, not a state dict")
    return state


def _load_failure(exc: BaseException) -> str:
    """The line of torch.load's (multi-line) error that says what it refused."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    if "Unpickler error:" in text:  # what follows names the global or opcode it refused
        text = text.split("Unpickler error:", 1)[1]
    return next((line.strip().split(". ")[0] for line in text.splitlines() if line.strip()), type(exc).__name__)


def layers_of(state: dict, keys: list[str], path: Path) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``keys`` (weight, bias, weight, bias, ... in that order) of ``state`` as float32 per-layer
    lists, checked to be an MLP: 2-D weights ``[d_out, d_in]``, 1-D biases ``[d_out]``, each layer's
    input the previous layer's output."""
    import torch

    if not keys or len(keys) % 2:
        raise LayoutError(f"{path}: expected weight and bias pairs, got keys {keys}")
    weights, biases = [], []
    for w_key, b_key in zip(keys[::2], keys[1::2]):
        w, b = state.get(w_key), state.get(b_key)
        if not isinstance(w, torch.Tensor) or not isinstance(b, torch.Tensor):
            raise LayoutError(f"{path}: {w_key!r} and {b_key!r} must be tensors (a weight and its bias)")
        if not (w.is_floating_point() and b.is_floating_point()):
            raise LayoutError(f"{path}: {w_key} is {w.dtype}, {b_key} is {b.dtype}; expected floating point")
        if w.dim() != 2 or b.dim() != 1 or b.shape[0] != w.shape[0]:
            raise LayoutError(f"{path}: {w_key} {tuple(w.shape)} and {b_key} {tuple(b.shape)} are not a layer's "
                              f"weight [out, in] and bias [out]")
        if weights and w.shape[1] != weights[-1].shape[0]:
            raise LayoutError(f"{path}: {w_key} takes {w.shape[1]} inputs but the layer before gives "
                              f"{weights[-1].shape[0]}")
        weights.append(w.detach().to(torch.float32).numpy())
        biases.append(b.detach().to(torch.float32).numpy())
        if not (np.isfinite(weights[-1]).all() and np.isfinite(biases[-1]).all()):
            raise LayoutError(f"{path}: {w_key} or {b_key} holds NaN or inf (or a value beyond float32)")
    return weights, biases


def widths_of(weights: list[np.ndarray]) -> tuple[int, ...]:
    return (weights[0].shape[1], *(w.shape[0] for w in weights))


def save_state_dict(path: Path, keys: list[str], weights, biases) -> None:
    """``torch.save`` of ``{keys[0]: W1, keys[1]: b1, ...}`` (float32 tensors), as the projects save theirs."""
    import torch

    values = [v for pair in zip(weights, biases) for v in pair]
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(OrderedDict((k, torch.from_numpy(np.array(v, dtype=np.float32))) for k, v in zip(keys, values)), path)


def sequential_keys(names: Callable[[int, int], tuple[str, str]], num_layers: int) -> list[str]:
    """``[weight, bias, ...]`` key names of layers ``0..num_layers-1`` (``names(layer, num_layers)``)."""
    return [key for m in range(num_layers) for key in names(m, num_layers)]


def progress_bar(total: int, desc: str, progress: bool | None) -> tqdm:
    """A bar over ``total`` networks on stderr; ``progress`` None: only where stderr is a terminal."""
    return tqdm(total=total, unit="net", desc=desc, disable=None if progress is None else not progress,
                dynamic_ncols=True)


# --------------------------------------------------------------------------- import
@dataclass
class SourceZoo:
    """A published zoo as a layout module reads it: everything but the parameters, which are read
    file by file while the store is written."""

    layout: str
    path: Path  # what was imported (a splits file, a folder), for messages and the manifest
    files: list[Path]  # one per network, in store order (train, then val, then test)
    rows: pa.Table  # one row per file, without ``index`` (``split``, ``source_file``, labels, ...)
    keys: Callable[[dict, Path], list[str]]  # the parameter keys of a state dict, in layer order
    describe: Callable[[tuple[int, ...]], dict]  # widths -> manifest ``architecture`` and ``source``
    description: str
    targets: list[str] = field(default_factory=list)
    to_store: Callable[[list, list], tuple[list, list]] | None = None  # the layout's convention -> ours


def split_counts(splits: list[str], where: Path) -> dict[str, dict]:
    """Store ``splits`` (contiguous, train/val/test order) from per-network split names in order."""
    unknown = sorted(set(splits) - set(SPLITS))
    if unknown:
        raise LayoutError(f"{where}: unknown split {unknown[0]!r}; expected {', '.join(SPLITS)}")
    counts = {s: splits.count(s) for s in SPLITS}
    if not counts["train"]:
        raise LayoutError(f"{where}: no train networks (a store's statistics come from its train split)")
    order = sorted(range(len(splits)), key=lambda i: SPLITS.index(splits[i]))
    if order != list(range(len(splits))):
        raise LayoutError(f"{where}: networks must come in train, val, test order")  # callers sort first
    start, result = 0, {}
    for s in SPLITS:
        result[s] = {"start": start, "count": counts[s], "items": counts[s]}
        start += counts[s]
    return result


def write_imported_store(zoo: SourceZoo, out, *, chunk_size: int = 1024, overwrite: bool = False,
                         dataset: str | None = None, command: list[str] | None = None,
                         progress: bool | None = None) -> Path:
    """Write ``zoo`` as a complete store at ``out`` (a local folder): the first file fixes the
    architecture, every other must match it; nothing is left at ``out`` if any file is refused.
    ``command``: the ``zoo import`` line that remakes it (the manifest's ``command``)."""
    from ..store.derive import write_store_by_chunk

    require_new_folder(out, overwrite)
    if not zoo.files:
        raise LayoutError(f"{zoo.path}: no networks found")
    missing = next((f for f in zoo.files if not f.is_file()), None)  # cheap, before any writing
    if missing is not None:
        raise LayoutError(f"{missing}: no such file (listed by {zoo.path})")
    first = zoo.files[0]
    first_state = load_state_dict(first)
    keys = zoo.keys(first_state, first)
    weights, _ = layers_of(first_state, keys, first)
    widths = widths_of(weights)
    shapes = {k: tuple(first_state[k].shape) for k in keys}  # checked by layers_of above
    splits = split_counts(zoo.rows.column("split").to_pylist(), zoo.path)
    rows = zoo.rows.add_column(0, "index", pa.array(np.arange(len(zoo.files)), pa.int64()))
    described = zoo.describe(widths)
    metadata = {
        "kind": f"imported-{zoo.layout}",
        "description": zoo.description,
        "architecture": described["architecture"],
        "targets": zoo.targets,
        "generation": {**({"dataset": dataset} if dataset else {}),
                       "import": {"layout": zoo.layout, "path": str(zoo.path)}},
        "source": {**described["source"], "layout": zoo.layout, "path": str(zoo.path), "state_dict_keys": keys,
                   "state_dict_shapes": {k: list(v) for k, v in shapes.items()}},
        **({"command": command} if command else {}),
    }
    bar = progress_bar(len(zoo.files), f"import {zoo.layout}", progress)

    def chunk(lo: int, hi: int):
        layers = []
        for path in zoo.files[lo:hi]:
            state = load_state_dict(path)
            found = zoo.keys(state, path)
            w, b = layers_of(state, found, path)
            found_shapes = {k: v.shape for k, v in zip(found, [v for pair in zip(w, b) for v in pair])}
            if found_shapes != shapes:
                raise LayoutError(f"{path}: its parameters {found_shapes} differ from those of {first} ({shapes}); "
                                  f"a store holds one architecture")
            layers.append(zoo.to_store(w, b) if zoo.to_store else (w, b))
            bar.update()
        stacked = arrays_from_layers([np.stack([w[m] for w, _ in layers]) for m in range(len(widths) - 1)],
                                     [np.stack([b[m] for _, b in layers]) for m in range(len(widths) - 1)])
        return stacked, rows.slice(lo, hi - lo)

    try:
        with staged_folder(out, overwrite=overwrite, flag="--out") as stage:
            write_store_by_chunk(stage, widths=widths, num_networks=len(zoo.files), chunk=chunk, splits=splits,
                                 metadata=metadata, chunk_size=chunk_size)
    finally:
        bar.close()
    return Path(out)


# --------------------------------------------------------------------------- export
def store_layers(params: dict[str, np.ndarray], i: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Network ``i`` of a chunk's ``{W1: [n, ...], ...}`` as per-layer lists."""
    weights, biases = layers_from_arrays(params)
    return [w[i] for w in weights], [b[i] for b in biases]


def iterate_chunks(store, desc: str, progress: bool | None = None) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """``(first index, parameters)`` of each chunk of ``store`` in order, one chunk in memory at a
    time, with a progress bar over the networks."""
    with progress_bar(store.num_networks, desc, progress) as bar:
        for c in range(store.num_chunks):
            lo, hi = store.chunk_bounds(c)
            yield lo, store.read_chunk(c)
            bar.update(hi - lo)


def relative_path(file: Path, folder: Path) -> str:
    """``file`` relative to ``folder`` (``..`` where it lies outside), with ``/``: a network's
    ``source_file``. Symbolic links in the folders are resolved, so an absolute path written on
    export reads back as the same relative one."""
    parent = os.path.realpath(file.parent)
    return Path(os.path.relpath(os.path.join(parent, file.name), os.path.realpath(folder))).as_posix()


def safe_relative(path: str | None) -> str | None:
    """``path`` if it names a file inside a folder (relative, no ``..``), else None."""
    if not path:
        return None
    p = Path(path)
    return path if not p.is_absolute() and ".." not in p.parts and p.parts else None


def require_new_folder(out, overwrite: bool = False, flag: str = "--out") -> None:
    """LayoutError unless ``out`` is a local folder that is empty, absent (and can be made), or
    ``overwrite`` is given: checked before any work."""
    from ..options import require_writable_folder

    if "://" in str(out):
        raise LayoutError(f"{flag} {out}: import and export write a local folder; copy it to the URL afterwards")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise LayoutError(f"{flag} {out} is a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise LayoutError(f"{flag} {out} exists and is not empty; choose a new folder or pass --overwrite")
    require_writable_folder(flag, out)


def staged_folder(out, *, overwrite: bool = False, flag: str = "--out"):
    """:func:`zoo.store.staging.staged_folder` after refusing a non-empty ``out`` unless ``overwrite``."""
    require_new_folder(out, overwrite, flag)
    return staging.staged_folder(out)


def exported_names(store, layout: str, default: Callable[[int], str]) -> list[str]:
    """Each network's file name inside the export: its ``source_file`` where the store was imported
    from this same layout (so export -> import gives the same rows back), else ``default(index)``."""
    names = [default(i) for i in range(store.num_networks)]
    table = store.networks
    if store.manifest.get("source", {}).get("layout") == layout and "source_file" in table.column_names:
        recorded = [safe_relative(p) for p in table.column("source_file").to_pylist()]
        if all(recorded) and len(set(recorded)) == len(recorded):
            names = recorded
    return names


def exported_keys(store, layout: str, default: list[str]) -> list[str]:
    """The state-dict keys to write: those the source had where the store came from this layout."""
    source = store.manifest.get("source", {})
    recorded = source.get("state_dict_keys")
    return list(recorded) if source.get("layout") == layout and recorded and len(recorded) == len(default) else default


def siren_output_shift(store, layout: str, w0: float, offset: float) -> float:
    """What to add to the last bias so that the layout's network (``sin(w0 * (W x + b))`` hidden
    layers, a linear output ``+ offset``) computes the store's function; refuses stores it cannot
    express exactly (not SIRENs, another ``w0``)."""
    arch = store.manifest.get("architecture") or {}
    if arch.get("activation") != "sine" or "w0_per_layer" not in arch:
        raise LayoutError(f"{store.root}: the {layout} layout holds SIRENs; this store's networks are "
                          f"{arch.get('family') or arch.get('activation') or 'not SIRENs'}")
    hidden = arch["w0_per_layer"][:-1]
    if any(v != w0 for v in hidden):
        raise LayoutError(f"{store.root}: {layout}'s SIREN uses w0 = {w0:g} in every sine layer; this store's "
                          f"are {hidden}")
    return float(arch.get("output_offset", 0.0)) - offset


def labels_of(store, layout: str) -> list[int]:
    table = store.networks
    if "label" not in table.column_names:
        raise LayoutError(f"{store.root}: the {layout} layout needs a label per network; the store has no label column")
    return [int(v) for v in table.column("label").to_pylist()]


def export_state_dicts(store, out, *, layout: str, names: list[str], keys: list[str], output_shift: float = 0.0,
                       to_layout: Callable[[list, list], tuple[list, list]] | None = None,
                       index_files: Callable[[Path], None], overwrite: bool = False,
                       progress: bool | None = None) -> Path:
    """One ``.pth`` per network at ``names[index]`` (``keys``: weight, bias, ... per layer), then the
    layout's index files (``index_files(folder)``), all in a staged folder: ``out`` appears whole."""
    with staged_folder(out, overwrite=overwrite) as stage:
        for lo, params in iterate_chunks(store, f"export {layout}", progress):
            for i in range(next(iter(params.values())).shape[0]):
                weights, biases = store_layers(params, i)
                if output_shift:
                    biases[-1] = biases[-1] + np.float32(output_shift)
                if to_layout is not None:
                    weights, biases = to_layout(weights, biases)
                save_state_dict(stage / names[lo + i], keys, weights, biases)
        index_files(stage)
    return Path(out)
