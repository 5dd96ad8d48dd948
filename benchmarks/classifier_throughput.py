"""Batched classifier training vs one network at a time, measured in one run, on a CPU or a GPU.

    python benchmarks/classifier_throughput.py [--kind cifar10|fmnist] [--device cpu|cuda]
        [--networks N] [--single N] [--steps S] [--chunk-runs N] [--time-limit SECONDS] [--threads T]
        [--data-root DIR [--dataset NAME] [--source-option KEY=VALUE ...]]
        [--train-images N] [--test-images N] [--json PATH]

Both sides make the same zoo networks: the same initialization, the same batches, the same number
of Adam steps, then the test accuracy of every stored checkpoint (cifar10: the final network on
its pair's test images; fmnist: a checkpoint every 2 steps on the 10,000 test images), and both
bring every checkpoint's parameters to the host.

* **batched**: what ``zoo generate`` computes for a chunk, without writing the store:
  ``zoo.train.train_runs`` on a chunk's runs into host arrays (``--chunk-runs``; default on a CPU
  the trainer's group, on a GPU the runs of a default 1,024-network chunk: 6 Fashion-MNIST runs,
  1,024 CIFAR-10 runs).
* **one at a time** (the naive loop): a plain ``nn.Sequential`` + ``torch.optim.Adam`` with
  autograd on the same device, one run after the other, ``loss.item()`` every step, every
  checkpoint evaluated with ``net(x).argmax`` and ``.item()`` and its parameters copied to the
  host. It runs only the first ``--single`` runs: **a subset**; the ratio compares rates
  (networks per second), and the full zoo's naive time is extrapolated from it.

The sides alternate, a chunk of batched runs then a share of the naive ones, so that a drifting
machine affects both alike; each side stops starting work once it has run ``--time-limit``
seconds, and its rate counts what it finished. Without ``--data-root`` the images are synthetic
(class prototypes plus noise) of the kind's shape and count; the speed does not depend on the
pixels. On a GPU the defaults are the paper's zoos: the full schedules (fmnist 295 steps and 149
checkpoints per run; cifar10 two epochs over a pair's 10,000 images of full-size CIFAR-10, 158
steps), 200 / 5,000 batched runs, 10 / 100 naive ones.

Prints networks/s, seconds per run, the ratio, GFLOP/s (matmul FLOPs of training and evaluation,
per run the mean of the naive runs') and the share of the measured peak (the best large square
float32 matmul here, IEEE float32 on a GPU); on a CPU also of the nominal peak (cores x GHz x 32
float32 FLOP/cycle: two 256-bit FMA units of 8 lanes x 2 FLOP, Zen 3 / AVX2).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's zoo and dws, not another install

from zoo.generate.kinds import get_kind  # noqa: E402
from zoo.sources import get_source  # noqa: E402
from zoo.train.data import ClassifierData, batch_plan, classifier_data, input_vectors, normalized  # noqa: E402
from zoo.train.evaluate import full_float32  # noqa: E402
from zoo.train.mlp import MlpSpec, get_activation, init_params, reference_network  # noqa: E402
from zoo.train.runs import draw_run  # noqa: E402
from zoo.train.schedule import ADAM_BETAS, ADAM_EPS  # noqa: E402
from zoo.train.trainer import default_group, flushed_denormals, host_arrays, train_runs  # noqa: E402

ZOO_CHUNK = 1024  # zoo generate's default --chunk-size, in networks


@dataclass(frozen=True)
class Setup:
    kind: str
    dataset: str
    train_images: dict  # synthetic data, per device type: the real data at hand (CPU), the full set (GPU)
    steps: dict  # steps per run (None: the kind's schedule)
    networks: dict  # batched runs
    single: dict  # naive runs


SETUPS = {
    "cifar10": Setup("cifar10-classifiers", "cifar10", {"cpu": 20_000, "cuda": 50_000}, {"cpu": 64, "cuda": None},
                     {"cpu": 64, "cuda": 5_000}, {"cpu": 8, "cuda": 100}),
    "fmnist": Setup("fmnist-classifiers", "fashion-mnist", {"cpu": 60_000, "cuda": 60_000}, {"cpu": 20, "cuda": None},
                    {"cpu": 16, "cuda": 200}, {"cpu": 2, "cuda": 10}),
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


def synchronize(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measured_peak(device, size: int) -> float:
    """FLOP/s of the best of three ``size``^3 float32 matmuls (IEEE float32: no TF32)."""
    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
    best = 0.0
    with full_float32():
        a @ b
        for _ in range(3):
            synchronize(device)
            t0 = time.perf_counter()
            a @ b
            synchronize(device)
            best = max(best, 2 * size**3 / (time.perf_counter() - t0))
    return best


def naive_run(spec, data, run, schedule, device) -> list[float]:
    """The plain loop for one run (``zoo.train.reference.train_one``'s, on ``device``), evaluating
    every checkpoint and copying its parameters to the host. Returns the checkpoints' accuracies."""
    plan = batch_plan(run, data.train_labels, schedule)
    x_train = normalized(data, "train", device)
    labels = torch.from_numpy(data.test_labels)
    keep = torch.isin(labels, torch.tensor(run.classes))
    x_test, y_test = normalized(data, "test", device)[keep.to(device)], labels[keep].to(device)
    classes = torch.tensor(run.classes, device=device)
    every_class = run.classes == tuple(range(spec.num_classes))
    w, b = init_params(spec, [run.seed], [run.init_scale])
    net = reference_network([t[0] for t in w], [t[0] for t in b], get_activation(run.activation), run.dropout)
    net = net.to(device)
    opt = torch.optim.Adam(net.parameters(), lr=run.lr, betas=ADAM_BETAS, eps=ADAM_EPS, weight_decay=run.weight_decay)
    checkpoints = set(schedule.checkpoint_steps(plan.steps))
    accuracies, stored, losses = [], [], []

    def checkpoint():
        with torch.no_grad():
            predicted = classes[net(x_test)[:, classes].argmax(1)]
            accuracies.append((predicted == y_test).float().mean().item())
        stored.append([p.detach().to("cpu", copy=True) for p in net.parameters()])

    if 0 in checkpoints:
        checkpoint()
    for t in range(plan.steps):
        valid = plan.targets[t] >= 0
        out = net(x_train[torch.from_numpy(plan.indices[t][valid]).to(device)])
        target = torch.from_numpy(plan.targets[t][valid]).to(device)
        loss = F.cross_entropy(out if every_class else out[:, classes], target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if t + 1 in checkpoints:
            checkpoint()
    return accuracies


def check_against_cpu(spec, data, runs, schedule, device) -> str:
    """The GPU path's checkpoints and accuracies next to the CPU's for a few short runs: equal up to
    float rounding (a line to read, not a test)."""
    short = replace(schedule, steps=min(schedule.steps or 6, 6))
    gpu, cpu = (train_runs(spec, data, runs, short, device=d) for d in (device, "cpu"))
    worst = max(float(np.abs(a - b).max()) for g, c in zip(gpu, cpu) for a, b in zip(g.weights + g.biases,
                                                                                      c.weights + c.biases))
    same = sum(int(np.array_equal(g.test_accuracy, c.test_accuracy)) for g, c in zip(gpu, cpu))
    finite = all(np.isfinite(a).all() for g in gpu for a in g.weights + g.biases)
    return (f"{device} vs cpu, {len(runs)} runs x {short.steps} steps: largest parameter difference {worst:.2e}, "
            f"accuracies equal in {same} of {len(runs)} runs, parameters finite: {finite}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kind", choices=sorted(SETUPS), default="cifar10")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--networks", type=int, default=None,
                   help="runs trained by the batched side (default CPU 64 / 16, GPU the full zoo: 5000 / 200)")
    p.add_argument("--single", type=int, default=None,
                   help="runs trained one at a time, the first of the batched ones (default CPU 8 / 2, GPU 100 / 10)")
    p.add_argument("--steps", type=int, default=None,
                   help="Adam steps per run (default CPU 64 / 20, GPU the kind's schedule)")
    p.add_argument("--chunk-runs", type=int, default=None,
                   help="runs per train_runs call (default CPU the trainer's group, GPU a 1,024-network chunk)")
    p.add_argument("--time-limit", type=float, default=None,
                   help="seconds after which each side starts no more work (default: none)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default 1 on a CPU, untouched on a GPU)")
    p.add_argument("--group", type=int, default=None, help="networks trained together (default: zoo.train's)")
    p.add_argument("--data-root", default=None, help="real data (default: synthetic images of the kind's shape)")
    p.add_argument("--dataset", default=None)
    p.add_argument("--source-option", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--train-images", type=int, default=None, help="synthetic training images (default per kind)")
    p.add_argument("--test-images", type=int, default=10_000, help="synthetic test images")
    p.add_argument("--ghz", type=float, default=2.45, help="nominal clock for a CPU's nominal peak")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    where = "cuda" if device.type == "cuda" else "cpu"
    if where == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: CUDA is not available here")
    if args.threads or where == "cpu":
        torch.set_num_threads(args.threads or 1)
    setup = SETUPS[args.kind]
    kind = get_kind(setup.kind)
    networks = args.networks or setup.networks[where]
    singles = min(networks, args.single or setup.single[where])
    steps = args.steps or setup.steps[where]
    if args.data_root:
        options = {k: json.loads(v) for k, v in (o.split("=", 1) for o in args.source_option)}
        data = classifier_data(get_source(args.dataset or setup.dataset, args.data_root, **options),
                               kind.input_mean, kind.input_std)
    else:
        data = synthetic(kind, args.train_images or setup.train_images[where], args.test_images)
    spec = MlpSpec(kind.widths)
    schedule = replace(kind.schedule, steps=steps) if steps else kind.schedule
    runs = [draw_run(0, r, 10, kind.classes_per_run, schedule.lr) for r in range(networks)]
    plan = batch_plan(runs[0], data.train_labels, schedule)
    per_run = len(schedule.checkpoint_steps(plan.steps))
    chunk = args.chunk_runs or (max(1, ZOO_CHUNK // per_run) if where == "cuda" else
                                args.group or default_group(schedule, data.input_size, "cpu"))

    train_runs(spec, data, runs[:2], replace(schedule, steps=2), device=device, group=args.group)  # warm up
    check = check_against_cpu(spec, data, runs[:2], schedule, device) if where == "cuda" else None
    with flushed_denormals(device):
        naive_run(spec, data, runs[0], replace(schedule, steps=2), device)
    synchronize(device)
    starts = list(range(0, networks, chunk))
    single_ids = np.array_split(np.arange(singles), len(starts))
    limit = args.time_limit or float("inf")
    t_batched = t_single = 0.0
    batched_acc, single_acc = [], []
    for start, ids in zip(starts, single_ids):
        if t_batched < limit:
            part = runs[start : start + chunk]
            t0 = time.perf_counter()
            out = host_arrays(spec, per_run * len(part), device)  # what zoo generate's chunk task fills
            batched_acc += [r.test_accuracy[-1] for r in train_runs(spec, data, part, schedule, device=device,
                                                                     group=args.group, out=out)]
            synchronize(device)
            t_batched += time.perf_counter() - t0
            del out
        for i in ids:
            if t_single < limit:
                t0 = time.perf_counter()
                with flushed_denormals(device):
                    single_acc.append(naive_run(spec, data, runs[i], schedule, device)[-1])
                synchronize(device)
                t_single += time.perf_counter() - t0
    done_b, done_s = len(batched_acc), len(single_acc)
    flops = np.mean([network_flops(spec, data, runs[i], schedule) for i in range(max(1, done_s))])
    peak = measured_peak(device, 8192 if where == "cuda" else 2048)
    rows = [
        {"method": f"one at a time (nn.Sequential + torch.optim.Adam), first {done_s} runs: a subset",
         "runs": done_s, "seconds": t_single, "accuracy": float(np.mean(single_acc)) if single_acc else None},
        {"method": f"batched (zoo.train, chunks of {chunk} runs)", "runs": done_b, "seconds": t_batched,
         "accuracy": float(np.mean(batched_acc[:done_s])) if done_s else None},
    ]
    for row in rows:
        row["networks_per_s"] = row["runs"] * per_run / row["seconds"] if row["seconds"] else float("nan")
        row["seconds_per_run"] = row["seconds"] / row["runs"] if row["runs"] else float("nan")
        row["gflop_per_s"] = row["runs"] * flops / row["seconds"] / 1e9 if row["seconds"] else float("nan")
    ratio = rows[1]["networks_per_s"] / rows[0]["networks_per_s"]
    name = torch.cuda.get_device_name(device) if where == "cuda" else f"CPU, {torch.get_num_threads()} thread(s)"
    print(f"\n{kind.name} {'-'.join(map(str, kind.widths))} on {name}: batch {schedule.batch_size}, {plan.steps} Adam "
          f"steps and {per_run} evaluated checkpoint(s) per run, "
          f"{'real data' if args.data_root else 'synthetic data'} ({len(data.train_labels)} train, "
          f"{len(data.test_labels)} test images)")
    nominal = (args.threads or 1) * args.ghz * 1e9 * 32
    print(f"{'method':<72} {'runs':>5} {'nets/s':>9} {'s/run':>8} {'ratio':>7} {'GFLOP/s':>9} {'% peak':>7}"
          + (f" {'% nominal':>9}" if where == "cpu" else "") + f" {'acc (first ' + str(done_s) + ')':>15}")
    for row in rows:
        rate = row["networks_per_s"] / rows[0]["networks_per_s"]
        print(f"{row['method']:<72} {row['runs']:>5} {row['networks_per_s']:>9.2f} {row['seconds_per_run']:>8.4f} "
              f"{rate:>6.2f}x {row['gflop_per_s']:>9.1f} {100e9 * row['gflop_per_s'] / peak:>6.0f}%"
              + (f" {100e9 * row['gflop_per_s'] / nominal:>8.0f}%" if where == "cpu" else "")
              + f" {row['accuracy'] if row['accuracy'] is not None else float('nan'):>15.4f}")
    print(f"\nthe naive loop ran the first {done_s} of {networks} runs (a subset), the batched side {done_b}; "
          f"ratio of their rates: {ratio:.2f}x")
    print(f"the whole {networks}-run zoo at these rates: batched {rows[1]['seconds_per_run'] * networks:.1f} s "
          f"(measured on {done_b} runs), naive {rows[0]['seconds_per_run'] * networks:.1f} s (extrapolated)")
    print(f"measured peak: {peak / 1e9:.1f} GFLOP/s (best {8192 if where == 'cuda' else 2048}^3 float32 matmul)"
          + (f"; nominal {nominal / 1e9:.1f} GFLOP/s" if where == "cpu" else ""))
    if check:
        print(check)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"kind": kind.name, "device": name, "steps": plan.steps, "checkpoints_per_run": per_run,
                       "networks": networks, "ratio": ratio, "peak_gflop_per_s": peak / 1e9, "rows": rows,
                       "check": check}, f, indent=1)


if __name__ == "__main__":
    main()
