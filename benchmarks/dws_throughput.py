"""Forward+backward throughput and peak memory of the MNIST-INR DWSNet: accelerated vs plain vs block-by-block.

    python benchmarks/dws_throughput.py [--batches 64 512] [--iters 20] [--threads 2] [--malloc-tuning]
    python benchmarks/dws_throughput.py --device cuda --batches 64 512 4096 --iters 50 --ref-iters 20

Rows (``--impls`` picks some): ``fused`` is the model accelerated with ``dws.nn.fast.accelerate``
(backend ``auto``: the native CPU kernels of ``dws/nn/fast/kernels.c`` where they apply, as
``zoo train`` runs it), ``fused-pytorch`` the same with backend ``pytorch`` (PyTorch operators only;
CPU only, on a GPU it is the ``fused`` row), ``plain`` the plain modules of ``dws.nn`` (the
straightforward computation), and ``block-by-block`` the plain model with each DWS layer evaluated
one block of the paper's tables at a time (``dws/nn/reference.py``), the baseline of the speed-up
column. All hold the same parameters; the accelerated outputs are compared with the plain ones
first. Each measurement runs in a fresh
subprocess so that peak memory is the growth of the process's max RSS (``resource.getrusage``)
over the setup (model + input built, before the first step): it counts every allocation of the
forward and backward pass, including PyTorch's C++ buffers that ``tracemalloc`` cannot see.
Throughput is the batch size over the median wall time of ``--iters`` timed steps after two warm-ups.
Workers run with the OpenMP wait policy of the environment, as ``zoo train`` does: the default
(threads spin briefly between operators, then sleep) is 1.5-1.7x faster at batch 64 than
``OMP_WAIT_POLICY=PASSIVE``, which puts the second thread to sleep after each of a step's ~1,500
small operators (the benchmark forced PASSIVE until 2026-11-23 and under-reported by that much).
The parent process, which only checks that both implementations agree, uses one thread so that
no idle OpenMP thread of its own competes with the workers.
Both implementations' workers keep freed large tensors in the heap, as ``zoo train`` does
(:func:`dws.tasks.allocator.retain_freed_memory`): otherwise every step page-faults its
activations in again (~3-6 us per 4 KiB page here). ``--no-malloc-tuning`` measures without.
On a GPU (``--device cuda``) each step is synchronized before the clock is read, and peak memory is
the growth of ``torch.cuda.max_memory_allocated`` over the setup.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dws import DWSNetInvariant, WeightSpace, dwsnet_mnist_inr_config  # noqa: E402
from dws.nn.fast import accelerate  # noqa: E402
from dws.nn.reference import with_reference_layers  # noqa: E402
from dws.tasks.allocator import retain_freed_memory  # noqa: E402

BACKENDS = {"fused": "auto", "fused-pytorch": "pytorch", "plain": "plain"}  # row -> accelerate()'s backend
IMPLS = (*BACKENDS, "block-by-block")


def build(impl: str, batch: int, seed: int = 0, device: str = "cpu"):
    torch.manual_seed(seed)
    model = DWSNetInvariant(**dwsnet_mnist_inr_config())
    if impl == "block-by-block":
        model = with_reference_layers(copy.deepcopy(model))
    else:
        model = accelerate(model, BACKENDS[impl])
    widths = dwsnet_mnist_inr_config()["widths"]
    n = sum(a * b for a, b in zip(widths[:-1], widths[1:])) + sum(widths[1:])
    ws = WeightSpace.unflatten(torch.randn(batch, n, generator=torch.Generator().manual_seed(seed)), widths)
    return model.to(device), ws.to(device)


def step(model, ws) -> None:
    model.zero_grad(set_to_none=True)
    model(ws).square().mean().backward()
    if ws.weights[0].is_cuda:
        torch.cuda.synchronize()


def _memory_kib(device: str) -> float:
    if device == "cpu":
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return torch.cuda.max_memory_allocated() / 1024


def worker(impl: str, batch: int, iters: int, threads: int, malloc_tuning: bool, device: str = "cpu") -> dict:
    if malloc_tuning and device == "cpu":
        retain_freed_memory()
    torch.set_num_threads(threads)
    model, ws = build(impl, batch, device=device)
    base_kib = _memory_kib(device)
    for _ in range(2):  # warm-up
        step(model, ws)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        step(model, ws)
        times.append(time.perf_counter() - start)
    peak_kib = _memory_kib(device)
    med = statistics.median(times)
    return dict(impl=impl, batch=batch, samples_per_s=batch / med, best_samples_per_s=batch / min(times),
                peak_mib=(peak_kib - base_kib) / 1024)


def check_same_function(impl: str, batch: int = 16, device: str = "cpu") -> float:
    """max |logits of ``impl`` - logits of the plain model| on one batch."""
    model, ws = build(impl, batch, device=device)
    plain, _ = build("plain", batch, device=device)
    with torch.no_grad():
        return (model(ws) - plain(ws)).abs().max().item()


def _device_name(device: str) -> str:
    return "cpu" if device == "cpu" else torch.cuda.get_device_name(torch.device(device))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 512])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--ref-iters", type=int, default=3, help="timed steps for the (slow) reference")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--malloc-tuning", action=argparse.BooleanOptionalAction, default=True,
                        help="keep freed large buffers in glibc's heap (fewer page faults), both implementations")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS), help="rows to measure")
    parser.add_argument("--worker", nargs=2, metavar=("IMPL", "BATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        impl, batch = args.worker[0], int(args.worker[1])
        print(json.dumps(worker(impl, batch, args.iters, args.threads, args.malloc_tuning, args.device)))
        return

    torch.set_num_threads(1)  # the workers time; a spinning thread here would compete with them
    model, _ = build("fused", 1)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"MNIST-INR DWSNet {dwsnet_mnist_inr_config()['widths']}, 4 DWS layers, {n_params:,} parameters, "
          f"torch {torch.__version__}, device {_device_name(args.device)}, {args.threads} threads, "
          f"malloc tuning {'on' if args.malloc_tuning else 'off'}, "
          f"load average {os.getloadavg()[0]:.1f}")
    impls = [i for i in args.impls if not (i == "fused-pytorch" and args.device != "cpu")]  # (CPU kernels)
    for impl in impls:
        if impl not in ("plain", "block-by-block"):
            print(f"max |{impl} - plain| on the logits: {check_same_function(impl, device=args.device):.2e}")
    rows = []
    for batch in args.batches:
        for impl in impls:
            iters = args.ref_iters if impl == "block-by-block" else args.iters
            cmd = [sys.executable, __file__, "--worker", impl, str(batch), "--iters", str(iters),
                   "--threads", str(args.threads), "--device", args.device,
                   "--malloc-tuning" if args.malloc_tuning else "--no-malloc-tuning"]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            rows.append(json.loads(out))
    print(f"{'batch':>5}  {'implementation':<15} {'samples/s (median)':>19} {'(best)':>8} {'peak MiB':>9} {'speed-up':>9}")
    for r in rows:
        ref = next((x for x in rows if x["batch"] == r["batch"] and x["impl"] == "block-by-block"), None)
        ratio = f"{r['samples_per_s'] / ref['samples_per_s']:>8.2f}x" if ref else f"{'-':>9}"
        print(f"{r['batch']:>5}  {r['impl']:<15} {r['samples_per_s']:>19.1f} {r['best_samples_per_s']:>8.1f} "
              f"{r['peak_mib']:>9.1f} {ratio}")


if __name__ == "__main__":
    main()
