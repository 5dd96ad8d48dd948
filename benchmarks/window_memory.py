"""Memory and time of one streaming shuffle window: the loader vs concatenate-then-gather; and
each command's peak memory against ``--max-memory`` on a store larger than the machine's memory.

    python benchmarks/window_memory.py [--networks 1024] [--chunk-size 256] [--rounds 2]
    python benchmarks/window_memory.py --commands DIR [--gigabytes 30] [--max-memory 4G] [--keep]

Writes a synthetic store of random classifier-shaped networks (784 -> 128 -> 128 -> 10, ~118K
parameters, the size of the ``fmnist-classifiers`` zoo's networks), then, each side in a fresh
process (its peak resident memory, VmHWM, reset before the batch), takes the first batch of a streaming train loader
whose single shuffle window holds the whole train split. The sides, alternated ``--rounds`` times:

* ``loader``: ``dws.stream.WeightStoreLoader`` as it is (each chunk copied straight to its rows of
  the shuffled window, normalized in place);
* ``baseline``: the same stream with the window built the earlier way: every chunk read, the chunks
  concatenated, the networks gathered in the shuffled order (``index_select``), then normalized
  into new tensors.

Reports the peak resident memory above what the process held before the first batch, the window's
size, the seconds to the first batch, and the ratios. The batches of both sides are checked equal.

``--commands DIR`` writes (or reuses) a store of ``--gigabytes`` of such networks in DIR, in chunks
of 894 networks (423 MB, the ``fmnist-classifiers`` zoo's chunks) with fake values made chunk by
chunk (``zoo.store.derive.write_store_by_chunk``), then runs ``zoo train`` (``--model stats``, one
epoch: the point is the memory, not the model), ``zoo eval``, ``zoo verify`` (with and without
recomputing the statistics) and ``zoo info`` on it, each with ``--max-memory``, each in its own
process, and prints each one's peak resident memory (the kernel's ``ru_maxrss`` of that process)
against the budget and against what :mod:`dws.stream.memory` accounts for. The store is deleted
afterwards unless ``--keep``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's zoo and dws, not another install

from dws.stream import WeightStoreLoader  # noqa: E402
from dws.stream.batch import Batch  # noqa: E402
from dws.stream.synthetic import write_synthetic_store  # noqa: E402
from dws.stream.windows import WINDOW, WindowStream, derived_generator  # noqa: E402

WIDTHS = (784, 128, 128, 10)


class ConcatThenGather(WindowStream):
    """The window as built before: all chunks, concatenated, gathered, normalized into a copy."""

    def load(self, k, window, epoch):
        parts = [self._part(lo, hi) for lo, hi in window]
        block = Batch.cat(parts)
        del parts
        generator = derived_generator(self.seed, epoch, WINDOW, k)
        if self.shuffle:
            block = block.take(torch.randperm(len(block), generator=generator))
        ws = self.normalizer.normalize(block.ws) if self.normalizer is not None else block.ws
        return Batch(ws, block.target, block.index)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak() -> None:
    """Start the process's peak resident memory (VmHWM) afresh (Linux: clear_refs 5)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_bytes() -> int:
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def measure(root: str, side: str, buffer_chunks: int) -> dict:
    """One side, in this (fresh) process: peak memory and seconds to the first batch."""
    torch.set_num_threads(1)
    loader = WeightStoreLoader(root, "train", batch_size=32, in_memory=False, buffer_chunks=buffer_chunks)
    if side == "baseline":
        stream = loader._stream
        baseline = ConcatThenGather(stream.root, stream.pieces, stream.split_start, loader.targets,
                                    buffer_chunks=buffer_chunks, shuffle=True, seed=loader.seed,
                                    normalizer=loader.normalizer, augment=None, keep=stream.keep)
        loader._stream = baseline
    before = rss_bytes()
    reset_peak()
    t0 = time.perf_counter()
    batch = next(iter(loader))
    seconds = time.perf_counter() - t0
    peak = peak_bytes()
    digest = hashlib.sha256()
    for t in [*batch.ws.weights, *batch.ws.biases, batch.index]:
        digest.update(t.numpy().tobytes())
    return {"peak_above_start": peak - before, "seconds": seconds, "digest": digest.hexdigest()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--networks", type=int, default=1024)
    p.add_argument("--chunk-size", type=int, default=256)
    p.add_argument("--rounds", type=int, default=2, help="times each side runs, alternated")
    p.add_argument("--commands", type=Path, metavar="DIR",
                   help="measure zoo train/eval/verify/info on a large store written (or reused) in DIR")
    p.add_argument("--gigabytes", type=float, default=30, help="--commands: the store's size")
    p.add_argument("--max-memory", default="4G", help="--commands: the budget given to each command")
    p.add_argument("--keep", action="store_true", help="--commands: keep DIR (the store and the run) afterwards")
    p.add_argument("--only", default=",".join(COMMANDS), help=f"--commands: which of {','.join(COMMANDS)} to run")
    p.add_argument("--train-limit", type=int, default=None,
                   help="--commands: zoo train --train-limit N (a shorter epoch; still streamed if over the budget)")
    p.add_argument("--measure", nargs=3, metavar=("ROOT", "SIDE", "BUFFER_CHUNKS"), help=argparse.SUPPRESS)
    if argv is None and sys.argv[1:2] == ["--run-measured"]:  # FILE SCRIPT ARGS...: not parsed here
        run_measured(sys.argv[2], sys.argv[3], sys.argv[4:])
        return
    args = p.parse_args(argv)
    if args.measure:
        root, side, chunks = args.measure
        print(json.dumps(measure(root, side, int(chunks))))
        return
    if args.commands:
        commands(args.commands, args.gigabytes, args.max_memory, args.keep, args.only.split(","), args.train_limit)
        return

    with tempfile.TemporaryDirectory() as tmp:
        root = write_synthetic_store(f"{tmp}/store", widths=WIDTHS, num_networks=args.networks,
                                     chunk_size=args.chunk_size)
        loader = WeightStoreLoader(root, "train", in_memory=False)
        chunks = len(loader._stream.pieces)  # one window: the whole train split
        window_bytes = loader.split_bytes
        results = {"loader": [], "baseline": []}
        for _ in range(args.rounds):
            for side in ("baseline", "loader"):
                out = subprocess.run([sys.executable, __file__, "--measure", str(root), side, str(chunks)],
                                     check=True, capture_output=True, text=True, env={**os.environ,
                                                                                     "OMP_NUM_THREADS": "1"})
                results[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
    digests = {r["digest"] for rs in results.values() for r in rs}
    print(f"store: {args.networks} random {'-'.join(map(str, WIDTHS))} networks, chunks of {args.chunk_size}; "
          f"one shuffle window of the train split: {chunks} chunks, {window_bytes / 2**20:.0f} MiB")
    print(f"{'side':10s} {'peak above start, MiB':>22s} {'x window':>9s} {'first batch, s':>15s}")
    for side, rs in results.items():
        for r in rs:
            print(f"{side:10s} {r['peak_above_start'] / 2**20:22.0f} {r['peak_above_start'] / window_bytes:9.2f} "
                  f"{r['seconds']:15.2f}")
    best = {side: (min(r["peak_above_start"] for r in rs), min(r["seconds"] for r in rs))
            for side, rs in results.items()}
    print(f"baseline / loader: memory {best['baseline'][0] / best['loader'][0]:.2f}x, "
          f"time {best['baseline'][1] / best['loader'][1]:.2f}x (best of {args.rounds} each); "
          f"batches {'equal' if len(digests) == 1 else 'DIFFER'}")


LARGE_CHUNK = 894  # networks per chunk of the fmnist-classifiers zoo: 423 MB


def write_large_store(root: Path, gigabytes: float) -> Path:
    """A store of ``gigabytes`` of 784-128-128-10 networks, written chunk by chunk with the store's
    own writer: every full chunk holds the same random networks, so the statistics are one chunk's
    moments combined (exact, and what ``zoo verify`` recomputes) instead of a float64 pass over
    every train chunk, and memory stays at a few chunks whatever the store's size."""
    import numpy as np
    import pyarrow as pa

    from zoo.fit.siren import SirenSpec
    from zoo.store.finish import finish
    from zoo.store.format import parameter_shapes
    from zoo.store.manifest import software_versions
    from zoo.store.stats import chunk_train_moments, reduce_moments, row_status, write_stats
    from zoo.store.writer import (chunk_bounds, chunk_layout, consolidate_rows, create_store, mark_chunks_complete,
                                  write_chunk)

    spec = SirenSpec(WIDTHS)
    shapes = parameter_shapes(spec.widths)
    per_network = 4 * sum(int(np.prod(s)) for s in shapes.values())
    n = int(gigabytes * 1e9 // per_network)
    counts = [int(n * 0.75), int(n * 0.125)]
    counts.append(n - sum(counts))
    names = ("train", "val", "test")
    starts = np.cumsum([0] + counts[:-1])
    splits = {name: {"start": int(s), "count": c, "items": c} for name, s, c in zip(names, starts, counts)}
    train_stop = counts[0]
    rng = np.random.default_rng(0)
    block = {name: rng.standard_normal((LARGE_CHUNK, *shape), dtype=np.float32) * 0.1 for name, shape in shapes.items()}
    split_of = np.repeat(np.array(names), counts)
    metadata = {"kind": "synthetic", "description": "fake classifier-shaped weights (window_memory.py --commands)",
                "architecture": spec.to_manifest(), "targets": ["label"],
                "generation": {"seed": 0, "views": 1, "fit": {"steps": 100}},
                "source": {"kind": "image", "source": "synthetic", "image_shape": [28, 28, 1]},
                "software": software_versions()}
    manifest = create_store(root, widths=spec.widths, num_networks=n, chunk_size=LARGE_CHUNK, splits=splits,
                            metadata=metadata, overwrite=True)
    fragments, moments, full = {}, [], None
    for index in tqdm(range(manifest["num_chunks"]), desc="writing chunks", unit="chunk"):
        lo, hi = chunk_bounds(manifest, index)
        rows = pa.table({
            "index": pa.array(np.arange(lo, hi), pa.int64()),
            "split": pa.array(split_of[lo:hi].tolist(), pa.string()),
            "label": pa.array(np.arange(lo, hi) % 10, pa.int64()),
            "psnr": pa.array(np.full(hi - lo, 30.0, np.float32)),
            "steps": pa.array(np.full(hi - lo, 100), pa.int64()),
        })
        params = {name: values[: hi - lo] for name, values in block.items()}
        fragments[index] = write_chunk(root, index, params, rows, chunk_layout(manifest))
        if lo < train_stop:
            if hi <= train_stop and hi - lo == LARGE_CHUNK:  # a full train chunk: the same moments every time
                full = full or chunk_train_moments(params, lo, train_stop, row_status(rows, lo, hi))
                moments.append(full)
            else:
                moments.append(chunk_train_moments(params, lo, train_stop, row_status(rows, lo, hi)))
    mark_chunks_complete(root, manifest, fragments)
    consolidate_rows(root, manifest)
    reduced, _ = reduce_moments(moments)
    finish(root, manifest, {"normalization": write_stats(root, reduced, manifest)})
    return root


def run_measured(peak_file: str, script: str, argv: list[str]) -> None:
    """Run ``script`` as ``__main__`` with ``argv`` in this process and write its peak resident memory
    (VmHWM: this process's own, which a fork's ``ru_maxrss`` is not: it starts from the parent's)
    to ``peak_file`` at exit."""
    import atexit
    import runpy

    atexit.register(lambda: Path(peak_file).write_text(str(peak_bytes())))
    sys.argv = [script, *argv]
    runpy.run_path(script, run_name="__main__")


def peak_of(argv: list[str]) -> tuple[int, float, int, str]:
    """Run the ``zoo`` command ``argv`` (niced) in its own process: its peak resident memory, seconds,
    exit code, last output line."""
    with tempfile.NamedTemporaryFile(suffix=".peak") as peak:
        t0 = time.perf_counter()
        done = subprocess.run(["nice", "-n", "19", sys.executable, __file__, "--run-measured", peak.name, *argv],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "2"})
        seconds = time.perf_counter() - t0
        peak_text = Path(peak.name).read_text()
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    return int(peak_text or 0), seconds, done.returncode, (lines[-1] if lines else "")


COMMANDS = ("train", "eval", "verify", "verify-no-recompute", "info")


def commands(folder: Path, gigabytes: float, max_memory: str, keep: bool, only=COMMANDS,
             train_limit: int | None = None) -> None:
    """Each command's peak memory on a store of ``gigabytes`` (module docstring)."""
    import shutil

    from dws.stream.memory import model_bytes, plan_memory
    from dws.tasks.options import TrainOptions
    from dws.tasks.prepare import prepare_run
    from zoo.options import format_size, parse_size
    from zoo.store import StoreError, WeightStore
    from zoo.store.verify import memory_needs

    folder.mkdir(parents=True, exist_ok=True)
    root, run = folder / "store", folder / "run"
    try:
        store = WeightStore(root)
    except StoreError:
        t0 = time.perf_counter()
        write_large_store(root, gigabytes)
        store = WeightStore(root)
        print(f"wrote {root} in {time.perf_counter() - t0:.0f} s")
    budget = parse_size(max_memory)
    zoo = [str(Path(__file__).resolve().parents[1] / "cli.py")]
    train = ["--model", "stats", "--hidden-channels", "16", "--input-reduction", "16", "--epochs", "1", "--lr", "1e-3",
             "--batch-size", "128", "--precise-bn", "1024", "--out", str(run), "--restart",
             *([] if train_limit is None else ["--train-limit", str(train_limit)])]
    prepared = prepare_run(TrainOptions(store=str(root), model="stats", hidden_channels=16, input_reduction=16,
                                        epochs=1, lr=1e-3, batch_size=128, precise_bn=1024, out=str(run),
                                        max_memory=budget, train_limit=train_limit), log=lambda *_: None)
    accounted = {"zoo train": prepared.memory}
    split_sizes = {name: len(range(*store.split_range(name))) for name in ("train", "val", "test")}
    print(f"store: {store.num_networks} networks of {'-'.join(map(str, WIDTHS))} ({store.size_on_disk() / 1e9:.1f} GB on "
          f"disk; splits {split_sizes}), chunks of {store.chunk_size}; --max-memory {format_size(budget)}")
    print(prepared.memory.describe())
    rows = []
    for key, name, argv in (("train", "zoo train", [*zoo, "train", str(root), *train]),
                            ("eval", "zoo eval", [*zoo, "eval", str(run), str(root), "--split", "test"]),
                            ("verify", "zoo verify", [*zoo, "verify", str(root)]),
                            ("verify-no-recompute", "zoo verify --no-recompute",
                             [*zoo, "verify", str(root), "--no-recompute"]),
                            ("info", "zoo info", [*zoo, "info", str(root)])):
        if key not in only:
            continue
        peak, seconds, code, last = peak_of([*argv, "--max-memory", max_memory])
        if name == "zoo eval" and code == 0:
            from dws.tasks.rundir import load_run

            accounted[name] = plan_memory(budget, store, {"test": split_sizes["test"]}, shuffled=None, batch_size=512,
                                          model_bytes=model_bytes(load_run(run).model), training=False)
        if name.startswith("zoo verify"):
            need = sum(memory_needs(store.manifest, "no-recompute" not in name).values())
        else:
            need = accounted[name].peak if name in accounted else None
        rows.append((name, peak, need, seconds, code, last))
    print(f"{'command':28s} {'peak RSS':>10s} {'accounted':>10s} {'budget':>10s} {'peak/budget':>12s} {'s':>6s}  exit")
    for name, peak, need, seconds, code, last in rows:
        shown = format_size(need) if need else "-"
        print(f"{name:28s} {format_size(peak):>10s} {shown:>10s} {format_size(budget):>10s} {peak / budget:12.2f} "
              f"{seconds:6.0f}  {code}{'' if code == 0 else ': ' + last}")
    if not keep:
        shutil.rmtree(folder)
        print(f"removed {folder}")


if __name__ == "__main__":
    main()
