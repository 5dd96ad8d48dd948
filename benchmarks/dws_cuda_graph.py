"""A DWSNet training step on a GPU, eager vs replayed from a CUDA graph, measured in one run.

    python benchmarks/dws_cuda_graph.py [--batches 64 512] [--iters 50]

The step is what ``zoo train`` does per batch for MNIST INR classification: the accelerated
DWSNet (``dws.nn.fast.accelerate``), cross-entropy, backward, AdamW. Eager, the GPU waits for
Python and the dispatch of ~2,900 operators a step (docs/dws.md: a fixed ~18 ms on an H100).
Captured once into a CUDA graph (static input buffers, ``AdamW(capturable=True)``), a step is one
replay. Both start from the same state and batches. The first step's gradients (largest difference
relative to the largest gradient) show whether the graph computes the same step; the parameters
after one and after all steps follow (Adam moves a parameter by up to ~lr whatever its gradient's
size, so a rounding difference in a near-zero gradient can show there as ~lr). A control runs
eager twice. Goal (issue 33): batch 64 in <= 3 ms
per step. On a CPU only the eager row runs (CUDA graphs need CUDA).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dws import DWSNetInvariant, WeightSpace, dwsnet_mnist_inr_config  # noqa: E402
from dws.nn.fast import accelerate  # noqa: E402


def batches(batch: int, count: int, device):
    widths = dwsnet_mnist_inr_config()["widths"]
    n = sum(a * b for a, b in zip(widths[:-1], widths[1:])) + sum(widths[1:])
    g = torch.Generator().manual_seed(batch)
    return [(WeightSpace.unflatten(torch.randn(batch, n, generator=g), widths).to(device),
             torch.randint(0, 10, (batch,), generator=g).to(device)) for _ in range(count)]


def train_step(model, opt, ws, labels):
    opt.zero_grad(set_to_none=False)
    loss = torch.nn.functional.cross_entropy(model(ws), labels)
    loss.backward()
    opt.step()
    return loss


class GraphedStep:
    """The training step captured into a CUDA graph: ``__call__`` copies a batch into the static
    inputs and replays it (PyTorch's recipe: warm-up on a side stream, then capture)."""

    def __init__(self, model, opt, ws, labels):
        self.ws = WeightSpace([w.clone() for w in ws.weights], [b.clone() for b in ws.biases])
        self.labels = labels.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                train_step(model, opt, self.ws, self.labels)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.loss = train_step(model, opt, self.ws, self.labels)

    def __call__(self, ws, labels):
        for static, new in zip(self.ws.weights + self.ws.biases, ws.weights + ws.biases):
            static.copy_(new, non_blocking=True)
        self.labels.copy_(labels, non_blocking=True)
        self.graph.replay()
        return self.loss


def snapshot(model, opt):
    """Every tensor a step changes (parameters, buffers, optimizer state) with a copy, to put back in
    place (a captured graph keeps pointing at the same tensors)."""
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [t for state in opt.state.values() for t in state.values() if torch.is_tensor(t)]
    return [(t, t.detach().clone()) for t in tensors]


def restore(saved) -> None:
    with torch.no_grad():
        for tensor, copy_ in saved:
            tensor.copy_(copy_)


def measure(batch: int, iters: int, device, graphed: bool):
    """Seconds per step, the gradients of the first step, the parameters after it and after all
    steps, and the first step's loss."""
    torch.manual_seed(0)
    model = accelerate(DWSNetInvariant(**dwsnet_mnist_inr_config()), "auto").to(device)
    # capturable on both sides wherever CUDA runs: its bias correction is computed on the device, the
    # other's on the host, which differ by rounding; after the warm-up steps that would be enough to move
    # a max pool's argmax and so route gradients elsewhere (the H100 run of 2026-11-27 compared the
    # graph, capturable, with eager, not capturable: first-step gradients 8.6e-3 apart)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=torch.device(device).type == "cuda")
    data = batches(batch, iters + 1, device)
    if graphed:  # three warm-up steps on the first batch, then the capture
        step = GraphedStep(model, opt, *data[0])
    else:  # the same three warm-up steps
        step = lambda ws, labels: train_step(model, opt, ws, labels)  # noqa: E731
        for _ in range(3):
            step(*data[0])
    saved = snapshot(model, opt)
    params = lambda: torch.cat([p.detach().flatten() for p in model.parameters()]).clone()  # noqa: E731
    loss = float(step(*data[1]).detach())  # the forward alone: tells a wrong forward from a wrong backward
    first = params()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()]).clone()
    restore(saved)  # both time the same training from the same state
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for ws, labels in data[1:]:
        step(ws, labels)
    sync()
    return (time.perf_counter() - t0) / iters, grads, first, params(), loss


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, nargs="+", default=[64, 512])
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    cuda = torch.device(args.device).type == "cuda"
    print(f"DWSNet training step (MNIST INR classification, AdamW), device "
          f"{torch.cuda.get_device_name() if cuda else args.device}, torch {torch.__version__}")
    print(f"{'batch':>5} {'eager ms/step':>14} {'graph ms/step':>14} {'speed-up':>9} {'loss diff':>10} "
          f"{'grad diff':>10} {'param diff, 1 step':>19} {'all steps':>10}")

    def differences(a, b):  # the first step's loss and gradients (relative), parameters after 1 and all steps
        return (abs(a[4] - b[4]) / abs(a[4]), float((a[1] - b[1]).abs().max() / a[1].abs().max()),
                float((a[2] - b[2]).abs().max()), float((a[3] - b[3]).abs().max()))

    for batch in args.batches:
        eager = measure(batch, args.iters, args.device, graphed=False)
        if not cuda:
            print(f"{batch:>5} {1e3 * eager[0]:>14.2f} {'(needs CUDA)':>14}")
            continue
        graph = measure(batch, args.iters, args.device, graphed=True)
        loss, grad, first, last = differences(eager, graph)
        print(f"{batch:>5} {1e3 * eager[0]:>14.2f} {1e3 * graph[0]:>14.2f} {eager[0] / graph[0]:>8.1f}x {loss:>10.2e} "
              f"{grad:>10.2e} {first:>19.2e} {last:>10.2e}")
        if batch == args.batches[0]:  # the control: eager against itself
            loss, grad, first, last = differences(eager, measure(batch, args.iters, args.device, graphed=False))
            print(f"{'':>5} control, eager run twice: {loss:.2e} / {grad:.2e} / {first:.2e} / {last:.2e}")
        if batch == 64:
            print(f"goal: DWSNet batch 64 <= 3 ms per step on the GPU: {1e3 * graph[0]:.2f} ms "
                  f"({'met' if graph[0] <= 3e-3 else 'not met'}; eager {1e3 * eager[0]:.2f} ms)")


if __name__ == "__main__":
    main()
