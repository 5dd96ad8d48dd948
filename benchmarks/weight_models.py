"""Training-step cost of every ``zoo train`` model on large input networks (classifier zoos).

    python benchmarks/weight_models.py                       # 784-128-128-128-10, the paper's DWSNet (d0' = 16, 16 channels)
    python benchmarks/weight_models.py --hidden-channels 24  # every model at ~4M parameters (the paper's count)
    python benchmarks/weight_models.py --widths 3072,64,64,64,64,10 --models dwsnet,mlp
    python benchmarks/weight_models.py --widths 2,32,32,1 --hidden-channels 48 --input-reduction 0 --batch 64 \
        --models dwsnet,nfn-np,nfn-hnp,ng-gnn,ng-transformer,scalegmn,scalegmn-b   # the MNIST INR models
    python benchmarks/weight_models.py --device cuda ...     # the same table on a GPU (each step synchronized)

Each model is built as ``zoo train`` builds it (``dws.tasks.models.build_model``: the DWSNet with
``--input-reduction``, the baselines sized to its parameter count) and trained with AdamW on a
regression loss, one batch of random input networks of ``--widths``, in a fresh subprocess: the
median wall time of ``--iters`` steps after two warm-ups, and the peak memory as the growth of the
process's max RSS over the setup (model, optimizer and input built; on a GPU, the growth of PyTorch's
peak allocated memory over the same setup). The ratio column is each
model's networks/s over the DWSNet's, measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dws.tasks.allocator import retain_freed_memory  # noqa: E402
from dws.tasks.models import build_model  # noqa: E402
from dws.tasks.options import MODELS  # noqa: E402
from dws.weightspace import WeightSpace  # noqa: E402
from zoo.devices import resolve_device  # noqa: E402

DEFAULT_MODELS = tuple(m for m in MODELS if m not in ("inr2vec",))  # INR2Vec is for INRs


def peak_memory_mb(device: str) -> float:
    """This process's peak so far: max RSS on the CPU, PyTorch's peak allocated memory on a GPU."""
    if device == "cpu":
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return torch.cuda.max_memory_allocated(device) / 2**20


def measure(args) -> dict:
    """One model's step time and peak memory (run in its own process)."""
    torch.set_num_threads(args.threads)
    retain_freed_memory()
    torch.manual_seed(0)
    widths, device = tuple(args.widths), args.device
    model, desc = build_model(args.model, widths, 1, hidden_channels=args.hidden_channels,
                              input_reduction=args.input_reduction or None, activation=args.activation)
    model = model.to(device)
    if args.model == "mlp-align":
        model.align_in_forward = False  # zoo train aligns the store once, before training
    n = sum(a * b for a, b in zip(widths[:-1], widths[1:])) + sum(widths[1:])
    ws = WeightSpace.unflatten(torch.randn(args.batch, n, generator=torch.Generator().manual_seed(0)) * 0.05,
                               widths).to(device)
    target = torch.rand(args.batch, 1).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()
    before = peak_memory_mb(device)
    times = []
    for i in range(args.iters + 2):
        t0 = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(ws), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if device != "cpu":
            torch.cuda.synchronize(device)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    peak = peak_memory_mb(device) - before
    return {"model": args.model, "params": desc["params"], "step_s": statistics.median(times), "peak_mb": peak}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--widths", type=lambda s: [int(x) for x in s.split(",")], default=[784, 128, 128, 128, 10])
    p.add_argument("--models", type=lambda s: s.split(","), default=list(DEFAULT_MODELS))
    p.add_argument("--hidden-channels", type=int, default=16)
    p.add_argument("--input-reduction", type=int, default=16, help="the DWSNet's d0' (0: none, as for INRs)")
    p.add_argument("--activation", default=None,
                   help="the input networks' activation, for ScaleGMN's symmetry (default: sine for 1-output "
                        "networks, the INRs; relu otherwise, the classifiers)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    p.add_argument("--model", help=argparse.SUPPRESS)  # a worker process: measure this one model
    args = p.parse_args()
    try:
        args.device = resolve_device(args.device)
    except ValueError as e:
        p.error(str(e))
    if args.activation is None:
        args.activation = "sine" if args.widths[-1] == 1 else "relu"
    if args.model:
        print(json.dumps(measure(args)))
        return
    order = ["dwsnet"] + [m for m in args.models if m != "dwsnet"]
    rows = []
    for model in order:
        cmd = [sys.executable, __file__, "--model", model, "--widths", ",".join(map(str, args.widths)),
               "--hidden-channels", str(args.hidden_channels), "--input-reduction", str(args.input_reduction),
               "--activation", args.activation, "--batch", str(args.batch), "--iters", str(args.iters), "--threads", str(args.threads),
               "--device", args.device]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            print(f"{model}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
            continue
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"{model}: {rows[-1]['step_s']:.4f} s/step", file=sys.stderr, flush=True)  # kept if the run is cut
    base = next(r for r in rows if r["model"] == "dwsnet")
    where = f"{args.threads} CPU thread(s)" if args.device == "cpu" else torch.cuda.get_device_name(args.device)
    print(f"input networks {'-'.join(map(str, args.widths))}, batch {args.batch}, {where}, "
          f"DWSNet: {args.hidden_channels} channels, d0' = {args.input_reduction}")
    print(f"{'model':<12} {'params':>11} {'s/step':>8} {'networks/s':>11} {'x DWSNet':>9} {'peak MB':>8}")
    for r in rows:
        rate = args.batch / r["step_s"]
        print(f"{r['model']:<12} {r['params']:>11,} {r['step_s']:>8.3f} {rate:>11.1f} "
              f"{rate / (args.batch / base['step_s']):>9.2f} {r['peak_mb']:>8.0f}")


if __name__ == "__main__":
    main()
