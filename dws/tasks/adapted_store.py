"""``zoo eval RUN STORE --out ADAPTED``: every classifier of a store adapted by an ``adapt`` run, written
as a new classifier store (same format, same rows and splits), so the adapted zoo is usable as any
other: ``zoo info``, ``zoo train``, the numpy-only evaluation of docs/store-format.md.

Columns: ``test_accuracy`` is recomputed for the adapted network under the store's own rule
(``architecture.evaluation``: the clean official test images of its classes); two columns are added,
``corrupted_accuracy`` (the adapted network on the run's fixed corrupted test images, the target
domain) and ``corrupted_accuracy_before`` (the input network on the same images). The manifest keeps
the input store's description of the networks and adds ``adaptation``: the store and the run it was
derived from, the model, the corruption. A store interrupted while being written is started over
by the same command; a complete one is never overwritten.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from dws.stream.batch import arrays_from_weightspace, weightspace_from_arrays
from dws.stream.memory import activation_bytes, model_bytes, network_bytes, plan_memory
from dws.weightspace import WeightSpace
from zoo.options import DEFAULT_MAX_MEMORY
from zoo.store import StoreError, WeightStore
from zoo.store.derive import write_store_by_chunk
from zoo.store.location import store_root
from zoo.store.manifest import read_manifest

from .adaptation import Adaptation, accuracies
from .options import ACTIVATION_PEAK
from .rundir import load_run


def write_adapted_store(run_dir: str | Path, store_path: str | Path, out: str | Path, data_root: str | None = None,
                        batch_size: int = 64, log=print, max_memory: int = DEFAULT_MAX_MEMORY) -> dict:
    """Write ``out``, one chunk at a time, holding at most ``max_memory`` bytes (refused in one line
    before anything is written when it cannot); returns per split the mean accuracies before and
    after (clean and corrupted)."""
    run = load_run(run_dir)
    if not run.task.outputs_weights:
        raise ValueError(f"{run_dir} is a --task {run.task.name} run; only --task adapt runs output networks "
                         f"(drop --out)")
    store = run.check(WeightStore(store_path))
    adaptation = run.bind(store, data_root).adaptation
    batch = min(batch_size, store.chunk_size)  # (a chunk's networks are adapted in batches)
    plan_memory(max_memory, store, {}, shuffled=None, batch_size=batch, model_bytes=model_bytes(run.model),
                training=False, extra=adaptation_bytes(adaptation, store),
                activations=activation_bytes(run.model, store.widths, batch,
                                             ACTIVATION_PEAK[run.config["options"]["model"]][1]))
    origin = {"derived_from": str(_resolved(store.root)), "run": str(Path(run_dir).resolve())}
    overwrite = _interrupted_by_the_same(Path(out), origin, log)

    def chunk(lo: int, hi: int):
        raw = weightspace_from_arrays(store.read(lo, hi))
        ws = raw if run.transform is None else run.transform(raw)
        adapted = adapt(run.model, ws, batch_size)
        classes = adaptation.classes[lo:hi]
        acts = adaptation.activations[lo:hi]
        rows = store.networks.slice(lo, hi - lo)
        columns = {
            "test_accuracy": accuracies(adapted, classes, acts, *adaptation.domain.fixed_images("clean-test")),
            "corrupted_accuracy": accuracies(adapted, classes, acts, *adaptation.domain.fixed_images("test")),
            "corrupted_accuracy_before": accuracies(ws, classes, acts, *adaptation.domain.fixed_images("test")),
        }
        for name, values in columns.items():
            column = pa.array(np.asarray(values, np.float32))
            names = rows.column_names
            rows = rows.set_column(names.index(name), name, column) if name in names else rows.append_column(name, column)
        log(f"adapted networks {lo}..{hi - 1} of {store.num_networks}")
        return arrays_from_weightspace(adapted), rows

    manifest = store.manifest
    meta = {k: manifest[k] for k in ("kind", "description", "architecture", "targets", "generation", "source",
                                     "runs", "training") if k in manifest}
    meta["description"] = f"{manifest.get('description', '')}; adapted (v - dv) to corrupted images by an adapt run"
    meta["targets"] = list(dict.fromkeys([*manifest.get("targets", []), "corrupted_accuracy"]))
    meta["adaptation"] = {
        **origin,
        "model": run.config["model"],
        "rule": "each network is v - dv(v): v the input network, dv the run's best model's output",
        "corruption": adaptation.domain.corruption.describe(),
        "columns": {
            "test_accuracy": "the adapted network, under architecture.evaluation (clean official test images)",
            "corrupted_accuracy": "the adapted network on the official test images of its classes, corrupted once "
                                  "with the fixed seed (the target domain)",
            "corrupted_accuracy_before": "the input network on the same corrupted images",
        },
    }
    write_store_by_chunk(out, widths=store.widths, num_networks=store.num_networks, chunk=chunk,
                         splits=manifest["splits"], metadata=meta, chunk_size=store.chunk_size, overwrite=overwrite)
    return summarize(WeightStore(out))


def adaptation_bytes(adaptation: Adaptation, store: WeightStore) -> dict[str, int]:
    """What writing an adapted store holds beside the model, its batches and the chunk being read: a
    chunk's networks transformed, adapted (its batches, then joined) and being written (3 chunks); the
    images (uint8 as read, the domain's train and hold-out copies of the train images, the clean and
    the corrupted test inputs in float32); and, per chunk, the test inputs that :func:`accuracies`
    selects once for each class set of its networks (the chunk that selects most)."""
    data = adaptation.domain.data
    labels, test_inputs = torch.from_numpy(data.test_labels), 4 * data.test_pixels.size
    selected = 0
    for lo in range(0, store.num_networks, store.chunk_size):
        class_sets = adaptation.classes[lo : lo + store.chunk_size].unique(dim=0)
        rows = sum(int(torch.isin(labels, classes).sum()) for classes in class_sets)
        selected = max(selected, rows * test_inputs // max(1, len(labels)))
    return {"networks adapted and written": 3 * store.chunk_size * network_bytes(store),
            "images": 2 * data.train_pixels.nbytes + data.test_pixels.nbytes + 2 * test_inputs,
            "a chunk's class sets' images": selected}


@torch.no_grad()
def adapt(model, ws: WeightSpace, batch_size: int) -> WeightSpace:
    """``model(ws)`` in batches of ``batch_size`` networks."""
    parts = [model(ws.map(lambda t: t[start : start + batch_size])) for start in range(0, ws.batch_size, batch_size)]
    return WeightSpace(tuple(torch.cat(ts) for ts in zip(*(p.weights for p in parts))),
                       tuple(torch.cat(ts) for ts in zip(*(p.biases for p in parts))))


def summarize(adapted: WeightStore) -> dict:
    """Per split: mean corrupted accuracy before and after, and clean test accuracy after."""
    table = adapted.networks
    split = np.asarray(table.column("split").to_pylist())
    out = {"store": str(adapted.root)}
    for name in adapted.manifest["splits"]:
        rows = split == name
        if rows.any():
            out[name] = {c: float(np.nanmean(table.column(c).to_numpy(zero_copy_only=False)[rows].astype(np.float64)))
                         for c in ("corrupted_accuracy_before", "corrupted_accuracy", "test_accuracy")}
    return out


def _resolved(root) -> Path | str:
    return root.resolve() if isinstance(root, Path) else root


def _interrupted_by_the_same(out: Path, origin: dict, log) -> bool:
    """True if ``out`` holds an unfinished adapted store of the same run and store (to start over);
    refuses any other store there."""
    if not (out / "manifest.json").exists():
        return False
    manifest = read_manifest(store_root(out))
    made = manifest.get("adaptation", {})
    same = all(made.get(k) == v for k, v in origin.items())
    if manifest.get("status") == "complete" or not same:
        raise StoreError(f"{out} already holds a {'complete ' if manifest.get('status') == 'complete' else ''}store; "
                         f"choose a new --out (or delete it)")
    log(f"note: {out} holds an interrupted adapted store of this run; writing it again")
    return True
