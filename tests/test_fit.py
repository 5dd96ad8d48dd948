"""Batched SIREN fitting: equivalence with one-at-a-time fitting, early stop, determinism, conventions."""

import numpy as np
import pytest
import torch

from zoo.fit.fitter import FitConfig, fit_batch
from zoo.fit.reference import fit_one
from zoo.fit.siren import INITS, Grid2D, SirenSpec, forward, init_params, mse_and_grads, psnr


def images(n, size=12, seed=0):
    """Smooth random images in [0, 1] (a few Gaussian blobs), [n, size*size, 1]."""
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, size), torch.linspace(-1, 1, size), indexing="ij")
    out = torch.zeros(n, size, size)
    for _ in range(3):
        c = torch.rand(n, 2, 1, 1, generator=g) * 2 - 1
        out += torch.exp(-((yy - c[:, 0]) ** 2 + (xx - c[:, 1]) ** 2) / 0.1)
    return (out / out.amax(dim=(1, 2), keepdim=True)).reshape(n, -1, 1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batched_fit_follows_single_network_trajectories(seed):
    rng = np.random.default_rng(seed)
    spec = SirenSpec((2, int(rng.integers(8, 24)), int(rng.integers(8, 24)), 1))
    grid = Grid2D.square(12)
    targets = images(6, seed=seed)
    cfg = FitConfig(steps=40, lr=1e-3, psnr_stop=None)
    indices = [int(i) for i in rng.choice(1000, size=6, replace=False)]
    batched = fit_batch(spec, grid, targets, indices, seed, cfg)
    for k, index in enumerate(indices[:3]):
        w, b, mse, steps = fit_one(spec, grid.points(), targets[k], index, seed, cfg)
        for m in range(spec.num_layers):
            np.testing.assert_allclose(batched.weights[m][k], w[m].numpy(), atol=2e-4, rtol=1e-3)
            np.testing.assert_allclose(batched.biases[m][k], b[m].numpy(), atol=2e-4, rtol=1e-3)
        assert abs(10 * np.log10(1 / mse) - batched.psnr[k]) < 0.05
        assert steps == batched.steps[k] == cfg.steps


def test_grid_first_layer_matches_point_list():
    spec = SirenSpec((2, 16, 16, 1))
    w, b = init_params(spec, 3, range(4))
    grid = Grid2D(torch.linspace(-1, 1, 7), torch.linspace(-1, 1, 9))
    target = torch.rand(4, 63, 1)
    np.testing.assert_allclose(forward(spec, w, b, grid), forward(spec, w, b, grid.points()), atol=1e-5)
    g_grid = mse_and_grads(spec, w, b, grid, target)
    g_pts = mse_and_grads(spec, w, b, grid.points(), target)
    for a, c in zip(g_grid[1] + g_grid[2], g_pts[1] + g_pts[2]):
        np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-5)


def test_hand_written_gradients_match_autograd():
    spec = SirenSpec((1, 8, 6, 5, 2))
    w, b = init_params(spec, 0, range(3))
    x = torch.rand(20, 1)
    target = torch.rand(3, 20, 2)
    params = [p.clone().requires_grad_(True) for p in w + b]
    y = forward(spec, params[:4], params[4:], x)
    ((y - target) ** 2).mean(dim=(1, 2)).sum().backward()
    _, gw, gb = mse_and_grads(spec, w, b, x, target)
    for p, g in zip(params, gw + gb):
        np.testing.assert_allclose(g, p.grad, rtol=1e-4, atol=1e-6)


def test_early_stopped_networks_freeze_at_the_threshold():
    spec = SirenSpec((2, 24, 24, 1))
    grid = Grid2D.square(10)
    targets = images(8, size=10)
    targets[:4] = 0.5  # constant images are reached almost at once
    stop = 30.0
    res = fit_batch(spec, grid, targets, range(8), 0, FitConfig(steps=300, lr=1e-3, psnr_stop=stop))
    stopped = res.steps < 300
    assert stopped[:4].all()
    assert (res.psnr[stopped] >= stop).all()
    # A stopped network holds exactly the parameters a lone fit has when it stops.
    k = int(np.flatnonzero(stopped)[0])
    w, b, mse, steps = fit_one(spec, grid.points(), targets[k], k, 0, FitConfig(steps=300, lr=1e-3, psnr_stop=stop))
    assert steps == res.steps[k]
    np.testing.assert_allclose(res.weights[1][k], w[1].numpy(), atol=1e-4)


def test_progress_counts_stopped_networks_as_done_and_changes_nothing():
    """``progress`` gets the share of the work after every step, per group; early-stopped networks
    count as done, so the share jumps when they stop; the networks are those fitted without it."""
    spec = SirenSpec((2, 16, 16, 1))
    grid = Grid2D.square(10)
    targets = images(6, size=10)
    targets[:2] = 0.5  # stop almost at once
    cfg = FitConfig(steps=300, lr=1e-3, psnr_stop=30.0)
    reports = []
    res = fit_batch(spec, grid, targets, range(6), 0, cfg, group=3, progress=reports.append)
    assert np.all(np.diff(reports) >= 0) and 0 < reports[0] and reports[-1] <= 1
    assert len(reports) <= 2 * cfg.steps and reports[-1] == pytest.approx(1.0)  # the last group ran to the end
    assert res.steps[:2].max() < cfg.steps / 4
    assert np.diff(reports).max() > 0.1  # a constant image stopped early: the rest of its steps at once
    quiet = fit_batch(spec, grid, targets, range(6), 0, cfg, group=3)
    for m in range(spec.num_layers):
        np.testing.assert_array_equal(res.weights[m], quiet.weights[m])
    np.testing.assert_array_equal(res.steps, quiet.steps)


def test_network_depends_only_on_seed_and_index():
    spec = SirenSpec((2, 16, 16, 1))
    grid = Grid2D.square(8)
    targets = images(10, size=8)
    cfg = FitConfig(steps=15, lr=1e-3, psnr_stop=None)
    whole = fit_batch(spec, grid, targets, range(100, 110), 7, cfg)
    part = fit_batch(spec, grid, targets[3:6], range(103, 106), 7, cfg)
    for m in range(3):
        np.testing.assert_allclose(whole.weights[m][3:6], part.weights[m], atol=1e-5)
    w_a, _ = init_params(spec, 7, [5])
    w_b, _ = init_params(spec, 7, [4, 5])
    assert torch.equal(w_a[0][0], w_b[0][1])
    w_c, _ = init_params(spec, 8, [5])
    assert not torch.equal(w_a[0][0], w_c[0][0])


@pytest.mark.parametrize("init", INITS)
@pytest.mark.parametrize("widths", [(2, 32, 32, 1), (1, 32, 32, 1), (2, 16, 24, 8, 3)])
def test_init_ranges_follow_the_recipe(init, widths):
    """siren: first layer U(+-1/d_in), later U(+-sqrt(6/d_in)/w0), biases alike. The published code
    (nn/inr.py) never sets is_first, so its first layer takes the hidden range too; it zeroes the
    sine layers' biases and draws the output layer as nn.Linear (U(+-1/sqrt(d_in)), bias too);
    reference = published with a SIREN-range, zero-bias output layer; reference-siren-first =
    reference with siren's first layer."""
    spec = SirenSpec(widths, init=init)
    w, b = init_params(spec, 0, range(64))
    M = len(widths) - 1
    for m in range(M):
        d_in, last = widths[m], m == M - 1
        if m == 0 and init in ("siren", "reference-siren-first"):
            bound = 1 / d_in
        elif last and init == "published":
            bound = 1 / d_in ** 0.5
        else:
            bound = (6 / d_in) ** 0.5 / 30
        assert w[m].abs().max() <= bound and w[m].abs().max() > 0.8 * bound, (m, bound)
        if init == "siren" or (init == "published" and last):
            assert b[m].abs().max() <= bound and b[m].abs().max() > 0.8 * bound
        else:
            assert not b[m].any()
    assert spec.output_offset == (0.0 if init == "siren" else 0.5)
    recorded = spec.to_manifest()["init_ranges"]
    assert [r["weight"] for r in recorded] == pytest.approx([t.abs().max().item() for t in w], rel=0.2)


def test_init_variants_share_their_common_layers():
    """The variants differ only where their recipes do: same draws elsewhere (same seed stream)."""
    draw = {i: init_params(SirenSpec((2, 32, 32, 1), init=i), 0, range(16)) for i in INITS}
    assert torch.equal(draw["published"][0][0], draw["reference"][0][0])  # same first layer
    assert torch.equal(draw["published"][0][1], draw["reference"][0][1])
    assert torch.equal(draw["reference"][0][2], draw["reference-siren-first"][0][2])
    ratio = draw["reference-siren-first"][0][0] / draw["reference"][0][0]  # same draws, other range
    torch.testing.assert_close(ratio, torch.full_like(ratio, (1 / 2) / ((6 / 2) ** 0.5 / 30)))


@pytest.mark.parametrize("widths", [(2, 32, 32, 1), (2, 16, 16, 16, 3), (1, 32, 32, 1)])
def test_parameters_load_into_siren_pytorch(widths):
    siren_pytorch = pytest.importorskip("siren_pytorch")
    spec = SirenSpec(widths)
    kw = spec.to_manifest()["siren_pytorch"]["kwargs"]
    net = siren_pytorch.SirenNet(**kw)
    w, b = init_params(spec, 0, [3])
    w = [t + 0.01 * torch.randn_like(t) for t in w]  # not just the init
    layers = list(net.layers) + [net.last_layer]
    with torch.no_grad():
        for layer, wm, bm in zip(layers, w, b):
            layer.weight.copy_(wm[0])
            layer.bias.copy_(bm[0])
        x = torch.rand(50, widths[0]) * 2 - 1
        np.testing.assert_allclose(net(x), forward(spec, w, b, x)[0], atol=1e-5)


def test_psnr_of_perfect_fit_is_large_and_monotone():
    mse = torch.tensor([1e-2, 1e-4])
    p = psnr(mse)
    assert torch.allclose(p, torch.tensor([20.0, 40.0]))


def test_compiled_step_matches_eager():
    spec = SirenSpec((2, 16, 16, 1))
    grid = Grid2D.square(10)
    targets = images(8, size=10)
    cfg = FitConfig(steps=30, lr=1e-3, psnr_stop=35.0)
    eager = fit_batch(spec, grid, targets, range(8), 0, cfg)
    compiled = fit_batch(spec, grid, targets, range(8), 0, cfg, compile=True)
    for m in range(3):
        np.testing.assert_allclose(compiled.weights[m], eager.weights[m], atol=1e-4)
    np.testing.assert_allclose(compiled.psnr, eager.psnr, atol=0.05)
