"""``zoo info`` / ``zoo show`` for INR zoos: PSNR and steps, decoded INRs beside their sources."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..fit.siren import SirenSpec, forward
from ..sources.grids import image_grid, sine_grid
from ..store import WeightStore
from ..store.format import layers_from_arrays
from .figures import save_figure


def spec_of(store: WeightStore) -> SirenSpec:
    arch = store.manifest["architecture"]
    return SirenSpec(tuple(arch["widths"]), arch["w0_first"], arch["w0_hidden"], arch["init"])


def summary(store: WeightStore) -> str:
    m = store.manifest
    arch = m["architecture"]
    table = store.networks
    psnr = table.column("psnr").to_numpy()
    steps = table.column("steps").to_numpy()
    lines = [
        f"store      {store.root}  (format v{m['format_version']}, {m['status']})",
        f"kind       {m['kind']}: {m.get('description', '')}",
        f"source     {m['source'].get('source')}  ({m['generation']['views']} view(s) per item, seed {m['generation']['seed']})",
        f"arch       {' -> '.join(map(str, arch['widths']))}  {arch['activation']}, w0 {arch['w0_per_layer']}, init {arch['init']}",
        f"networks   {m['num_networks']} in {m['num_chunks']} chunk(s) of {m['chunk_size']}",
        "splits     " + ", ".join(f"{s} {v['count']}" for s, v in m["splits"].items()),
        "psnr (dB)  " + "  ".join(f"p{q} {np.percentile(psnr, q):.2f}" for q in (5, 25, 50, 75, 95))
        + f"  mean {psnr.mean():.2f}",
        f"steps      mean {steps.mean():.0f}, early-stopped {np.mean(steps < m['generation']['fit']['steps']) * 100:.1f}%"
        + _fitted_by(table),
        f"disk       {store.size_on_disk() / 2**20:.1f} MiB",
    ]
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


def show(store: WeightStore, out: Path, count: int = 8, data_root: str | None = None) -> Path:
    """Decoded INRs (top) beside their source images (bottom), or curves for signal zoos."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..sources import DataError, get_source

    count = min(count, store.num_networks)
    indices = np.linspace(0, store.num_networks - 1, count).round().astype(int).tolist()  # spread over splits
    decoded = decode(store, indices)
    table = store.networks.take(indices).to_pydict()
    src_name = store.manifest["generation"]["dataset"]
    try:
        source = get_source(src_name, root=data_root)
    except DataError:  # source files not here: draw the INRs alone
        source = None
    fig, axes = plt.subplots(2, count, figsize=(1.6 * count, 3.4), squeeze=False)
    for k in range(count):
        split, item = table["split"][k], table["source_item"][k]
        title = f"#{indices[k]} {table['psnr'][k]:.1f}dB"
        if store.manifest["source"].get("kind") == "image":
            h, w, c = store.manifest["source"]["image_shape"]
            img = np.clip(decoded[k].reshape(h, w, c), 0, 1)
            axes[0, k].imshow(img.squeeze(-1) if c == 1 else img, cmap="gray", vmin=0, vmax=1)
            if source is not None:
                sp = source.split(split)
                pos = int(np.flatnonzero(sp.item_ids == item)[0])
                orig = sp.images[pos]
                axes[1, k].imshow(orig.squeeze(-1) if c == 1 else orig, cmap="gray", vmin=0, vmax=1)
        else:
            x = coordinates(store).squeeze(1).numpy()
            axes[0, k].plot(x, decoded[k][:, 0])
            a, b = table["amplitude"][k], table["frequency"][k]
            axes[1, k].plot(x, a * np.sin(b * x))
        axes[0, k].set_title(title, fontsize=7)
        for r in range(2):
            axes[r, k].set_xticks([])
            axes[r, k].set_yticks([])
    axes[0, 0].set_ylabel("INR")
    axes[1, 0].set_ylabel("source")
    fig.tight_layout()
    return save_figure(fig, out)
