"""``zoo info`` / ``zoo show`` for INR zoos: PSNR and steps, decoded INRs beside their sources."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..fit.siren import SirenSpec, forward
from ..sources.grids import image_grid, sine_grid
from ..store import WeightStore
from ..store.format import layers_from_arrays
from ..store.manifest import imported_from
from ..options import plural
from .figures import save_figure
from .format import disk_line, head_lines, percentiles, shown, widths_text


def spec_of(store: WeightStore) -> SirenSpec:
    arch = store.manifest["architecture"]
    return SirenSpec(tuple(arch["widths"]), arch["w0_first"], arch["w0_hidden"], arch["init"])


def summary(store: WeightStore) -> str:
    """The ``zoo info`` lines; an imported zoo (``zoo import``) has no fitting record (PSNR, steps,
    views, seed), so its lines say where it came from instead."""
    m = store.manifest
    arch = m["architecture"]
    table = store.networks
    generation = m.get("generation", {})
    imported = imported_from(m)
    if imported:
        origin = f"source     imported from the {imported['layout']} layout at {imported['path']}"
    else:
        origin = (f"source     {m['source'].get('source')}  ({plural(generation['views'], 'view')} per item, "
                  f"seed {generation['seed']})")
    lines = [
        *head_lines(store),
        origin,
        f"arch       {widths_text(arch)}  {arch['activation']}, w0 {arch['w0_per_layer']}, init {arch['init']}",
        f"networks   {m['num_networks']} in {plural(m['num_chunks'], 'chunk')} of {m['chunk_size']}",
        "splits     " + ", ".join(f"{s} {v['count']}" for s, v in m["splits"].items()),
    ]
    if "psnr" in table.column_names:
        lines.append("psnr (dB)  " + percentiles(table.column("psnr").to_numpy(), 2))
    if "steps" in table.column_names:
        steps = table.column("steps").to_numpy()
        lines.append(f"steps      mean {steps.mean():.0f}, early-stopped "
                     f"{np.mean(steps < generation['fit']['steps']) * 100:.1f}%" + _fitted_by(table))
    lines.append(disk_line(store))
    return "\n".join(lines)


def _fitted_by(table) -> str:
    """The steps line's ", fitted by native-c" (each step's share when a resumed store mixes them)."""
    if "fit_step" not in table.column_names:
        return ""
    names, counts = np.unique(np.asarray(table.column("fit_step").fill_null("unrecorded").to_pylist()),
                              return_counts=True)
    if len(names) == 1:
        return f", fitted by {names[0]}"
    return ", fitted by " + ", ".join(f"{n} ({c})" for n, c in zip(names, counts))


def decode(store: WeightStore, indices) -> np.ndarray:
    """Signals of networks ``indices`` on the store's coordinate grid: ``[n, P, d_out]``."""
    spec = spec_of(store)
    rows = [store.read(i, i + 1) for i in indices]
    weights, biases = layers_from_arrays({name: torch.from_numpy(np.concatenate([r[name] for r in rows]))
                                          for name in store.parameter_names})
    coords = coordinates(store)
    with torch.no_grad():
        return forward(spec, weights, biases, coords).numpy()


def coordinates(store: WeightStore) -> torch.Tensor:
    """The grid the store's networks were fitted on (see ``manifest.source.coordinates``)."""
    source = store.manifest["source"]
    if source.get("kind") == "image":
        return image_grid(*source["image_shape"][:2])
    return sine_grid(source["coordinates"]["shape"][0])


COLUMNS = 10  # networks per row of the figure


def show(store: WeightStore, out: Path, count: int = 8, data_root: str | None = None, log=print) -> Path:
    """Decoded INRs above their source images (or curves, for signal zoos), in rows of
    :data:`COLUMNS` networks spread over the splits."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..sources import DataError, get_source

    count = shown(count, store.num_networks, "networks", log)
    indices = np.linspace(0, store.num_networks - 1, count).round().astype(int).tolist()  # spread over splits
    decoded = decode(store, indices)
    table = store.networks.take(indices).to_pydict()
    src_name = store.manifest["generation"].get("dataset")
    source = None
    if src_name is None or "source_item" not in table:  # an imported zoo that names no data set
        log("note: this store does not name its source images: drawing the INRs alone")
    else:
        try:
            source = get_source(src_name, root=data_root)
        except DataError:  # source files not here: draw the INRs alone
            log(f"note: the {src_name} files are not here (--data-root): drawing the INRs alone")
    columns, rows = min(count, COLUMNS), -(-count // COLUMNS)
    fig, axes = plt.subplots(2 * rows, columns, figsize=(1.6 * columns, 3.4 * rows), squeeze=False)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    for k in range(count):
        inr, original = axes[2 * (k // COLUMNS), k % COLUMNS], axes[2 * (k // COLUMNS) + 1, k % COLUMNS]
        split = table["split"][k]
        if store.manifest["source"].get("kind") == "image":
            h, w, c = store.manifest["source"]["image_shape"]
            img = np.clip(decoded[k].reshape(h, w, c), 0, 1)
            inr.imshow(img.squeeze(-1) if c == 1 else img, cmap="gray", vmin=0, vmax=1)
            if source is not None:
                sp = source.split(split)
                pos = int(np.flatnonzero(sp.item_ids == table["source_item"][k])[0])
                orig = sp.images[pos]
                original.imshow(orig.squeeze(-1) if c == 1 else orig, cmap="gray", vmin=0, vmax=1)
        else:
            x = coordinates(store).squeeze(1).numpy()
            inr.plot(x, decoded[k][:, 0])
            a, b = table["amplitude"][k], table["frequency"][k]
            original.plot(x, a * np.sin(b * x))
        psnr = f" {table['psnr'][k]:.1f}dB" if "psnr" in table else ""
        inr.set_title(f"#{indices[k]} {split}{psnr}", fontsize=7)
    for k in range(count, rows * columns):  # the last row's empty places
        axes[2 * (k // COLUMNS), k % COLUMNS].axis("off")
        axes[2 * (k // COLUMNS) + 1, k % COLUMNS].axis("off")
    for r in range(rows):
        axes[2 * r, 0].set_ylabel("INR")
        axes[2 * r + 1, 0].set_ylabel("source")
    fig.tight_layout()
    return save_figure(fig, out)
