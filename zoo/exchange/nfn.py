"""The layout of AllanYangZhou/nfn's SIREN zoos: folders ``{prefix}_{label}s/net{idx}.pth``.

What their code reads (``experiments/data_utils.py`` ``SirenDataset``, ``nfn/common/data.py``
``state_dict_to_tensors``, the network in ``experiments/siren_utils.py``), see
docs/store-format.md "Import and export":

* ``net{idx}.pth`` under ``{prefix}_{digit}s/``: the label is the digit, ``idx`` runs over
  ``0..N-1`` across all folders; splits are index ranges cut at ``split_points = [val, test]``
  (their configs: ``prefix: randinit_smaller``, ``split_points: [45000, 50000]``);
* a state dict read in key order as (weight, bias) pairs: ``net.0.linear.weight, net.0.linear.bias,
  ..., net.{L-1}.weight, net.{L-1}.bias`` (``Siren.net``: ``SineLayer`` modules holding a
  ``linear``, then a plain ``nn.Linear``, ``outermost_linear=True``);
* the network: ``sin(30 * (W x + b))`` in every sine layer, a linear last layer, no offset; its
  input is ``(y, x)`` (``get_mgrid``: ``torch.meshgrid`` in ``ij`` indexing), as in our stores;
  the images it was fitted to were scaled to ``[-1, 1]`` (``Normalize(0.5, 0.5)``).

Their glob is ``{prefix}_*/*.pth``, which also meets the augmentation folders
(``{prefix}_aug{i}_{digit}s``); it reads ``{prefix}_[0-9]s`` as their own TODO says it should.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pyarrow as pa

from .common import (
    LayoutError,
    SourceZoo,
    export_state_dicts,
    exported_keys,
    labels_of,
    relative_path,
    sequential_keys,
    siren_output_shift,
)

LAYOUT = "nfn-siren"
W0 = 30.0  # siren_utils.SIREN_kwargs: first_omega_0 = hidden_omega_0 = 30
OUTPUT_OFFSET = 0.0
PREFIX = "randinit_smaller"  # classify_siren_configs/dset/*.yaml
SPLIT_POINTS = (45000, 50000)  # the same configs
SPLIT_POINTS_FILE = "split_points.json"  # ours: their split points live in a Hydra config
_FOLDER = re.compile(r"^(?P<prefix>.+)_(?P<label>\d)s$")
_NET = re.compile(r"^net(\d+)\.pth$")


def state_dict_keys(num_layers: int) -> list[str]:
    """``Siren.net``'s keys: ``net.{m}.linear.weight`` for the sine layers, ``net.{L-1}.weight`` last."""
    return sequential_keys(lambda m, n: (f"net.{m}.weight", f"net.{m}.bias") if m == n - 1 else
                           (f"net.{m}.linear.weight", f"net.{m}.linear.bias"), num_layers)


def parameter_keys(state: dict, path: Path) -> list[str]:
    """``state_dict_to_tensors``' rule: every key, in order, as (weight, bias) pairs."""
    keys = list(state)
    if len(keys) % 2 or any(not b.endswith("bias") for b in keys[1::2]):
        raise LayoutError(f"{path}: keys {keys} are not (weight, bias) pairs in order, as nfn's "
                          f"state_dict_to_tensors reads them")
    return keys


def read_source(src, *, prefix: str | None = None, split_points: tuple[int, int] | None = None,
                image_size: int | None = None) -> SourceZoo:
    """The zoo in the folder ``src``. ``prefix``: the folders' (found when only one is there);
    ``split_points``: ``[val, test]`` (else ``split_points.json`` in ``src``, else their configs')."""
    root = Path(src)
    if not root.is_dir():
        raise LayoutError(f"{root}: no such folder (nfn-siren imports a folder of {{prefix}}_{{label}}s folders)")
    folders = [(m, p) for p in sorted(root.iterdir()) if p.is_dir() and (m := _FOLDER.match(p.name))]
    recorded = _recorded_split_points(root)
    prefixes = sorted({m["prefix"] for m, _ in folders})
    # the published folders: {prefix}_{d}s and the augmented copies {prefix}_aug{i}_{d}s
    base = [p for p in prefixes if all(q == p or q.startswith(p + "_") for q in prefixes)]
    prefix = prefix or recorded.get("prefix") or (base[0] if len(base) == 1 else None)
    if prefix is None:
        raise LayoutError(f"{root}: folders of several prefixes ({', '.join(prefixes) or 'none'}); choose one with "
                          f"--prefix" if prefixes else f"{root}: no {{prefix}}_{{digit}}s folders")
    by_index: dict[int, tuple[Path, int]] = {}
    for match, folder in folders:
        if match["prefix"] != prefix:
            continue
        for file in sorted(folder.glob("*.pth")):
            net = _NET.match(file.name)
            if net is None:
                raise LayoutError(f"{file}: not named net{{idx}}.pth")
            idx = int(net[1])
            if idx in by_index:
                raise LayoutError(f"{file}: network {idx} is also {by_index[idx][0]}")
            by_index[idx] = (file, int(match["label"]))
    if not by_index:
        raise LayoutError(f"{root}: no {prefix}_{{digit}}s/net{{idx}}.pth files")
    missing = next((i for i in range(len(by_index)) if i not in by_index), None)
    if missing is not None:
        raise LayoutError(f"{root}: net{missing}.pth is missing (indices must run 0..{len(by_index) - 1})")
    n = len(by_index)
    val, test = split_points or recorded.get("split_points") or SPLIT_POINTS
    if not 0 < val <= test <= n:
        raise LayoutError(f"{root}: split points [{val}, {test}] do not fit {n} networks; give --split-points VAL,TEST")
    splits = ["train" if i < val else "val" if i < test else "test" for i in range(n)]
    files = [by_index[i][0] for i in range(n)]
    rows = pa.table({"split": pa.array(splits, pa.string()),
                     "label": pa.array([by_index[i][1] for i in range(n)], pa.int64()),
                     "source_file": pa.array([relative_path(f, root) for f in files], pa.string())})
    return SourceZoo(
        layout=LAYOUT, path=root, files=files, rows=rows, keys=parameter_keys,
        describe=lambda widths: describe(widths, image_size, root, prefix, (val, test)),
        description=f"SIREN INRs imported from the nfn layout (AllanYangZhou/nfn SirenDataset, prefix {prefix})",
        targets=["label"])


def _recorded_split_points(root: Path) -> dict:
    path = root / SPLIT_POINTS_FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
        return {"prefix": str(data["prefix"]), "split_points": tuple(int(v) for v in data["split_points"])}
    except (ValueError, KeyError, TypeError) as exc:
        raise LayoutError(f"{path}: expected {{\"prefix\": ..., \"split_points\": [VAL, TEST]}} ({exc})") from None


def describe(widths, image_size, path: Path, prefix: str, split_points) -> dict:
    """Manifest ``architecture`` and ``source`` of imported nfn SIRENs."""
    from ..fit.siren import SirenSpec
    from ..sources.grids import image_grid_manifest

    if len(widths) < 3 or widths[0] != 2:
        raise LayoutError(f"{path}: nfn's image SIRENs take 2 inputs and have a hidden layer; these have widths "
                          f"{list(widths)}")
    size = image_size or (28 if widths[-1] == 1 else 32)  # siren_utils.IMG_shapes
    architecture = {
        **SirenSpec(tuple(widths), W0, W0, init="siren").to_manifest(),
        # nn.Linear keeps its default bias U(+-1/sqrt(d_in)) in every layer (SineLayer sets weights only)
        "init_ranges": [{"weight": (1.0 / d_in if m == 0 else math.sqrt(6.0 / d_in) / W0),
                         "bias": 1.0 / math.sqrt(d_in)} for m, d_in in enumerate(widths[:-1])],
        "source_network": "AllanYangZhou/nfn experiments/siren_utils.py Siren(outermost_linear=True, "
                          "first_omega_0=30, hidden_omega_0=30): SineLayer = sin(30 * linear(x)); no output offset",
    }
    source = {"kind": "image", "image_shape": [size, size, widths[-1]],
              "coordinates": {**image_grid_manifest(size, size),
                              "targets": "pixel values in [-1, 1] (torchvision Normalize(0.5, 0.5)), [N, H*W, C] in "
                                         "the same order",
                              "source_convention": "nfn get_mgrid: torch.meshgrid 'ij', (y, x) as here"},
              "prefix": prefix, "split_points": list(split_points),
              "reference": "https://github.com/AllanYangZhou/nfn experiments/data_utils.py (SirenDataset), "
                           "nfn/common/data.py (state_dict_to_tensors), experiments/siren_utils.py"}
    return {"architecture": architecture, "source": source}


def export(store, out, *, prefix: str | None = None, overwrite: bool = False, progress: bool | None = None) -> Path:
    """Write ``store`` as an nfn SIREN zoo: ``{prefix}_{label}s/net{index}.pth`` and
    ``split_points.json`` (what their dataset config needs: ``prefix``, ``split_points``)."""
    shift = siren_output_shift(store, LAYOUT, W0, OUTPUT_OFFSET)
    labels = labels_of(store, LAYOUT)
    bad = next((v for v in labels if not 0 <= v <= 9), None)
    if bad is not None:
        raise LayoutError(f"{store.root}: nfn's folders hold one digit per label (_(\\d)s); label {bad} has none")
    source = store.manifest.get("source", {})
    prefix = prefix or (source.get("prefix") if source.get("layout") == LAYOUT else None) or PREFIX
    names = [f"{prefix}_{label}s/net{i}.pth" for i, label in enumerate(labels)]  # the index is the file's number
    keys = exported_keys(store, LAYOUT, state_dict_keys(len(store.widths) - 1))
    val = store.split_range("val")[0]
    test = store.split_range("test")[0]

    def index_files(folder: Path) -> None:
        (folder / SPLIT_POINTS_FILE).write_text(json.dumps({"prefix": prefix, "split_points": [val, test]}))

    return export_state_dicts(store, out, layout=LAYOUT, names=names, keys=keys, output_shift=shift,
                              index_files=index_files, overwrite=overwrite, progress=progress)
