"""Batched classifier training vs one network at a time, measured in one run.

    python benchmarks/classifier_throughput.py [--kind cifar10|fmnist] [--networks N] [--single N]
        [--steps S] [--threads 1] [--data-root DIR [--dataset NAME] [--source-option KEY=VALUE ...]]

Both sides make the same zoo networks: the same initialization, the same batches, the same number
of Adam steps, then the test accuracy of every stored checkpoint (cifar10: the final network on
its pair's test images; fmnist: a checkpoint every 2 steps on the 10,000 test images). The batched
side is ``zoo.train`` (stacked parameters, batched matmuls, one Adam over all networks); the
single side is a plain ``nn.Sequential`` + ``torch.optim.Adam`` loop with autograd, one network
after the other, evaluating with ``net(x).argmax``. The two sides alternate, a group of batched
networks then a share of the single ones, so that the machine's drifting speed affects both
alike. Without ``--data-root`` the images are synthetic (class prototypes plus noise) of the
kind's shape and count; the speed does not depend on the pixels.

Prints networks/s, the ratio, GFLOP/s (matmul FLOPs of training and evaluation) and the share of
the CPU's peak: nominal (cores x GHz x 32 float32 FLOP/cycle, i.e. two 256-bit FMA units of
8 lanes x 2 FLOP: Zen 3 / AVX2) and measured (the best large square float32 matmul here).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, replace

import numpy as np
import torch

from zoo.generate.kinds import get_kind
from zoo.sources import get_source
from zoo.train.data import ClassifierData, batch_plan, classifier_data, input_vectors, normalized
from zoo.train.mlp import MlpSpec
from zoo.train.reference import train_one
from zoo.train.runs import draw_run
from zoo.train.trainer import default_group, flushed_denormals, train_runs


@dataclass(frozen=True)
class Setup:
    kind: str
    dataset: str
    train_images: int  # synthetic data: as many as the real data at hand
    steps: int  # default steps per network (cifar10: 2 epochs of a pair of the two batches at hand)


SETUPS = {
    "cifar10": Setup("cifar10-classifiers", "cifar10", 20_000, 64),
    "fmnist": Setup("fmnist-classifiers", "fashion-mnist", 60_000, 20),
}


def synthetic(kind, train_images: int, test_images: int = 10_000, seed: int = 0) -> ClassifierData:
    rng = np.random.default_rng(seed)
    shape = kind.image_shape
    prototypes = 128 + rng.normal(0, 3, (10, *shape))  # faint class signals: accuracies below 1

    def images(n):
        labels = rng.integers(0, 10, n)
        pixels = np.clip(prototypes[labels] + rng.normal(0, 60, (n, *shape)), 0, 255).astype(np.uint8)
        return input_vectors(pixels), labels.astype(np.int64)

    train, test = images(train_images), images(test_images)
    return ClassifierData(train[0], train[1], test[0], test[1], shape, kind.input_mean, kind.input_std)


def matmul_flops(widths, rows: int, backward: bool) -> float:
    """Multiply-add FLOPs of a forward pass over ``rows`` inputs, plus the backward pass's weight
    gradients and (every layer but the first) input gradients."""
    layers = [a * b for a, b in zip(widths[:-1], widths[1:])]
    forward = 2 * rows * sum(layers)
    return forward + (2 * rows * sum(layers) + 2 * rows * sum(layers[1:]) if backward else 0)


def network_flops(spec, data, run, schedule) -> float:
    plan = batch_plan(run, data.train_labels, schedule)
    rows = int((plan.targets >= 0).sum())
    test_rows = int(np.isin(data.test_labels, run.classes).sum())
    checkpoints = len(schedule.checkpoint_steps(plan.steps))
    return matmul_flops(spec.widths, rows, True) + checkpoints * matmul_flops(spec.widths, test_rows, False)


def measured_peak(threads: int, size: int = 2048) -> float:
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    best = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        a @ b
        best = max(best, 2 * size**3 / (time.perf_counter() - t0))
    return best


def single_side(spec, data, run, schedule) -> list[float]:
    """The plain loop: train, and evaluate each checkpoint with net(x).argmax on the run's test images."""
    x_test = normalized(data, "test")
    labels = torch.from_numpy(data.test_labels)
    keep = torch.isin(labels, torch.tensor(run.classes))
    x, y, classes = x_test[keep], labels[keep], torch.tensor(run.classes)
    accuracies = []

    def evaluate(step, net):
        with torch.no_grad():
            accuracies.append((classes[net(x)[:, classes].argmax(1)] == y).float().mean().item())

    train_one(spec, data, run, schedule, at_checkpoint=evaluate)
    return accuracies


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kind", choices=sorted(SETUPS), default="cifar10")
    p.add_argument("--networks", type=int, default=None, help="runs trained by the batched side (default 64 / 16)")
    p.add_argument("--single", type=int, default=None, help="runs trained one at a time (default 8 / 2)")
    p.add_argument("--steps", type=int, default=None, help="Adam steps per run (default: cifar10 64, fmnist 20)")
    p.add_argument("--threads", type=int, default=1, help="torch threads for both sides")
    p.add_argument("--group", type=int, default=None, help="networks trained together (default: zoo.train's)")
    p.add_argument("--data-root", default=None, help="real data (default: synthetic images of the kind's shape)")
    p.add_argument("--dataset", default=None)
    p.add_argument("--source-option", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--ghz", type=float, default=2.45, help="nominal clock for the nominal peak")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    setup = SETUPS[args.kind]
    kind = get_kind(setup.kind)
    networks = args.networks or (64 if args.kind == "cifar10" else 16)
    singles = args.single or (8 if args.kind == "cifar10" else 2)
    steps = args.steps or setup.steps
    if args.data_root:
        options = {k: json.loads(v) for k, v in (o.split("=", 1) for o in args.source_option)}
        data = classifier_data(get_source(args.dataset or setup.dataset, args.data_root, **options),
                               kind.input_mean, kind.input_std)
    else:
        data = synthetic(kind, setup.train_images)
    spec = MlpSpec(kind.widths)
    schedule = replace(kind.schedule, steps=steps)
    runs = [draw_run(0, r, 10, kind.classes_per_run, schedule.lr) for r in range(networks)]
    group = args.group or default_group(schedule, data.input_size, "cpu")

    with flushed_denormals("cpu"):
        train_runs(spec, data, runs[:2], replace(schedule, steps=2))  # warm both sides up (data, MKL, Adam)
        single_side(spec, data, runs[0], replace(schedule, steps=2))
        starts = list(range(0, networks, group))
        single_ids = np.array_split(np.arange(singles), len(starts))
        t_batched = t_single = 0.0
        batched_acc, single_acc = [], []
        for start, ids in zip(starts, single_ids):
            t0 = time.perf_counter()
            batched_acc += [r.test_accuracy[-1] for r in train_runs(spec, data, runs[start : start + group], schedule)]
            t_batched += time.perf_counter() - t0
            t0 = time.perf_counter()
            single_acc += [single_side(spec, data, runs[i], schedule)[-1] for i in ids]
            t_single += time.perf_counter() - t0
    per_run = len(schedule.checkpoint_steps(steps))
    flops = [network_flops(spec, data, r, schedule) for r in runs]
    nominal = args.threads * args.ghz * 1e9 * 32
    peak = measured_peak(args.threads)
    rows = [
        ("one at a time (nn.Sequential + torch.optim.Adam)", singles, singles * per_run / t_single,
         sum(flops[:singles]) / t_single, float(np.mean(single_acc))),
        (f"batched (zoo.train, {group} at once)", networks, networks * per_run / t_batched,
         sum(flops) / t_batched, float(np.mean(batched_acc[:singles]))),
    ]
    print(f"\n{kind.name} {'-'.join(map(str, kind.widths))}, batch {schedule.batch_size}, {steps} Adam steps per run, "
          f"{per_run} evaluated checkpoint(s) per run, {args.threads} thread(s), "
          f"{'real data' if args.data_root else 'synthetic data'} ({len(data.train_labels)} train images)")
    print(f"{'method':<50} {'runs':>5} {'nets/s':>8} {'ratio':>6} {'GFLOP/s':>8} {'% nominal':>10} "
          f"{'% measured':>11} {'acc (first ' + str(singles) + ')':>15}")
    base = rows[0][2]
    for name, n, rate, fl, acc in rows:
        print(f"{name:<50} {n:>5} {rate:>8.2f} {rate / base:>5.2f}x {fl / 1e9:>8.1f} {100 * fl / nominal:>9.0f}% "
              f"{100 * fl / peak:>10.0f}% {acc:>15.4f}")
    print(f"\npeak: nominal {nominal / 1e9:.1f} GFLOP/s ({args.threads} x {args.ghz} GHz x 32 FLOP/cycle), "
          f"measured {peak / 1e9:.1f} GFLOP/s (best 2048^3 float32 matmul, {args.threads} thread(s))")
    print(f"ceiling of the ratio at the measured peak: {peak / rows[0][3]:.2f}x")


if __name__ == "__main__":
    main()
