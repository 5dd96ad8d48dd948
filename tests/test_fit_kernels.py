"""The fused CPU fitting step: its kernels against PyTorch, and the step against the reference step."""

import numpy as np
import pytest
import torch

from zoo.fit import kernels
from zoo.fit.fitter import FitConfig, fit_batch
from zoo.fit.fused_step import FusedSirenStep
from zoo.fit.siren import Grid2D, SirenSpec, init_params, mse_and_grads

pytestmark = pytest.mark.skipif(not kernels.available(), reason="numba not installed")


def test_sincos_is_accurate_over_the_pre_activation_range():
    # w0 = 30 times pre-activations of a few units: |x| reaches the hundreds; check far beyond.
    x = np.concatenate([np.linspace(-2000, 2000, 400_001), np.random.default_rng(0).normal(0, 50, 100_000)])
    x = x.astype(np.float32)
    s, c = np.empty_like(x), np.empty_like(x)
    kernels.sincos(x, s, c)
    exact = x.astype(np.float64)
    assert np.abs(s - np.sin(exact)).max() < 3e-7
    assert np.abs(c - np.cos(exact)).max() < 3e-7
    # exact quadrant boundaries and signs
    k = np.arange(-8, 9, dtype=np.float32) * np.float32(np.pi / 2)
    s, c = np.empty_like(k), np.empty_like(k)
    kernels.sincos(k, s, c)
    np.testing.assert_allclose(s, np.sin(k.astype(np.float64)), atol=3e-7)
    np.testing.assert_allclose(c, np.cos(k.astype(np.float64)), atol=3e-7)


def test_sine_activation_and_rank_one_backprop_match_torch():
    g = torch.Generator().manual_seed(1)
    z, bias = torch.randn(3, 5, 17, generator=g), torch.randn(3, 5, generator=g)
    out, cos = z.clone(), torch.empty_like(z)
    kernels.sine_activation_(out.numpy(), bias.numpy(), np.float32(30.0), cos.numpy())
    pre = 30.0 * (z + bias.unsqueeze(2))
    torch.testing.assert_close(out, torch.sin(pre), atol=1e-6, rtol=0)
    torch.testing.assert_close(cos, torch.cos(pre), atol=1e-6, rtol=0)
    w, grad = torch.randn(3, 5, generator=g), torch.randn(3, 17, generator=g)
    expected = w.unsqueeze(2) * grad.unsqueeze(1) * cos
    kernels.backprop_rank_one_(cos.numpy(), w.numpy(), grad.numpy())
    torch.testing.assert_close(cos, expected)


def random_case(rng):
    """A random SIREN architecture with grid or point-list coordinates, and targets."""
    depth = int(rng.integers(1, 4))  # hidden layers
    grid = bool(rng.integers(0, 2))
    d0 = 2 if grid else int(rng.integers(1, 4))
    widths = (d0, *(int(rng.integers(3, 20)) for _ in range(depth)), int(rng.integers(1, 4)))
    if grid:
        coords = Grid2D(torch.linspace(-1, 1, int(rng.integers(2, 9))), torch.linspace(-1, 1, int(rng.integers(2, 9))))
        points = coords.ys.numel() * coords.xs.numel()
    else:
        points = int(rng.integers(5, 60))
        coords = torch.rand(points, d0, generator=torch.Generator().manual_seed(int(rng.integers(1 << 30)))) * 2 - 1
    return SirenSpec(widths, init=str(rng.choice(["siren", "reference"]))), coords, points


@pytest.mark.parametrize("seed", range(8))
def test_fused_step_matches_the_reference_step(seed):
    rng = np.random.default_rng(seed)
    spec, coords, points = random_case(rng)
    K = int(rng.integers(1, 7))
    w, b = init_params(spec, seed, range(K))
    w = [t + 0.05 * torch.randn_like(t) for t in w]  # not just the init: biases too
    b = [t + 0.05 * torch.randn_like(t) for t in b]
    targets = torch.rand(K, points, spec.widths[-1])
    mse, gw, gb = mse_and_grads(spec, w, b, coords, targets)
    # float32 rounding differs between the two; judge both against the same step in float64
    coords64 = Grid2D(coords.ys.double(), coords.xs.double()) if isinstance(coords, Grid2D) else coords.double()
    _, gw64, gb64 = mse_and_grads(spec, [t.double() for t in w], [t.double() for t in b], coords64, targets.double())

    def error(grads):
        return max(float((g.double() - e).abs().max() / e.abs().max()) for g, e in zip(grads, gw64 + gb64))

    step = FusedSirenStep(coords, max_networks=K)
    for _ in range(2):  # a second call reuses the buffers
        f_mse, f_gw, f_gb = step(spec, w, b, coords, targets)
        torch.testing.assert_close(f_mse, mse, rtol=1e-5, atol=1e-7)
        assert error(f_gw + f_gb) <= max(2 * error(gw + gb), 1e-5)
    # fewer networks (after compaction) use a prefix of the same buffers
    f_mse, _, _ = step(spec, [t[:1] for t in w], [t[:1] for t in b], coords, targets[:1])
    torch.testing.assert_close(f_mse, mse[:1], rtol=1e-5, atol=1e-7)


def test_fused_step_refuses_other_coordinates():
    spec = SirenSpec((2, 4, 1))
    step = FusedSirenStep(Grid2D.square(3), max_networks=1)
    w, b = init_params(spec, 0, [0])
    with pytest.raises(ValueError, match="other coordinates"):
        step(spec, w, b, Grid2D.square(3), torch.rand(1, 9, 1))


def test_fused_and_reference_fits_agree(monkeypatch):
    """Whole fits on the numba path and the reference path (what runs on a GPU or without numba)."""
    spec = SirenSpec((2, 12, 12, 1))
    grid = Grid2D.square(9)
    targets = torch.rand(5, 81, 1)
    cfg = FitConfig(steps=40, lr=1e-3, psnr_stop=None)
    monkeypatch.setattr("zoo.fit.fitter.native_step_supported", lambda *args: False)
    fused = fit_batch(spec, grid, targets, range(5), 3, cfg)
    monkeypatch.setattr("zoo.fit.fitter.fused_step_supported", lambda device: False)
    reference = fit_batch(spec, grid, targets, range(5), 3, cfg)
    for m in range(3):
        np.testing.assert_allclose(fused.weights[m], reference.weights[m], atol=1e-4)
    np.testing.assert_allclose(fused.psnr, reference.psnr, atol=0.01)
