"""The generic layout: a folder of MLP state dicts and a CSV with one row per network.

The CSV's ``path`` column names each network's ``.pth`` file (relative to the folder, or absolute);
a ``split`` column (``train``/``val``/``test``) places it, else every network is a train network;
every other column becomes a column of ``networks.parquet``, with the types pyarrow's CSV reader
gives it. The hidden activation, which a state dict does not hold and ScaleGMN's symmetry and the ``sign``
canonicalization need, comes from ``--activation`` or an ``activation`` column (one name for every
network: the manifest's, the column dropped; several: kept, as a ``--diversity`` classifier zoo keeps
it); export writes that column, so a round trip keeps it. A state dict's parameters are its keys
ending in ``weight`` and ``bias``, in order, as ``nn.Sequential(nn.Linear, act, nn.Linear, ...)``
saves them (``0.weight, 0.bias, 2.weight, ...``); any other entry (a batch norm's running statistics,
a step count) is refused: not an MLP.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from ..store.format import FAMILY_MLPS, SPLITS
from .common import (
    LayoutError,
    SourceZoo,
    export_state_dicts,
    exported_keys,
    exported_names,
    relative_path,
    sequential_keys,
)

LAYOUT = "state-dicts"
TABLE = "networks.csv"
PATH, SPLIT = "path", "split"
RESERVED = ("index", "source_file")  # columns the import makes
ACTIVATION = "activation"  # the CSV column naming a network's hidden activation
UNRECORDED = "not recorded (state-dicts layout; zoo import --activation names it)"
PER_NETWORK = "per network: column activation"  # as zoo generate writes a --diversity classifier zoo's


def state_dict_keys(num_layers: int) -> list[str]:
    """``nn.Sequential(Linear, act, Linear, ...)``'s keys: ``0.weight, 0.bias, 2.weight, ...``."""
    return sequential_keys(lambda m, _: (f"{2 * m}.weight", f"{2 * m}.bias"), num_layers)


def parameter_keys(state: dict, path: Path) -> list[str]:
    other = [k for k in state if not (k.endswith("weight") or k.endswith("bias"))]
    if other:
        raise LayoutError(f"{path}: key {other[0]!r} is not a linear layer's weight or bias; the state-dicts layout "
                          f"holds MLPs (nn.Linear layers) only")
    keys = list(state)
    if any(not k.endswith("weight") for k in keys[::2]) or any(not k.endswith("bias") for k in keys[1::2]):
        raise LayoutError(f"{path}: keys {keys} are not (weight, bias) pairs in layer order")
    return keys


def table_file(src: Path, csv: str | None) -> Path:
    if csv is not None:
        path = Path(csv) if Path(csv).is_absolute() else src / csv
        if not path.is_file():
            raise LayoutError(f"{path}: no such CSV file")
        return path
    found = sorted(src.glob("*.csv"))
    if len(found) != 1:
        raise LayoutError(f"{src}: expected one .csv file with a {PATH!r} column, found {len(found)}; "
                          f"name it with --csv")
    return found[0]


def activation_of(table: pa.Table, path: Path, given: str | None) -> tuple[str, pa.Table]:
    """The architecture's activation and the table to import (a one-name activation column dropped)."""
    from ..train.mlp import ACTIVATIONS

    known = ", ".join(ACTIVATIONS)
    if given is not None:
        if given not in ACTIVATIONS:
            raise LayoutError(f"--activation {given!r}: the state-dicts layout's MLPs take one of {known} (SIRENs "
                              f"come in through the dwsnets and nfn-siren layouts, which know their w0)")
        if ACTIVATION in table.column_names:
            raise LayoutError(f"{path} has an {ACTIVATION!r} column and --activation is given too: leave one out")
        return given, table
    if ACTIVATION not in table.column_names:
        return UNRECORDED, table
    names = table.column(ACTIVATION).to_pylist()
    unknown = [n for n in names if n not in ACTIVATIONS]
    if unknown:
        raise LayoutError(f"{path}: a network's {ACTIVATION} is {unknown[0]!r}, not one of {known}")
    if len(set(names)) == 1:
        return names[0], table.drop_columns([ACTIVATION])
    return PER_NETWORK, table


def read_source(src, *, csv: str | None = None, activation: str | None = None) -> SourceZoo:
    """The zoo in the folder ``src`` described by its CSV (``csv``: its name, when not the only one);
    ``activation``: every network's hidden activation, where the CSV has no column for it."""
    import pyarrow.csv as pcsv

    root = Path(src)
    if not root.is_dir():
        raise LayoutError(f"{root}: no such folder (state-dicts imports a folder of .pth files and a CSV)")
    path = table_file(root, csv)
    try:
        table = pcsv.read_csv(path)
    except pa.ArrowInvalid as exc:
        raise LayoutError(f"{path}: not a readable CSV ({str(exc).splitlines()[0]})") from None
    if PATH not in table.column_names:
        raise LayoutError(f"{path}: no {PATH!r} column naming each network's file; columns: {table.column_names}")
    clash = next((c for c in RESERVED if c in table.column_names), None)
    if clash is not None:
        raise LayoutError(f"{path}: column {clash!r} is made by the import; rename it")
    if table.column(PATH).null_count:
        raise LayoutError(f"{path}: a row has no {PATH!r}")
    if SPLIT in table.column_names:
        splits = [str(s) for s in table.column(SPLIT).to_pylist()]
        unknown = next((s for s in splits if s not in SPLITS), None)
        if unknown is not None:
            raise LayoutError(f"{path}: unknown split {unknown!r}; expected {', '.join(SPLITS)}")
        order = sorted(range(table.num_rows), key=lambda i: SPLITS.index(splits[i]))  # stable: CSV order within
        table = table.take(pa.array(order, pa.int64())).drop_columns([SPLIT])
        splits = [splits[i] for i in order]
    else:
        splits = ["train"] * table.num_rows
    activation, table = activation_of(table, path, activation)
    files = [Path(p) if Path(p).is_absolute() else root / p for p in table.column(PATH).to_pylist()]
    rows = table.drop_columns([PATH])
    rows = rows.add_column(0, SPLIT, pa.array(splits, pa.string()))
    rows = rows.append_column("source_file", pa.array([relative_path(f, root) for f in files], pa.string()))
    numeric = (pa.types.is_integer, pa.types.is_floating)
    targets = [c for c in rows.column_names if any(is_(rows.schema.field(c).type) for is_ in numeric)]
    return SourceZoo(
        layout=LAYOUT, path=path, files=files, rows=rows, keys=parameter_keys,
        describe=lambda widths: describe(widths, path, activation),
        description=f"MLPs imported from a folder of state dicts ({path.name}: one row per network)",
        targets=targets)


def describe(widths, path: Path, activation: str = UNRECORDED) -> dict:
    architecture = {"family": FAMILY_MLPS, "widths": list(widths), "weight_layout": "out x in (PyTorch)",
                    "activation": activation,
                    "layer": "h_m = act(W_m h_{m-1} + b_m), m < M; the last layer linear"}
    return {"architecture": architecture, "source": {"kind": "state-dicts", "table": path.name}}


def export(store, out, *, overwrite: bool = False, progress: bool | None = None) -> Path:
    """Write ``store`` as a folder of state dicts and ``networks.csv`` (``path``, ``split`` and every
    column of ``networks.parquet`` but ``index`` and ``source_file``; list columns as JSON text; an
    ``activation`` column where the manifest names one activation for every network)."""
    import pyarrow.csv as pcsv

    from ..train.mlp import ACTIVATIONS

    names = exported_names(store, LAYOUT, lambda i: f"nets/net{i:06d}.pth")
    keys = exported_keys(store, LAYOUT, state_dict_keys(len(store.widths) - 1))
    rows = store.networks

    def index_files(folder: Path) -> None:
        columns = {PATH: pa.array(names, pa.string()), SPLIT: rows.column(SPLIT)}
        for name in rows.column_names:
            if name in (*RESERVED, SPLIT):
                continue
            column = rows.column(name)
            if pa.types.is_nested(column.type):
                column = pa.array([None if v is None else json.dumps(v) for v in column.to_pylist()], pa.string())
            elif pa.types.is_floating(column.type):  # reads back as these float64 values: float32 ones exactly,
                column = pa.array([None if v is None else repr(float(v)) for v in column.to_pylist()], pa.string())
                # and whole ones as reals ("1.0"; pyarrow writes a float 1.0 as "1", which reads back as an integer)
            columns[name] = column
        activation = (store.manifest.get("architecture") or {}).get("activation")
        if activation in ACTIVATIONS and ACTIVATION not in columns:
            columns[ACTIVATION] = pa.array([activation] * rows.num_rows, pa.string())
        pcsv.write_csv(pa.table(columns), folder / TABLE)

    return export_state_dicts(store, out, layout=LAYOUT, names=names, keys=keys, index_files=index_files,
                              overwrite=overwrite, progress=progress)
