"""Training-step cost of every ``zoo train`` model on large input networks (classifier zoos).

    python benchmarks/weight_models.py                       # 784-128-128-128-10, the paper's DWSNet (d0' = 16, 16 channels)
    python benchmarks/weight_models.py --hidden-channels 24  # every model at ~4M parameters (the paper's count)
    python benchmarks/weight_models.py --widths 3072,64,64,64,64,10 --models dwsnet,mlp
    python benchmarks/weight_models.py --widths 2,32,32,1 --hidden-channels 48 --input-reduction 0 --batch 64 \
        --models dwsnet,nfn-np,nfn-hnp,ng-gnn,ng-transformer,scalegmn,scalegmn-b   # the MNIST INR models
    python benchmarks/weight_models.py --device cuda ...     # the same table on a GPU (each step synchronized)
    python benchmarks/weight_models.py --compile ...         # each step also through torch.compile (zoo train --compile)
    python benchmarks/weight_models.py --bf16 ...            # each step also under bfloat16 autocast (zoo train --precision bf16)

Each model is built as ``zoo train`` builds it (``dws.tasks.models.build_model``: the DWSNet and the newer models with
``--input-reduction``, the baselines sized to the DWSNet's parameter count) and trained with AdamW on a
regression loss, one batch of random input networks of ``--widths``, in a fresh subprocess: the
median wall time of ``--iters`` steps after two warm-ups, and the peak memory as the growth of the
process's max RSS over the setup (model, optimizer and input built; on a GPU, the growth of PyTorch's
peak allocated memory over the same setup). The ratio column is each
model's networks/s over the DWSNet's, measured in the same run.

With ``--compile`` each worker, after its eager steps, wraps the same model as ``zoo train --compile``
does (``dws.tasks.trainer.compiled``: ``torch.compile``) and times ``--iters`` more steps after two
warm-ups, alternated with as many eager ones, so that both see the same load (the second table's "eager"
column and speedup are those); the first compiled step (compiling forward and backward) is printed, not
counted. A second table gives each model's time as a multiple of the DWSNet's: eager over eager, compiled over the
DWSNet's eager step and over its compiled one (the issue's "within 3x", read per model). A model
whose step does not compile keeps its eager row, and the table says why.

With ``--bf16`` each worker alternates float32 steps with steps under ``zoo train --precision bf16``'s
autocast (``dws.tasks.trainer.step_precision``), ``--iters`` of each after two warm-ups of each, so both
see the same load; a third table gives each model's bf16 step, its speedup over its own float32 step,
and its time as a multiple of the DWSNet's float32 step. With both flags the compiled step runs in bf16
too (``zoo train --compile --precision bf16``, the neural graphs' full cells), alternated with the eager
bf16 step it is compared with (the second table's "eager" column is then that bf16 step, and its ratios to
the DWSNet stay over the DWSNet's float32 eager step).
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
from dws.tasks.trainer import TrainConfig, compiled, step_precision  # noqa: E402
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

    def step_time(step_model, precision: str = "fp32") -> float:
        t0 = time.perf_counter()
        with step_precision(TrainConfig(precision=precision, device=device)):
            loss = torch.nn.functional.mse_loss(step_model(ws), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if device != "cpu":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    def median_step(step_model) -> float:
        """The median of ``--iters`` steps after two warm-ups."""
        return statistics.median([step_time(step_model) for _ in range(args.iters + 2)][2:])

    before = peak_memory_mb(device)
    if args.bf16:  # float32 and bf16 steps alternated, so that both see the same load
        pairs = [(step_time(model), step_time(model, "bf16")) for _ in range(args.iters + 2)][2:]
        row = {"model": args.model, "params": desc["params"], "step_s": statistics.median(p[0] for p in pairs),
               "bf16_s": statistics.median(p[1] for p in pairs)}
    else:
        row = {"model": args.model, "params": desc["params"], "step_s": median_step(model)}
    row["peak_mb"] = peak_memory_mb(device) - before
    if args.compile:  # the same model, optimizer and batch, the step as zoo train --compile runs it
        try:
            step_model = compiled(model, device)
            precision = "bf16" if args.bf16 else "fp32"
            row["compile_s"] = step_time(step_model, precision)  # the first step compiles forward and backward
            # compiled and eager steps alternated, as the float32 and bf16 ones above: the ratio sees one load
            pairs = [(step_time(model, precision), step_time(step_model, precision)) for _ in range(args.iters + 2)][2:]
            row["eager_alternated_s"] = statistics.median(p[0] for p in pairs)
            row["compiled_s"] = statistics.median(p[1] for p in pairs)
        except Exception as e:  # noqa: BLE001 -- inductor's many error types: the table says which, the eager row stays
            lines = [line.strip() for line in str(e).splitlines() if line.strip()][:2]  # inductor's: where, then what
            row["compile_error"] = f"{type(e).__name__}: {' '.join(lines)[:300]}"
    return row


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--widths", type=lambda s: [int(x) for x in s.split(",")], default=[784, 128, 128, 128, 10])
    p.add_argument("--models", type=lambda s: s.split(","), default=list(DEFAULT_MODELS))
    p.add_argument("--hidden-channels", type=int, default=16)
    p.add_argument("--input-reduction", type=int, default=16,
                   help="d0', every model's (the DWSNet's own LIN(d0, d0'), the newer models' InputReduced; "
                        "0: none, as for INRs)")
    p.add_argument("--activation", default=None,
                   help="the input networks' activation, for ScaleGMN's symmetry (default: sine for 1-output "
                        "networks, the INRs; relu otherwise, the classifiers)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    p.add_argument("--compile", action="store_true",
                   help="also time each model's step through torch.compile (as zoo train --compile)")
    p.add_argument("--bf16", action="store_true",
                   help="also time each model's step under bfloat16 autocast (as zoo train --precision bf16), "
                        "alternated with its float32 steps")
    p.add_argument("--model", help=argparse.SUPPRESS)  # a worker process: measure this one model
    return p


def main():
    p = parser()
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
               "--device", args.device] + (["--compile"] if args.compile else []) + (["--bf16"] if args.bf16 else [])
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            print(f"{model}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
            continue
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        compiled_note = "" if not args.compile else (
            f", compiled {rows[-1]['compiled_s']:.4f} s/step (compiling {rows[-1]['compile_s']:.0f} s)"
            if "compiled_s" in rows[-1] else f", compiling failed ({rows[-1]['compile_error']})")
        bf16_note = f", bf16 {rows[-1]['bf16_s']:.4f} s/step" if args.bf16 else ""
        print(f"{model}: {rows[-1]['step_s']:.4f} s/step{compiled_note}{bf16_note}", file=sys.stderr,
              flush=True)  # kept if cut
    base = next(r for r in rows if r["model"] == "dwsnet")
    where = f"{args.threads} CPU thread(s)" if args.device == "cpu" else torch.cuda.get_device_name(args.device)
    print(f"input networks {'-'.join(map(str, args.widths))}, batch {args.batch}, {where}, "
          f"DWSNet: {args.hidden_channels} channels, d0' = {args.input_reduction}")
    print(f"{'model':<12} {'params':>11} {'s/step':>8} {'networks/s':>11} {'x DWSNet':>9} {'peak MB':>8}")
    for r in rows:
        rate = args.batch / r["step_s"]
        print(f"{r['model']:<12} {r['params']:>11,} {r['step_s']:>8.3f} {rate:>11.1f} "
              f"{rate / (args.batch / base['step_s']):>9.2f} {r['peak_mb']:>8.0f}")
    if args.compile:
        print_compiled(rows, base)
    if args.bf16:
        print_bf16(rows, base)


def print_bf16(rows: list[dict], base: dict):
    """Each model's step under bfloat16 autocast: its speedup over its own float32 step, and its time as
    a multiple of the DWSNet's float32 step (the issue's "within 3x", with bf16 for that model alone)."""
    print()
    print(f"{'model':<15} {'fp32 s/step':>11} {'bf16 s/step':>11} {'bf16 speedup':>12} {'bf16 x DWSNet fp32':>18}")
    for r in rows:
        print(f"{r['model']:<15} {r['step_s']:>11.3f} {r['bf16_s']:>11.3f} {r['step_s'] / r['bf16_s']:>12.2f} "
              f"{r['bf16_s'] / base['step_s']:>18.2f}")


def print_compiled(rows: list[dict], base: dict):
    """Eager and compiled steps side by side, each as a multiple of the DWSNet's eager and compiled step (with
    ``--bf16``: the eager and compiled bf16 steps, over the DWSNet's float32 eager step and its compiled bf16 one)."""
    def cell(value: float | None, width: int, digits: int) -> str:
        return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"

    print(f"\n{'model':<14} {'eager s':>8} {'compiled s':>10} {'speedup':>7} {'compiling s':>11} "
          f"{'eager/D eager':>13} {'compiled/D eager':>16} {'compiled/D compiled':>19}")
    base_compiled = base.get("compiled_s")
    for r in rows:
        eager, c = r.get("eager_alternated_s", r["step_s"]), r.get("compiled_s")
        print(" ".join([f"{r['model']:<14}", cell(eager, 8, 3), cell(c, 10, 3), cell(c and eager / c, 7, 2),
                        cell(r.get("compile_s"), 11, 0), cell(eager / base["step_s"], 13, 1),
                        cell(c and c / base["step_s"], 16, 1), cell(c and base_compiled and c / base_compiled, 19, 1)]))
    print("s: seconds per step; D: the DWSNet's step (the issue's goal: a model's time within 3x of it)")
    if any("bf16_s" in r for r in rows):
        print("with --bf16: eager and compiled are bf16 steps; 'D eager' is the DWSNet's float32 eager step")
    for r in rows:
        if "compile_error" in r:
            print(f"{r['model']}: torch.compile failed: {r['compile_error']}")

if __name__ == "__main__":
    main()
