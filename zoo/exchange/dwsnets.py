"""The layout of AvivNavon/DWSNets' INR zoos: one ``.pth`` state dict per INR and a splits JSON.

What their code reads (``experiments/data.py`` ``INRDataset``; the JSON from
``experiments/mnist/generate_data_splits.py``; the network from ``nn/inr.py``), see
docs/store-format.md "Import and export":

* the JSON: ``{"train": {"path": [...], "label": [...]}, "val": {...}, "test": {...}}``, labels
  written as strings (``"2"``) and read with ``int``; paths absolute;
* a state dict ``seq.0.weight, seq.0.bias, ..., seq.{L-1}.bias`` (``INR.seq``, an ``nn.Sequential``
  of ``Siren`` layers and a final ``nn.Linear``); the loader takes the keys containing ``weight``
  and those containing ``bias``, each in file order;
* the network: ``sin(30 * (W x + b))`` in every sine layer (the first too), a linear last layer, then
  ``+ 0.5``; its input is ``(x, y)`` (``make_coordinates``: ``np.meshgrid`` in its default ``xy``
  indexing, column coordinate first). Our stores take ``(y, x)`` (docs/store-format.md), so import
  swaps the two input columns of ``W1`` and export swaps them back: the same image either way.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from ..store.format import SPLITS
from .common import (
    LayoutError,
    SourceZoo,
    export_state_dicts,
    exported_keys,
    exported_names,
    labels_of,
    relative_path,
    sequential_keys,
    siren_output_shift,
)

LAYOUT = "dwsnets"
W0 = 30.0  # nn/inr.py: Siren(w0=30.0) for every sine layer
OUTPUT_OFFSET = 0.5  # nn/inr.py: INR.forward returns self.seq(x) + 0.5
SPLITS_FILE = "dwsnets_splits.json"  # their script's default name is mnist_splits.json


def state_dict_keys(num_layers: int) -> list[str]:
    """``INR.seq``'s keys: ``seq.0.weight, seq.0.bias, ...``."""
    return sequential_keys(lambda m, _: (f"seq.{m}.weight", f"seq.{m}.bias"), num_layers)


def parameter_keys(state: dict, path: Path) -> list[str]:
    """Their loader's rule: the keys containing ``weight``, and those containing ``bias``, in order."""
    weights = [k for k in state if "weight" in k]
    biases = [k for k in state if "bias" in k]
    if len(weights) != len(biases):
        raise LayoutError(f"{path}: {len(weights)} weight keys but {len(biases)} bias keys")
    return [k for pair in zip(weights, biases) for k in pair]


def swap_input_columns(weights: list, biases: list) -> tuple[list, list]:
    """``(x, y)`` inputs <-> ``(y, x)`` inputs: the two columns of the first weight matrix exchanged
    (its own inverse; a permutation, so exact)."""
    if weights[0].shape[1] != 2:
        return weights, biases
    return [weights[0][:, ::-1].copy(), *weights[1:]], biases


def splits_file(src: Path) -> Path:
    """``src`` itself, or the one ``*splits*.json`` in the folder ``src``."""
    if src.is_dir():
        found = sorted(src.glob("*splits*.json"))
        if len(found) != 1:
            raise LayoutError(f"{src}: expected one *splits*.json file in the folder, found {len(found)}; name the "
                              f"splits file itself")
        return found[0]
    if not src.is_file():
        raise LayoutError(f"{src}: no such splits file")
    return src


def read_source(src, image_size: int = 28) -> SourceZoo:
    """The zoo described by a DWSNets splits JSON (or the folder holding it). A relative path in it is
    read from the working folder, as their loader reads it, or else from the JSON's folder."""
    path = splits_file(Path(src))
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise LayoutError(f"{path}: not a JSON file ({exc})") from None
    if not isinstance(data, dict) or "train" not in data:
        raise LayoutError(f"{path}: expected {{\"train\": {{\"path\": [...], \"label\": [...]}}, \"val\": ..., "
                          f"\"test\": ...}}")
    files, splits, labels, names = [], [], [], []
    for split in SPLITS:
        entry = data.get(split, {"path": [], "label": []})
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), list) \
                or not isinstance(entry.get("label"), list):
            raise LayoutError(f"{path}: split {split!r} must be {{\"path\": [...], \"label\": [...]}}")
        if len(entry["path"]) != len(entry["label"]):
            raise LayoutError(f"{path}: split {split!r} lists {len(entry['path'])} paths but {len(entry['label'])} "
                              f"labels; every network needs its label")
        for item, label in zip(entry["path"], entry["label"]):
            try:
                labels.append(int(label))
            except (TypeError, ValueError):
                raise LayoutError(f"{path}: split {split!r}: label {label!r} of {item} is not an integer") from None
            file = Path(item)
            if not file.is_absolute() and not file.exists():  # their loader: the working folder; else ours
                file = path.parent / item
            files.append(file)
            names.append(relative_path(file, path.parent))
            splits.append(split)
    rows = pa.table({"split": pa.array(splits, pa.string()), "label": pa.array(labels, pa.int64()),
                     "source_file": pa.array(names, pa.string())})
    return SourceZoo(
        layout=LAYOUT, path=path, files=files, rows=rows, keys=parameter_keys,
        describe=lambda widths: describe(widths, image_size, path),
        description="SIREN INRs imported from the DWSNets layout (AvivNavon/DWSNets: INRDataset's splits JSON and "
                    "state dicts); input columns swapped to this project's (y, x) order",
        targets=["label"], to_store=swap_input_columns)


def describe(widths: tuple[int, ...], image_size: int, path: Path) -> dict:
    """Manifest ``architecture`` and ``source`` of imported DWSNets INRs."""
    from ..fit.siren import SirenSpec
    from ..sources.grids import image_grid_manifest

    if len(widths) < 3 or widths[0] != 2:
        raise LayoutError(f"{path}: DWSNets image INRs take 2 inputs and have a hidden layer; these have widths "
                          f"{list(widths)}")
    architecture = {**SirenSpec(tuple(widths), W0, W0, init="published").to_manifest(),
                    "source_network": "AvivNavon/DWSNets nn/inr.py INR: seq = [Siren(w0=30)] * (L-1) + "
                                      "[nn.Linear]; forward: seq(x) + 0.5"}
    source = {"kind": "image", "image_shape": [image_size, image_size, widths[-1]],
              "coordinates": {**image_grid_manifest(image_size, image_size),
                              "source_convention": "DWSNets make_coordinates: (x, y), np.meshgrid 'xy' indexing; "
                                                   "W1's two columns swapped on import (and back on export)"},
              "reference": "https://github.com/AvivNavon/DWSNets experiments/data.py (INRDataset), "
                           "experiments/mnist/generate_data_splits.py, nn/inr.py"}
    return {"architecture": architecture, "source": source}


def export(store, out, *, overwrite: bool = False, progress: bool | None = None) -> Path:
    """Write ``store`` as a DWSNets zoo: one state dict per network and ``dwsnets_splits.json`` whose
    absolute paths point at ``out`` (their loader reads them from any working folder)."""
    shift = siren_output_shift(store, LAYOUT, W0, OUTPUT_OFFSET)
    labels = labels_of(store, LAYOUT)
    split_of = store.networks.column("split").to_pylist()
    # their generate_data_splits.py reads the label from the grandparent folder's name ("..._{label}_{n}")
    names = exported_names(store, LAYOUT, lambda i: f"inr_{split_of[i]}_{labels[i]}_{i}/checkpoints/model_final.pth")
    keys = exported_keys(store, LAYOUT, state_dict_keys(len(store.widths) - 1))
    final = Path(out).resolve()

    def index_files(folder: Path) -> None:
        data = {s: {"path": [], "label": []} for s in SPLITS}
        for i, (split, name) in enumerate(zip(split_of, names)):
            data[split]["path"].append((final / name).as_posix())
            data[split]["label"].append(str(labels[i]))
        (folder / SPLITS_FILE).write_text(json.dumps(data))

    return export_state_dicts(store, out, layout=LAYOUT, names=names, keys=keys, output_shift=shift,
                              to_layout=swap_input_columns, index_files=index_files, overwrite=overwrite,
                              progress=progress)
