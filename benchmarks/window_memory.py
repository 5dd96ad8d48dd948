"""Memory and time of one streaming shuffle window: the loader vs concatenate-then-gather.

    python benchmarks/window_memory.py [--networks 1024] [--chunk-size 256] [--rounds 2]

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

from dws.stream import WeightStoreLoader
from dws.stream.batch import Batch
from dws.stream.synthetic import write_synthetic_store
from dws.stream.windows import WINDOW, WindowStream, derived_generator

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
    p.add_argument("--measure", nargs=3, metavar=("ROOT", "SIDE", "BUFFER_CHUNKS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.measure:
        root, side, chunks = args.measure
        print(json.dumps(measure(root, side, int(chunks))))
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


if __name__ == "__main__":
    main()
