"""The SIREN fitting step on a GPU: the fused Triton kernel vs the PyTorch step, measured in one run.

    python benchmarks/fit_gpu_step.py [--networks 4096] [--steps 20] [--configs 64,4,ieee 32,2,ieee ...]

Times one fitting step (forward, loss, backward, Adam) of ``--networks`` MNIST SIRENs 2-32-32-1 on
28x28 images: the PyTorch step (``mse_and_grads`` + ``MaskedAdam``, what a GPU ran before the
kernel) and the Triton kernel in each configuration ``BLOCK_P,NUM_WARPS,PRECISION``. For each it
prints ms per step, the useful TFLOP/s (:func:`zoo.fit.triton_step.flops_per_step`), the share of
the GPU's fp32 peak (``--peak-tflops``, default the H100/H200's 67), and the error of one step's
gradients against float64 (relative to the largest gradient of each tensor, worst tensor), next
to PyTorch float32's own. The last line names the fastest configuration whose error is within 3x
of PyTorch's (``BEST triton=...``), which ``gpu_session.sh`` passes on as ``ZOO_TRITON_CONFIG``.
Also times the published recipe, one network at a time with autograd and ``torch.optim.Adam``
(``--single`` networks), as networks per second for the same number of steps.

Images: the MNIST test images from ``--data-root`` (IDX files) where given, else uniform noise.
Runs on a CPU too (Triton's interpreter, ``TRITON_INTERPRET=1``; tiny sizes only) so it is tested.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's zoo and dws, not another install

from zoo.fit import triton_step  # noqa: E402
from zoo.fit.adam import MaskedAdam  # noqa: E402
from zoo.fit.reference import Siren  # noqa: E402
from zoo.fit.siren import Grid2D, SirenSpec, init_params, mse_and_grads  # noqa: E402


def images(args, K: int) -> torch.Tensor:
    """``[K, 784, 1]`` targets in [0, 1]."""
    if args.data_root:
        from zoo.sources.idx import read_idx

        for name in ("t10k-images-idx3-ubyte.gz", "t10k-images-idx3-ubyte"):
            path = os.path.join(args.data_root, name)
            if os.path.exists(path):
                pixels = torch.from_numpy(read_idx(path)[:K].astype("float32") / 255.0)
                reps = -(-K // pixels.shape[0])
                return pixels.repeat(reps, 1, 1)[:K].reshape(K, -1, 1)
    return torch.rand(K, 28 * 28, 1, generator=torch.Generator().manual_seed(0))


def timed(fn, steps: int, device) -> float:
    """Seconds per call of ``fn`` (after two warm-up calls)."""
    for _ in range(2):
        fn()
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    sync()
    return (time.perf_counter() - t0) / steps


def gradient_error(grads, reference) -> float:
    return max(float((g.double() - r).abs().max() / r.abs().max()) for g, r in zip(grads, reference))


def published_recipe_rate(spec, points, targets, networks: int, steps: int, device) -> float:
    """Network-steps per second of the published recipe on ``device``: one network at a time, an
    ``nn.Module`` SIREN, autograd and ``torch.optim.Adam``, with the PSNR check's host sync every step."""
    seconds = 0.0
    for i in range(networks + 1):  # the first network warms up and is not counted
        w, b = init_params(spec, 0, [i])
        net = Siren(spec, [t[0] for t in w], [t[0] for t in b]).to(device)
        opt = torch.optim.Adam(net.parameters(), lr=5e-4)
        target = targets[i].to(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            loss = (net(points) - target).square().mean()
            float(loss.detach())  # the early-stop check of the recipe
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if i:
            seconds += time.perf_counter() - t0
    return networks * steps / seconds


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--networks", type=int, default=4096)
    p.add_argument("--steps", type=int, default=20, help="timed steps per variant")
    p.add_argument("--configs", nargs="*", default=["16,1,split3,grid", "16,4,split3", "16,1,ieee,grid", "16,1,tf32x3,grid"])
    p.add_argument("--single", type=int, default=2, help="networks fitted one at a time (published recipe)")
    p.add_argument("--single-steps", type=int, default=100)
    p.add_argument("--check", type=int, default=64, help="networks whose gradients are checked against float64")
    p.add_argument("--data-root", default=None)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--peak-tflops", type=float, default=67.0, help="the GPU's fp32 peak (H100/H200 SXM: 67)")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    spec = SirenSpec((2, 32, 32, 1), init="reference")
    grid = Grid2D.square(28).to(device)
    K = args.networks
    targets = images(args, K).to(device)
    w, b = init_params(spec, 0, range(K))
    w, b = [t.to(device) for t in w], [t.to(device) for t in b]
    flops = triton_step.flops_per_step(spec, 784, K)

    # float64 gradients of the first networks: the accuracy reference
    C = min(args.check, K)
    grid64 = Grid2D(grid.ys.double(), grid.xs.double())
    _, gw64, gb64 = mse_and_grads(spec, [t[:C].double() for t in w], [t[:C].double() for t in b], grid64,
                                  targets[:C].double())
    reference = gw64 + gb64

    rows = []
    weights, biases = [t.clone() for t in w], [t.clone() for t in b]
    opt = MaskedAdam(weights + biases, lr=5e-4)

    def pytorch_step():
        _, gw, gb = mse_and_grads(spec, weights, biases, grid, targets)
        opt.step(gw + gb)

    _, gw, gb = mse_and_grads(spec, [t[:C] for t in w], [t[:C] for t in b], grid, targets[:C])
    torch_error = gradient_error(gw + gb, reference)
    rows.append(("pytorch step + MaskedAdam", timed(pytorch_step, args.steps, device), torch_error))

    for config in args.configs:
        try:
            options = triton_step.parse_config(config)
            probe = triton_step.TritonFit(spec, grid, targets[:C], [t[:C] for t in w], [t[:C] for t in b],
                                          torch.ones(C), 5e-4, None, **options)
            probe.step()
            grads = triton_step.unpack(spec, probe.exp_avg / (1 - probe.betas[0]))
            error = gradient_error(grads[0] + grads[1], reference)
            fit = triton_step.TritonFit(spec, grid, targets, w, b, torch.ones(K), 5e-4, None, **options)
            rows.append((f"triton {config}", timed(fit.step, args.steps, device), error))
        except Exception as exc:  # a configuration this GPU or Triton version cannot build: say so, go on
            print(f"triton {config}: failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")

    single_rate = published_recipe_rate(spec, grid.points().to(device), targets, args.single, args.single_steps, device)

    base = rows[0][1]
    print(f"\nOne fitting step of {K} MNIST SIRENs 2-32-32-1 (784 pixels), {flops / 1e9:.1f} GFLOP a step, "
          f"device {torch.cuda.get_device_name() if device.type == 'cuda' else device}")
    print(f"{'step':<28} {'ms/step':>9} {'TFLOP/s':>8} {'% peak':>7} {'vs pytorch':>10} {'grad error':>11}")
    for name, seconds, error in rows:
        print(f"{name:<28} {1e3 * seconds:>9.3f} {flops / seconds / 1e12:>8.2f} "
              f"{100 * flops / seconds / 1e12 / args.peak_tflops:>6.1f}% {base / seconds:>9.1f}x {error:>11.2e}")
    print(f"{'one at a time (published)':<28} {1e3 / single_rate * K:>9.1f}   (ms per step of {K} networks, "
          f"{args.single} networks x {args.single_steps} steps measured)")
    good = [r for r in rows[1:] if r[2] <= max(3 * torch_error, 3e-5)]
    if good:
        name, seconds, _ = min(good, key=lambda r: r[1])
        share = flops / seconds / 1e12 / args.peak_tflops
        print(f"goal: fitting step >= 50% of fp32 peak: {100 * share:.1f}% "
              f"({'met' if share >= 0.5 else 'not met'}); vs PyTorch step {base / seconds:.1f}x")
        print(f"BEST triton={name.split()[1]}")
    else:
        print("goal: fitting step >= 50% of fp32 peak: not met (no Triton configuration ran accurately)")


if __name__ == "__main__":
    main()
