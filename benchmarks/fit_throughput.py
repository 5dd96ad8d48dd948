"""Batched SIREN fitting vs one network at a time, on real MNIST images, measured in one run.

    python benchmarks/fit_throughput.py [--networks 256] [--single 16] [--steps 200] [--threads 1] [--previous-step]

Both sides fit the same images for the same number of steps (no early stop) with the same
initialization; the single-network side uses ``torch.optim.Adam`` and autograd, one network after
the other (the published recipe). Prints networks/s, the ratio and the mean PSNR of both sides.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's zoo and dws, not another install

from zoo.fit import native  # noqa: E402
from zoo.fit.fitter import FitConfig, fit_batch  # noqa: E402
from zoo.fit.reference import fit_one  # noqa: E402
from zoo.fit.siren import Grid2D, SirenSpec  # noqa: E402
from zoo.sources import get_source  # noqa: E402


@contextlib.contextmanager
def without_native_kernels():
    """The fitter as it runs where the C kernels cannot be built (the PyTorch step)."""
    saved = native.library
    native.library = lambda: None
    try:
        yield
    finally:
        native.library = saved


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--networks", type=int, default=256, help="networks fitted by the batched fitter")
    p.add_argument("--single", type=int, default=16, help="networks fitted one at a time (the baseline)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--threads", type=int, default=1, help="torch threads for both sides")
    p.add_argument("--device", default="cpu")
    p.add_argument("--early-stop", action="store_true", help="also time the batched fit with the PSNR-40 stop")
    p.add_argument("--compile", action="store_true", help="also time the batched fit through torch.compile")
    p.add_argument("--previous-step", action="store_true",
                   help="also time the batched fit without the native C kernels (the PyTorch step)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    source = get_source("mnist-offline")
    targets = source.targets("train")[: args.networks]
    grid = Grid2D.square(28)
    spec = SirenSpec((2, 32, 32, 1))
    cfg = FitConfig(steps=args.steps, lr=args.lr, psnr_stop=None)

    warm = FitConfig(steps=2, lr=args.lr, psnr_stop=None)
    fit_batch(spec, grid.to(args.device), targets[:32], range(32), 0, warm, device=args.device)  # kernel builds
    fit_one(spec, grid.points(), targets[0], 0, 0, warm)  # first-call set-up of torch.optim.Adam
    if args.previous_step:
        with without_native_kernels():
            fit_batch(spec, grid, targets[:32], range(32), 0, warm)  # the PyTorch step's first call

    # The two sides alternate, one group of batched networks then a share of the single ones, so
    # that this machine's drifting speed (+-20% within minutes) affects both alike.
    group = 32 if args.device == "cpu" else args.networks
    starts = list(range(0, args.networks, group))
    singles = np.array_split(np.arange(args.single), len(starts))
    t_batched = t_single = t_previous = 0.0
    parts, previous_parts, single_psnr = [], [], []
    for start, single_ids in zip(starts, singles):
        ids = range(start, min(start + group, args.networks))
        t0 = time.perf_counter()
        parts.append(fit_batch(spec, grid.to(args.device), targets[ids.start : ids.stop], ids, 0, cfg, device=args.device))
        if args.device != "cpu":
            torch.cuda.synchronize()
        t_batched += time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in single_ids:
            _, _, mse, _ = fit_one(spec, grid.points(), targets[i], int(i), 0, cfg)
            single_psnr.append(10 * np.log10(1 / mse))
        t_single += time.perf_counter() - t0
        if args.previous_step:
            with without_native_kernels():
                t0 = time.perf_counter()
                previous_parts.append(fit_batch(spec, grid, targets[ids.start : ids.stop], ids, 0, cfg))
                t_previous += time.perf_counter() - t0
    batched_psnr = np.concatenate([part.psnr for part in parts])

    rows = [
        ("one at a time (torch.optim.Adam)", args.single, args.single / t_single, float(np.mean(single_psnr))),
        (f"batched ({args.networks}, {group} at once)", args.networks, args.networks / t_batched,
         float(batched_psnr[: args.single].mean())),
    ]
    if args.previous_step:
        previous_psnr = np.concatenate([part.psnr for part in previous_parts])
        rows.append(("batched, PyTorch step (no C)", args.networks, args.networks / t_previous,
                     float(previous_psnr[: args.single].mean())))
    if args.compile:
        fit_batch(spec, grid.to(args.device), targets[:32], range(32), 0, FitConfig(steps=2, lr=args.lr, psnr_stop=None),
                  device=args.device, compile=True)  # compile outside the timing
        t0 = time.perf_counter()
        comp = fit_batch(spec, grid.to(args.device), targets, range(args.networks), 0, cfg, device=args.device,
                         compile=True)
        rows.append(("batched, torch.compile", args.networks, args.networks / (time.perf_counter() - t0),
                     float(comp.psnr[: args.single].mean())))
    if args.early_stop:
        t0 = time.perf_counter()
        es = fit_batch(spec, grid.to(args.device), targets, range(args.networks), 0,
                       FitConfig(steps=args.steps, lr=args.lr, psnr_stop=40.0), device=args.device)
        rows.append(("batched + PSNR-40 early stop", args.networks, args.networks / (time.perf_counter() - t0),
                     float(es.psnr[: args.single].mean())))
    base = rows[0][2]
    print(f"\nMNIST SIREN 2-32-32-1, {args.steps} Adam steps (lr {args.lr}), {args.threads} torch thread(s), "
          f"device {args.device}")
    print(f"{'method':<36} {'nets':>6} {'nets/s':>9} {'ratio':>7} {'PSNR (dB, first ' + str(args.single) + ')':>24}")
    for name, n, rate, ps in rows:
        print(f"{name:<36} {n:>6} {rate:>9.2f} {rate / base:>6.1f}x {ps:>24.2f}")
    gap = abs(rows[0][3] - rows[1][3])
    print(f"\nPSNR gap batched vs single: {gap:.3f} dB ({'ok' if gap <= 0.5 else 'TOO LARGE'}; must be <= 0.5)")


if __name__ == "__main__":
    main()
