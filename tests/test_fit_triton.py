"""The Triton fitting step (zoo/fit/triton_step.py) against the PyTorch step, in Triton's CPU
interpreter (conftest.py sets ``TRITON_INTERPRET=1`` where no GPU is present): one step's MSE and
update, several steps of Adam, ragged point tiles, point lists and grids, 1-3 inputs and outputs,
networks frozen by the early stop at different steps, and the choice of the step."""

import numpy as np
import pytest
import torch

from zoo.fit import triton_step
from zoo.fit.adam import MaskedAdam
from zoo.fit.fitter import FitConfig, choose_step, fit_batch
from zoo.fit.siren import Grid2D, SirenSpec, init_params, mse_and_grads

pytestmark = pytest.mark.skipif(not triton_step.available(), reason="Triton is not installed")
interpreted = pytest.mark.skipif(not triton_step.interpreted() and not torch.cuda.is_available(),
                                 reason="neither a GPU nor Triton's interpreter")


def random_case(rng):
    """A random architecture the kernel takes, on a grid or a point list whose size is not a multiple
    of the tile (the last tile is ragged)."""
    hidden = int(rng.choice([16, 32]))
    grid = bool(rng.integers(0, 2))
    d0 = 2 if grid else int(rng.integers(1, 4))
    widths = (d0, hidden, hidden, int(rng.integers(1, 4)))
    if grid:
        coords = Grid2D(torch.linspace(-1, 1, int(rng.integers(3, 8))), torch.linspace(-1, 0.7, int(rng.integers(3, 9))))
    else:
        points = int(rng.integers(5, 40))
        coords = torch.rand(points, d0, generator=torch.Generator().manual_seed(int(rng.integers(1 << 30)))) * 2 - 1
    return SirenSpec(widths, init=str(rng.choice(["siren", "reference", "published"]))), coords


def points_of(coords):
    return coords.ys.numel() * coords.xs.numel() if isinstance(coords, Grid2D) else coords.shape[0]


@interpreted
@pytest.mark.parametrize("case", range(6))
@pytest.mark.parametrize("config", ["16,1,ieee", "16,2,split3", "16,2,split3,grid", "32,1,tf32x3,grid"])
def test_one_step_matches_float64(case, config):
    """One kernel step's MSE and gradients (read back from Adam's first moment, which after one
    step is exactly (1 - beta1) * grad) against float64 PyTorch: as close as PyTorch's own float32
    step, on a random architecture with a ragged last tile, in several kernel configurations (the
    grid layout's rows wider or narrower than a tile)."""
    rng = np.random.default_rng(case)
    spec, coords = random_case(rng)
    K = int(rng.integers(1, 4))
    targets = torch.rand(K, points_of(coords), spec.widths[-1], generator=torch.Generator().manual_seed(case))
    w, b = init_params(spec, case, range(K))
    fit = triton_step.TritonFit(spec, coords, targets, w, b, torch.ones(K), lr=1e-3, psnr_stop=None,
                                **triton_step.parse_config(config))
    assert fit.grid == (config.endswith("grid") and isinstance(coords, Grid2D))
    fit.step()
    grads = triton_step.unpack(spec, fit.exp_avg / (1 - fit.betas[0]))
    coords64 = Grid2D(coords.ys.double(), coords.xs.double()) if isinstance(coords, Grid2D) else coords.double()
    mse64, gw64, gb64 = mse_and_grads(spec, [t.double() for t in w], [t.double() for t in b], coords64,
                                      targets.double())
    mse32, gw32, gb32 = mse_and_grads(spec, w, b, coords, targets)

    def error(got):
        return max(float((g.double() - e).abs().max() / e.abs().max()) for g, e in zip(got, gw64 + gb64))

    torch.testing.assert_close(fit.mse.double(), mse64, rtol=1e-5, atol=1e-7)
    assert error(grads[0] + grads[1]) <= max(3 * error(gw32 + gb32), 3e-5)
    assert error(grads[0] + grads[1]) < 1e-3 * error([torch.zeros_like(g) for g in gw32 + gb32])  # not vacuous


@interpreted
@pytest.mark.parametrize("case", range(3))
@pytest.mark.parametrize("layout", ["points", "grid"])
def test_steps_of_adam_follow_the_pytorch_fit(case, layout):
    """Five fused steps (forward, loss, backward, Adam) follow the PyTorch step + MaskedAdam: the same
    MSE at every step, and the same parameters but for the odd entry whose gradient is so close to
    zero that rounding flips the sign of Adam's first steps (each moves by ~lr either way)."""
    rng = np.random.default_rng(10 + case)
    spec, coords = random_case(rng)
    K = 3
    targets = torch.rand(K, points_of(coords), spec.widths[-1], generator=torch.Generator().manual_seed(case))
    w, b = init_params(spec, case, range(K))
    fit = triton_step.TritonFit(spec, coords, targets, w, b, torch.ones(K), lr=1e-3, psnr_stop=None, block_p=16,
                                layout=layout)
    weights, biases = [x.clone() for x in w], [x.clone() for x in b]
    opt = MaskedAdam(weights + biases, lr=1e-3)
    for _ in range(5):
        mse, grad_w, grad_b = mse_and_grads(spec, weights, biases, coords, targets)
        opt.step(grad_w + grad_b)
        fit.step()
        torch.testing.assert_close(fit.mse, mse, rtol=1e-4, atol=1e-7)
    got_w, got_b, steps = fit.result(5)
    got = torch.cat([t.flatten() for t in got_w + got_b])
    want = torch.cat([t.flatten() for t in weights + biases])
    start = torch.cat([t.flatten() for t in w + b])
    off = (got - want).abs() > 1e-5
    assert off.float().mean() < 0.01, f"{int(off.sum())} of {off.numel()} parameters differ"
    assert ((want - start).abs() > 1e-4).float().mean() > 0.5  # they did move
    assert steps.tolist() == [5] * K


@interpreted
@pytest.mark.parametrize("config", [None, "16,2,split3,grid"])
def test_early_stopped_networks_match_the_pytorch_fit(config, monkeypatch):
    """Networks reach PSNR 40 at different steps; each stops at the same step as in the PyTorch fit
    (which also compacts its working set) and keeps the parameters that reached it: with the
    default kernel and with the grid layout chosen through ``ZOO_TRITON_CONFIG``."""
    if config:
        monkeypatch.setenv("ZOO_TRITON_CONFIG", config)
    spec = SirenSpec((2, 16, 16, 1), init="reference")
    K = 6
    amplitude = torch.tensor([0.02, 0.05, 0.1, 0.2, 0.3, 0.5]).view(K, 1, 1)
    targets = 0.5 + amplitude * (torch.rand(K, 25, 1, generator=torch.Generator().manual_seed(3)) - 0.5)
    config = FitConfig(steps=40, lr=3e-3, psnr_stop=40.0)
    ours = fit_batch(spec, Grid2D.square(5), targets, list(range(K)), 0, config, backend="triton")
    theirs = fit_batch(spec, Grid2D.square(5), targets, list(range(K)), 0, config, backend="pytorch")
    assert ours.implementation == "triton"
    assert ours.steps.tolist() == theirs.steps.tolist()
    assert len(set(ours.steps.tolist())) >= 4 and max(ours.steps) < config.steps  # a real test of the stop
    np.testing.assert_allclose(ours.psnr, theirs.psnr, atol=1e-3)
    for got, want in zip(ours.weights + ours.biases, theirs.weights + theirs.biases):
        np.testing.assert_allclose(got, want, atol=2e-5)


@interpreted
def test_progress_reports_networks_done_without_per_step_synchronization():
    seen = []
    spec = SirenSpec((1, 16, 16, 1))
    targets = torch.rand(2, 9, 1)
    fit_batch(spec, torch.linspace(-1, 1, 9).view(9, 1), targets, [0, 1], 0, FitConfig(steps=30, psnr_stop=None),
              backend="triton", progress=seen.append)
    assert seen == pytest.approx([25 / 30, 1.0])  # every CHECK_EVERY steps and at the end
    assert triton_step.CHECK_EVERY == 25


def test_kernel_configurations_are_parsed_and_bad_ones_refused(monkeypatch):
    assert triton_step.parse_config("32,2,split3") == {"block_p": 32, "num_warps": 2, "precision": "split3",
                                                       "layout": "points"}
    assert triton_step.parse_config("16,4,split3,grid")["layout"] == "grid"
    for bad in ("32,2", "24,2,ieee", "32,2,fp64", "32,2,ieee,fast", "32,2,split3,defer", "a,b,c",
                "16,4,split3,grid,grid"):
        with pytest.raises(ValueError, match="BLOCK_P"):
            triton_step.parse_config(bad)
    monkeypatch.setenv("ZOO_TRITON_CONFIG", "16,2,tf32x3")
    assert triton_step.kernel_config()["precision"] == "tf32x3"
    monkeypatch.delenv("ZOO_TRITON_CONFIG")
    assert triton_step.kernel_config() == triton_step.DEFAULT_CONFIG


def test_pack_and_unpack_are_inverse():
    spec = SirenSpec((2, 16, 16, 3))
    w, b = init_params(spec, 0, range(4))
    rows = triton_step.pack(w, b)
    assert rows.shape == (4, 2 * 16 + 16 + 16 * 16 + 16 + 3 * 16 + 3)
    got_w, got_b = triton_step.unpack(spec, rows)
    for got, want in zip(got_w + got_b, w + b):
        assert torch.equal(got, want)


def test_the_choice_of_step():
    spec, grid = SirenSpec((2, 32, 32, 1)), Grid2D.square(28)
    assert choose_step(spec, grid, "cpu") != "triton"  # auto never runs the interpreter
    assert choose_step(spec, grid, "cpu", "pytorch") == "pytorch"
    with pytest.raises(ValueError, match="unknown fit backend"):
        choose_step(spec, grid, "cpu", "cuda-magic")
    with pytest.raises(ValueError, match="widths"):
        choose_step(SirenSpec((2, 32, 32, 32, 1)), grid, "cpu", "triton")
    with pytest.raises(ValueError, match="power of two"):
        choose_step(SirenSpec((2, 24, 24, 1)), grid, "cpu", "triton")


def test_triton_off_the_gpu_without_the_interpreter_is_refused(monkeypatch):
    monkeypatch.setattr(triton_step, "interpreted", lambda: False)
    with pytest.raises(ValueError, match="CUDA device"):
        choose_step(SirenSpec((2, 32, 32, 1)), Grid2D.square(28), "cpu", "triton")
