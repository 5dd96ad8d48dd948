"""Fit many SIRENs at once: one batched computation, per-network losses, per-network early stop.

Each network follows exactly the trajectory it would follow alone (the loss is the sum of the
per-network losses and Adam is elementwise). A network whose PSNR reaches ``psnr_stop`` is frozen
with the parameters that reached it; once fewer than ``compact_below`` of the working set is still
training, the frozen networks are dropped from the computation so they cost nothing.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from .adam import MaskedAdam
from .native_step import NativeSirenStep, native_step_supported
from .siren import SirenSpec, init_params, mse_and_grads, psnr
from . import triton_step

Tensor = torch.Tensor


@dataclass(frozen=True)
class FitConfig:
    steps: int = 1000
    lr: float = 5e-4
    psnr_stop: float | None = 40.0  # dB; None disables early stopping
    compact_below: float = 0.5

    def to_manifest(self) -> dict:
        return {**asdict(self), "optimizer": "Adam(betas=(0.9, 0.999), eps=1e-8)",
                "loss": "mean squared error over all points and output channels, per network"}


@dataclass
class FitResult:
    weights: list[np.ndarray]  # [K, out, in] float32 per layer
    biases: list[np.ndarray]  # [K, out] float32 per layer
    mse: np.ndarray  # [K] final MSE
    psnr: np.ndarray  # [K] final PSNR (dB)
    steps: np.ndarray  # [K] optimizer steps taken
    implementation: str = "pytorch"  # which step computed it (see STEP_IMPLEMENTATIONS)


# The fitting step's implementations; they agree to float rounding (~1e-6), so a store records
# which one fitted each network. ``auto`` picks the fastest that runs here (:func:`choose_step`).
# docs/architecture.md says which runs where and why each exists. "numba-mkl" (numba elementwise
# kernels + MKL matmuls) was retired on 2026-11-27: the C step does its job on every x86-64 CPU
# with AVX2, PyTorch's elsewhere; stores made before then may still name it.
FIT_BACKENDS = ("auto", "triton", "native-c", "pytorch", "pytorch-compiled")
STEP_IMPLEMENTATIONS = (*FIT_BACKENDS[1:], "numba-mkl")


CPU_GROUP = 32  # networks fitted together on a CPU (the native step handles one network at a time)


class InitAhead:
    """Initial parameters drawn on a background thread one group ahead of the fit.

    On a GPU the host only launches a group's steps and waits for them, while drawing the initial
    parameters (:func:`~zoo.fit.siren.init_params`: one seeded stream per network) is host work
    that would otherwise sit between two fits. So the fitter takes the current group's draw, starts
    the next group's, then fits. A draw depends on ``(spec, seed, indices)`` only: taken from here
    or drawn in place, the bits are the same. One slot, used by one fitting thread at a time.
    """

    def __init__(self):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="zoo-init-ahead")  # its thread starts on first use
        self._ahead = None  # (spec, seed, indices, future) of the draw started last

    def start(self, spec: SirenSpec, seed: int, indices) -> None:
        """Begin drawing ``indices`` in the background (a draw not taken is dropped)."""
        self._drop(self._ahead)
        self._ahead = (spec, seed, list(indices), self._pool.submit(init_params, spec, seed, indices))

    def take(self, spec: SirenSpec, seed: int, indices) -> tuple[list[Tensor], list[Tensor]]:
        """``init_params(spec, seed, indices)``: the draw started last where it begins with these
        networks (waiting for it; its error, if it failed, is raised here), else drawn now."""
        indices = list(indices)
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[:2] == (spec, seed) and ahead[2][: len(indices)] == indices:
            weights, biases = ahead[3].result()
            return [w[: len(indices)] for w in weights], [b[: len(indices)] for b in biases]
        self._drop(ahead)
        return init_params(spec, seed, indices)

    @staticmethod
    def _drop(ahead) -> None:
        if ahead is not None:
            ahead[3].cancel()  # no effect once running: that draw finishes and is forgotten


#: the fitting's draw ahead: a chunk's fit starts drawing the networks that follow it, which the
#: next chunk of an in-process run takes (a run fits its chunks one after the other, in order)
INIT_AHEAD = InitAhead()


@functools.cache
def compiled_step():
    """``mse_and_grads`` through ``torch.compile`` (fuses the elementwise passes; needs a C++
    compiler on a CPU). Shapes are dynamic because compaction shrinks the batch."""
    return torch.compile(mse_and_grads, dynamic=True)


def fit_batch(
    spec: SirenSpec,
    coords,
    targets: Tensor,
    indices: Sequence[int],
    seed: int,
    config: FitConfig,
    peak: float | Tensor = 1.0,
    device: str | torch.device = "cpu",
    group: int | None = None,
    compile: bool = False,
    progress: Callable[[float], None] | None = None,
    backend: str = "auto",
    draw_ahead: bool | None = None,
) -> FitResult:
    """Fit ``len(indices)`` networks; network k fits ``targets[k]`` ([P, d_M]) on ``coords``.

    ``coords`` is ``[P, d_0]`` or a :class:`Grid2D`. ``indices`` are the networks' global indices:
    they alone decide the initialization. Networks are fitted ``group`` at a time (default: 32 on
    a CPU, where larger groups fall out of cache; all at once on a GPU); the grouping changes
    nothing but speed, since every network's loss and optimizer are its own. ``compile`` runs the
    step through ``torch.compile`` (the same as ``backend="pytorch-compiled"``). ``backend`` names
    the step (:data:`FIT_BACKENDS`; ``auto``: :func:`choose_step`). ``progress(fraction)`` is called
    with the share of the work done (a network that stopped early counts as done): after every step,
    every :data:`~zoo.fit.triton_step.CHECK_EVERY` steps for the Triton step. ``draw_ahead``: draw
    each group's successor's initial parameters while the group fits (:class:`InitAhead`; after the
    last group, the networks right after ``indices``: the next chunk's); default: on a CUDA device
    only (on a CPU the host is busy fitting). The result is the same bits either way.
    """
    backend = choose_step(spec, coords, device, "pytorch-compiled" if compile else backend)
    K = len(indices)
    peak = torch.as_tensor(peak, dtype=torch.float32).expand(K).clone()
    if group is None:
        group = CPU_GROUP if torch.device(device).type == "cpu" else max(K, 1)

    def part_progress(start: int):  # networks done in the part starting at ``start`` -> share of all K
        return None if progress is None else (lambda done: progress((start + done) / K))

    if draw_ahead is None:
        draw_ahead = torch.device(device).type == "cuda"
    parts = []
    for s in range(0, K, group) or [0]:  # no networks: one empty part, as before
        part = indices[s : s + group]
        init = None
        if draw_ahead and K:
            init = INIT_AHEAD.take(spec, seed, part)
            last = s + group >= K  # then the next chunk's networks follow (or the draw goes unused)
            following = range(part[-1] + 1, part[-1] + 1 + group) if last else indices[s + group : s + 2 * group]
            INIT_AHEAD.start(spec, seed, following)
        parts.append(_fit_group(spec, coords, targets[s : s + group], part, seed, config, peak[s : s + group],
                                device, backend, part_progress(s), init))
    if len(parts) == 1:
        return parts[0]
    return FitResult(
        weights=[np.concatenate([p.weights[m] for p in parts]) for m in range(spec.num_layers)],
        biases=[np.concatenate([p.biases[m] for p in parts]) for m in range(spec.num_layers)],
        mse=np.concatenate([p.mse for p in parts]),
        psnr=np.concatenate([p.psnr for p in parts]),
        steps=np.concatenate([p.steps for p in parts]),
        implementation=parts[0].implementation,
    )


def choose_step(spec: SirenSpec, coords, device, backend: str = "auto") -> str:
    """The step implementation to fit ``spec`` on ``device``: ``backend`` itself where it can run here
    (ValueError naming why not), or for ``auto`` the fastest that can: Triton on CUDA, the native C
    step on a CPU with AVX2, else PyTorch."""
    if backend not in FIT_BACKENDS:
        raise ValueError(f"unknown fit backend {backend!r}; choose one of {', '.join(FIT_BACKENDS)}")
    device = torch.device(device)
    if backend == "auto":
        if triton_step.step_supported(spec, device):
            return "triton"
        if native_step_supported(spec, coords, device):
            return "native-c"
        return "pytorch"
    why = None
    if backend == "triton":
        if not triton_step.available():
            why = "Triton is not installed (pip install triton)"
        elif device.type != "cuda" and not triton_step.interpreted():
            why = "it runs on a CUDA device (or in Triton's interpreter, TRITON_INTERPRET=1)"
        else:
            why = triton_step.supports(spec)
    elif backend == "native-c" and not native_step_supported(spec, coords, device):
        why = ("it needs a CPU with AVX2 and FMA, a C compiler, hidden widths that are multiples of 4 and a point "
               "count that is a multiple of 8")
    if why:
        raise ValueError(f"--fit-backend {backend} cannot fit here: {why}")
    return backend


def _fit_group(spec, coords, targets, indices, seed, config, peak, device, backend="pytorch",
               progress=None, init=None) -> FitResult:
    """``progress(networks done)``, after every step: the stopped ones, and the share of the
    schedule the others went through. ``init``: the networks' initial ``(weights, biases)`` where
    already drawn (else drawn here)."""
    K = len(indices)
    if targets.shape[0] != K:
        raise ValueError(f"{K} networks but {targets.shape[0]} targets")
    device = torch.device(device)
    coords = coords.to(device, torch.float32)
    all_targets = targets.to(device, torch.float32)
    peak = peak.to(device)
    if backend == "triton":
        final_w, final_b, steps_taken = triton_step.fit_group_triton(
            spec, coords, all_targets, indices, seed, config, peak, device, progress, init=init)
        return _result(spec, final_w, final_b, coords, all_targets, peak, steps_taken, backend)
    w_init, b_init = init if init is not None else init_params(spec, seed, indices)
    final_w = [w.to(device) for w in w_init]
    final_b = [b.to(device) for b in b_init]
    weights = [w.clone() for w in final_w]
    biases = [b.clone() for b in final_b]
    steps_taken = torch.full((K,), config.steps, dtype=torch.int64, device=device)
    working = torch.arange(K, device=device)  # global positions of the working set
    frozen = torch.zeros(K, dtype=torch.bool, device=device)
    opt = MaskedAdam(weights + biases, lr=config.lr)
    L = spec.num_layers
    stopped = 0  # networks frozen by the early stop so far

    def write_back(rows: Tensor, positions: Tensor) -> None:
        for m in range(L):
            final_w[m][positions] = weights[m][rows]
            final_b[m][positions] = biases[m][rows]

    targets_w = all_targets
    step_fn = {"pytorch-compiled": compiled_step, "native-c": lambda: NativeSirenStep(spec, coords, K),
               "pytorch": lambda: mse_and_grads}[backend]()
    for step in range(config.steps):
        mse, grad_w, grad_b = step_fn(spec, weights, biases, coords, targets_w)
        if config.psnr_stop is not None:
            newly = (psnr(mse, peak[working]) >= config.psnr_stop) & ~frozen
            if bool(newly.any()):
                steps_taken[working[newly]] = step
                frozen |= newly
                stopped += int(newly.sum())
                if bool(frozen.all()):
                    if progress is not None:
                        progress(K)
                    break
        opt.step(grad_w + grad_b, active=None if not bool(frozen.any()) else ~frozen)
        if progress is not None:
            progress(stopped + (K - stopped) * (step + 1) / config.steps)
        if bool(frozen.any()) and (~frozen).float().mean() < config.compact_below:
            done_rows = frozen.nonzero().squeeze(1)
            write_back(done_rows, working[done_rows])
            keep = (~frozen).nonzero().squeeze(1)
            weights = [w[keep] for w in weights]
            biases = [b[keep] for b in biases]
            opt.params = weights + biases
            opt.select(keep)
            working, frozen = working[keep], frozen[keep]
            targets_w = all_targets[working]
    write_back(torch.arange(len(working), device=device), working)
    evaluate = step_fn if backend == "native-c" else mse_and_grads
    return _result(spec, final_w, final_b, coords, all_targets, peak, steps_taken, backend, evaluate)


def _result(spec, weights, biases, coords, targets, peak, steps_taken, implementation,
            evaluate=mse_and_grads) -> FitResult:
    """The fitted networks on the host, their final MSE and PSNR evaluated by ``evaluate`` (a step's
    ``(spec, weights, biases, coords, targets) -> (mse, ...)``). The native C step evaluates its own
    networks: its sums run in a fixed order on every x86-64 CPU with AVX2, where PyTorch's forward goes
    through the BLAS, whose kernels differ by CPU vendor (MKL on Intel), so the same networks' table
    would differ between an Intel and an AMD machine (docs/store-format.md, "Which part differs")."""
    with torch.no_grad():
        final_mse = evaluate(spec, weights, biases, coords, targets)[0].clone()
    return FitResult(
        weights=[w.cpu().numpy() for w in weights],
        biases=[b.cpu().numpy() for b in biases],
        mse=final_mse.cpu().numpy(),
        psnr=psnr(final_mse, peak).cpu().numpy(),
        steps=steps_taken.cpu().numpy(),
        implementation=implementation,
    )
