"""``zoo import`` / ``zoo export``: other labs' published zoo layouts <-> weight stores.

One module per layout (``dwsnets``, ``nfn``, ``state_dicts``, ``parquet``) and ``common`` for what
they share. Imported ``.pth`` files are untrusted: read with ``torch.load(weights_only=True)``.
The layout names below load no PyTorch (the CLI lists them); the modules are imported on use.
"""

from __future__ import annotations

from pathlib import Path

IMPORT_LAYOUTS = ("dwsnets", "nfn-siren", "state-dicts", "parquet")
EXPORT_LAYOUTS = ("dwsnets", "nfn-siren", "state-dicts", "parquet")


def import_zoo(layout: str, src, out, *, chunk_size: int = 1024, overwrite: bool = False, dataset: str | None = None,
               prefix: str | None = None, split_points: tuple[int, int] | None = None, csv: str | None = None,
               image_size: int | None = None, activation: str | None = None, progress: bool | None = None) -> Path:
    """Import the zoo at ``src`` (in ``layout``) as a complete store at ``out`` (a new local folder).
    ``prefix``, ``split_points``: nfn-siren; ``csv``, ``activation``: state-dicts; ``image_size``: the SIREN
    layouts."""
    from . import dwsnets, nfn, parquet, state_dicts
    from .common import LayoutError, require_new_folder, write_imported_store

    require_new_folder(out, overwrite)  # before reading anything
    if activation is not None and layout != "state-dicts":
        raise LayoutError(f"--activation is for the state-dicts layout; {layout}'s networks record theirs")
    if layout == "dwsnets":
        zoo = dwsnets.read_source(src, image_size=image_size or 28)
    elif layout == "nfn-siren":
        zoo = nfn.read_source(src, prefix=prefix, split_points=split_points, image_size=image_size)
    elif layout == "state-dicts":
        zoo = state_dicts.read_source(src, csv=csv, activation=activation)
    elif layout != "parquet":
        raise LayoutError(f"unknown layout {layout!r}; choose one of {', '.join(IMPORT_LAYOUTS)}")
    options = {"--chunk-size": chunk_size, "--dataset": dataset, "--prefix": prefix, "--csv": csv,
               "--split-points": ",".join(map(str, split_points)) if split_points else None,
               "--image-size": image_size, "--activation": activation}
    command = ["zoo", "import", layout, str(Path(src).resolve()), "--out", str(out),
               *[str(v) for k, value in options.items() if value is not None for v in (k, value)], "--overwrite"]
    if layout == "parquet":  # the parameters are columns, not files
        return parquet.import_store(src, out, chunk_size=chunk_size, overwrite=overwrite, dataset=dataset,
                                    command=command, progress=progress)
    return write_imported_store(zoo, out, chunk_size=chunk_size, overwrite=overwrite, dataset=dataset,
                                command=command, progress=progress)


def export_zoo(store, layout: str, out, *, overwrite: bool = False, prefix: str | None = None,
               progress: bool | None = None) -> Path:
    """Write the store ``store`` (a path, URL or ``WeightStore``) in ``layout`` into the folder ``out``,
    which appears whole or not at all. ``prefix``: nfn-siren's folder prefix."""
    from ..store import WeightStore
    from . import dwsnets, nfn, parquet, state_dicts
    from .common import LayoutError, require_new_folder

    if layout not in EXPORT_LAYOUTS:
        raise LayoutError(f"unknown layout {layout!r}; choose one of {', '.join(EXPORT_LAYOUTS)}")
    require_new_folder(out, overwrite)  # before reading anything
    store = store if isinstance(store, WeightStore) else WeightStore(store)
    if isinstance(store.root, Path) and Path(out).resolve() == store.root.resolve():
        raise LayoutError(f"--out {out} is the store being exported; choose another folder")
    if layout == "nfn-siren":
        return nfn.export(store, out, prefix=prefix, overwrite=overwrite, progress=progress)
    module = {"dwsnets": dwsnets, "state-dicts": state_dicts, "parquet": parquet}[layout]
    return module.export(store, out, overwrite=overwrite, progress=progress)
