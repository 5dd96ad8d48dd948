"""The native (C) fitting step and Adam: against float64 PyTorch, against torch.optim.Adam, network
independence, whole fits on every path, and what happens where the kernels cannot be built."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from zoo import cbuild
from zoo.fit import native
from zoo.fit.adam import MaskedAdam
from zoo.fit.fitter import FitConfig, fit_batch
from zoo.fit.native_step import NativeSirenStep, native_step_supported
from zoo.fit.siren import Grid2D, SirenSpec, init_params, mse_and_grads

needs_native = pytest.mark.skipif(not native.available(), reason="native kernels not buildable here")


def random_case(rng):
    """A random architecture the native step supports (hidden widths multiples of 4, P multiple of
    8), on a grid (any width, tails included) or on a point list, with 1-3 output channels."""
    depth = int(rng.integers(1, 4))  # hidden layers
    grid = bool(rng.integers(0, 2))
    d0 = 2 if grid else int(rng.integers(1, 4))
    widths = (d0, *(4 * int(rng.integers(1, 10)) for _ in range(depth)), int(rng.integers(1, 4)))
    if grid:
        height, width = int(rng.integers(1, 12)), int(rng.integers(1, 30))
        height = 8 * int(np.ceil(height / 8)) if (height * width) % 8 else height
        coords = Grid2D(torch.linspace(-1, 1, height), torch.linspace(-1, 0.7, width))
        points = height * width
    else:
        points = 8 * int(rng.integers(1, 40))
        coords = torch.rand(points, d0, generator=torch.Generator().manual_seed(int(rng.integers(1 << 30)))) * 2 - 1
    return SirenSpec(widths, init=str(rng.choice(["siren", "reference"]))), coords, points


def perturbed_params(spec, seed, K):
    w, b = init_params(spec, seed, range(K))
    g = torch.Generator().manual_seed(seed)
    return ([t + 0.05 * torch.randn(t.shape, generator=g) for t in w],
            [t + 0.05 * torch.randn(t.shape, generator=g) for t in b])


@needs_native
@pytest.mark.parametrize("seed", range(12))
def test_native_step_matches_the_reference_step(seed):
    rng = np.random.default_rng(100 + seed)
    spec, coords, points = random_case(rng)
    K = int(rng.integers(1, 7))
    assert native_step_supported(spec, coords, "cpu")
    w, b = perturbed_params(spec, seed, K)
    targets = torch.rand(K, points, spec.widths[-1], generator=torch.Generator().manual_seed(seed))
    mse, gw, gb = mse_and_grads(spec, w, b, coords, targets)
    coords64 = Grid2D(coords.ys.double(), coords.xs.double()) if isinstance(coords, Grid2D) else coords.double()
    mse64, gw64, gb64 = mse_and_grads(spec, [t.double() for t in w], [t.double() for t in b], coords64, targets.double())

    def error(grads):
        return max(float((g.double() - e).abs().max() / e.abs().max()) for g, e in zip(grads, gw64 + gb64))

    step = NativeSirenStep(spec, coords, max_networks=K)
    for _ in range(2):  # a second call reuses the buffers
        n_mse, n_gw, n_gb = step(spec, w, b, coords, targets)
        torch.testing.assert_close(n_mse.double(), mse64, rtol=1e-5, atol=1e-7)
        # float32 rounding, amplified by w0 = 30, is of the order of PyTorch's own (a wrong term
        # would be off by orders of magnitude)
        assert error(n_gw + n_gb) <= max(3 * error(gw + gb), 3e-5)
    assert all(g.shape == e.shape for g, e in zip(n_gw + n_gb, gw + gb))


@needs_native
def test_a_network_does_not_depend_on_the_others_in_its_group():
    """Bit-identical results for a network fitted alone, with others, or at another position:
    what makes a store independent of group size and worker count."""
    spec, grid = SirenSpec((2, 16, 12, 3)), Grid2D.square(8)
    w, b = perturbed_params(spec, 1, 5)
    targets = torch.rand(5, 64, 3)
    step = NativeSirenStep(spec, grid, max_networks=5)
    mse, gw, gb = (x.clone() if torch.is_tensor(x) else [t.clone() for t in x] for x in step(spec, w, b, grid, targets))
    order = [3, 1]
    mse2, gw2, gb2 = step(spec, [t[order] for t in w], [t[order] for t in b], grid, targets[order])
    assert torch.equal(mse2, mse[order])
    for a, e in zip(gw2 + gb2, gw + gb):
        assert torch.equal(a, e[order])


@needs_native
def test_unsupported_shapes_fall_back_and_are_refused_by_the_step():
    grid = Grid2D.square(9)  # 81 points
    assert not native_step_supported(SirenSpec((2, 32, 32, 1)), grid, "cpu")
    assert not native_step_supported(SirenSpec((2, 30, 32, 1)), Grid2D.square(8), "cpu")
    assert not native_step_supported(SirenSpec((3, 32, 1)), Grid2D.square(8), "cpu")  # a grid is 2-D
    assert not native_step_supported(SirenSpec((2, 32, 1)), Grid2D.square(8), "cuda")
    spec = SirenSpec((2, 32, 32, 1))
    step = NativeSirenStep(spec, Grid2D.square(8), max_networks=2)
    w, b = init_params(spec, 0, range(2))
    with pytest.raises(ValueError, match="other coordinates or another architecture"):
        step(SirenSpec((2, 32, 32, 3)), w, b, step.coords, torch.rand(2, 64, 1))
    with pytest.raises(ValueError, match="float32 CPU tensors"):
        step(spec, [t.double() for t in w], b, step.coords, torch.rand(2, 64, 1))
    with pytest.raises(ValueError, match="room for 2"):
        w3, b3 = init_params(spec, 0, range(3))
        step(spec, w3, b3, step.coords, torch.rand(3, 64, 1))
    # the fitter takes another path for an unsupported shape and still fits
    result = fit_batch(SirenSpec((2, 6, 1)), grid, torch.rand(2, 81, 1), range(2), 0,
                       FitConfig(steps=3, lr=1e-3, psnr_stop=None))
    assert np.isfinite(result.psnr).all()


@needs_native
def test_native_adam_follows_torch_adam_and_freezes_masked_networks():
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(4, 5, 3, generator=g), torch.randn(4, 5, generator=g)]
    ours = MaskedAdam([p.clone() for p in params], lr=1e-2)
    theirs = [torch.nn.Parameter(p.clone()) for p in params]
    opt = torch.optim.Adam(theirs, lr=1e-2)
    for _ in range(6):
        grads = [torch.randn(p.shape, generator=g) for p in params]
        ours.step(grads)
        for p, grad in zip(theirs, grads):
            p.grad = grad.clone()
        opt.step()
    for a, e in zip(ours.params, theirs):
        torch.testing.assert_close(a, e.detach(), rtol=1e-5, atol=1e-6)  # FMA rounding apart
    frozen = [p.clone() for p in ours.params]
    ours.step([torch.randn(p.shape, generator=g) for p in params], active=torch.tensor([True, False, True, False]))
    for before, after in zip(frozen, ours.params):
        assert torch.equal(before[[1, 3]], after[[1, 3]])
        assert not torch.equal(before[[0, 2]], after[[0, 2]])


@needs_native
def test_native_and_reference_fits_agree(monkeypatch):
    """Whole fits on the two CPU paths: the native step (and Adam) and the PyTorch ones."""
    spec, grid = SirenSpec((2, 12, 12, 1)), Grid2D.square(8)
    targets = torch.rand(5, 64, 1)
    cfg = FitConfig(steps=40, lr=1e-3, psnr_stop=None)
    fits = [fit_batch(spec, grid, targets, range(5), 3, cfg)]
    monkeypatch.setattr("zoo.fit.fitter.native_step_supported", lambda *args: False)
    monkeypatch.setattr("zoo.fit.adam.native.library", lambda: None)
    fits.append(fit_batch(spec, grid, targets, range(5), 3, cfg))
    assert [fit.implementation for fit in fits] == ["native-c", "pytorch"]
    native_fit = fits[0]
    for other in fits[1:]:
        for m in range(3):
            np.testing.assert_allclose(native_fit.weights[m], other.weights[m], atol=1e-4)
        np.testing.assert_allclose(native_fit.psnr, other.psnr, atol=0.01)


@needs_native
def test_a_native_fit_reports_the_native_steps_mse_of_its_final_networks(monkeypatch):
    """The table's MSE and PSNR of a native fit come from the C step on the final networks, never from
    PyTorch's forward (its BLAS differs by CPU vendor: MKL on Intel), so the same networks get the same
    table on every x86-64 CPU with AVX2; early stops and compaction included."""
    spec, grid = SirenSpec((2, 8, 12, 1)), Grid2D.square(16)
    targets = torch.rand(6, 256, 1, generator=torch.Generator().manual_seed(5))
    targets[:3] = 0.5 + 0.01 * targets[:3]  # near-constant images: these stop early, the others don't
    cfg = FitConfig(steps=60, lr=1e-2, psnr_stop=25.0)
    monkeypatch.setattr("zoo.fit.fitter.mse_and_grads", lambda *args: pytest.fail("PyTorch's forward evaluated a native fit"))
    fit = fit_batch(spec, grid, targets, range(6), 4, cfg)
    assert fit.implementation == "native-c" and 0 < int((fit.steps < cfg.steps).sum()) < 6  # some stopped early
    weights, biases = [torch.from_numpy(w) for w in fit.weights], [torch.from_numpy(b) for b in fit.biases]
    expected = NativeSirenStep(spec, grid, 6)(spec, weights, biases, grid, targets)[0]
    assert np.array_equal(fit.mse, expected.numpy())
    torch.testing.assert_close(torch.from_numpy(fit.mse), mse_and_grads(spec, weights, biases, grid, targets)[0],
                               rtol=1e-5, atol=1e-8)


def _library_in_subprocess(tmp_path, **env):
    code = ("import warnings; warnings.simplefilter('always')\n"
            "from zoo.fit import native; print('LOADED' if native.library() is not None else 'NONE')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "ZOO_CACHE_DIR": str(tmp_path), **env})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip(), done.stderr


@pytest.mark.skipif(not cbuild.cpu_supported(), reason="needs x86-64 with AVX2 and FMA")
def test_the_library_is_built_once_into_the_cache_and_can_be_switched_off(tmp_path):
    if cbuild.compiler() is None:
        pytest.skip("no C compiler")
    stale = tmp_path / "native" / "siren_step-0000000000000000.so"  # a build of an older source
    stale.parent.mkdir()
    stale.write_bytes(b"old")
    assert _library_in_subprocess(tmp_path)[0] == "LOADED"
    built = list((tmp_path / "native").glob("siren_step-*.so"))
    assert len(built) == 1 and built[0] != stale  # the new build replaced the stale one
    mtime = built[0].stat().st_mtime_ns
    assert _library_in_subprocess(tmp_path)[0] == "LOADED"
    assert built[0].stat().st_mtime_ns == mtime  # reused, not rebuilt
    assert _library_in_subprocess(tmp_path, ZOO_NATIVE="0")[0] == "NONE"


@pytest.mark.skipif(not cbuild.cpu_supported(), reason="needs x86-64 with AVX2 and FMA")
def test_a_failing_compiler_gives_one_warning_and_the_pytorch_path(tmp_path):
    fake = tmp_path / "broken-cc"
    fake.write_text("#!/bin/sh\necho 'broken-cc: cannot compile' >&2\nexit 1\n")
    fake.chmod(0o755)
    out, err = _library_in_subprocess(tmp_path, CC=str(fake))
    assert out == "NONE"
    assert "native fitting kernels unavailable" in err and "cannot compile" in err
    assert not list((tmp_path / "native").glob("*.so"))  # no half-written library left behind


@pytest.mark.skipif(not cbuild.cpu_supported(), reason="needs x86-64 with AVX2 and FMA")
def test_no_compiler_says_so_once(tmp_path):
    out, err = _library_in_subprocess(tmp_path, PATH=str(tmp_path), CC="")
    assert out == "NONE"
    assert err.count("no C compiler") == 1
