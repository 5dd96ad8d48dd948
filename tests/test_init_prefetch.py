"""Initial parameters drawn ahead of the fit (zoo.fit.fitter.InitAhead) and the cheaper init_params:
the same bits as the plain path, for groups, a ragged last group, consecutive chunks and whole stores;
a failed background draw surfaces as its own error."""

import threading

import numpy as np
import pytest
import torch

from zoo.fit import fitter, triton_step
from zoo.fit.fitter import FitConfig, InitAhead, fit_batch
from zoo.fit.siren import INITS, Grid2D, SirenSpec, init_params, init_ranges, network_seed

from generate_helpers import TINY, assert_identical_stores


def network_seed_as_first_written(base, index):
    state = np.random.SeedSequence([int(base), int(index)]).generate_state(2, dtype=np.uint32)
    return int(state.astype(np.uint64) @ np.array([1, 1 << 31], dtype=np.uint64)) & ((1 << 63) - 1)


def init_params_one_by_one(spec, seed, indices):
    """init_params as it was first written: a new generator per network, every tensor indexed anew."""
    weights = [torch.empty(len(indices), o, i) for i, o in zip(spec.widths[:-1], spec.widths[1:])]
    biases = [torch.empty(len(indices), o) for o in spec.widths[1:]]
    for k, index in enumerate(indices):
        gen = torch.Generator().manual_seed(network_seed_as_first_written(seed, index))
        for m, bounds in enumerate(init_ranges(spec)):
            weights[m][k].uniform_(-bounds["weight"], bounds["weight"], generator=gen)
            if bounds["bias"]:
                biases[m][k].uniform_(-bounds["bias"], bounds["bias"], generator=gen)
            else:
                biases[m][k].zero_()
    return weights, biases


def assert_same_bits(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        x, y = np.asarray(x), np.asarray(y)
        assert x.shape == y.shape and x.dtype == y.dtype
        assert x.tobytes() == y.tobytes()


def arrays(result):
    """Everything a fit returns, as arrays."""
    return result.weights + result.biases + [result.mse, result.psnr, result.steps]


@pytest.mark.parametrize("case", range(4))
def test_init_params_draws_the_bits_it_always_drew(case):
    """Random architectures, every init, indices out of order: the same draws as before it was made faster."""
    rng = np.random.default_rng(case)
    widths = tuple(int(w) for w in rng.integers(1, 40, size=int(rng.integers(3, 6))))
    spec = SirenSpec(widths, w0_first=float(rng.uniform(1, 40)), init=INITS[case % len(INITS)])
    seed = int(rng.integers(0, 1 << 40))
    indices = [int(i) for i in rng.choice(1 << 20, size=9, replace=False)]
    network_seed.cache_clear()
    got = init_params(spec, seed, indices)
    want = init_params_one_by_one(spec, seed, indices)
    assert_same_bits(got[0] + got[1], want[0] + want[1])
    from_numpy = init_params(spec, seed, np.array(indices))  # numpy indices draw the same networks
    assert_same_bits(from_numpy[0] + from_numpy[1], want[0] + want[1])


def test_network_seed_keeps_its_values():
    rng = np.random.default_rng(5)
    for base, index in zip(rng.integers(0, 1 << 62, size=50), rng.integers(0, 1 << 40, size=50)):
        want = network_seed_as_first_written(base, index)
        assert network_seed(int(base), int(index)) == want
        assert network_seed(np.int64(base), np.int64(index)) == want  # the cache takes numpy integers


@pytest.fixture
def ahead(monkeypatch):
    """A fresh draw-ahead slot, and a record of (thread name, networks) per init_params call."""
    slot, calls, draw = InitAhead(), [], fitter.init_params

    def recorded(spec, seed, indices):
        calls.append((threading.current_thread().name, list(indices)))
        return draw(spec, seed, indices)

    monkeypatch.setattr(fitter, "INIT_AHEAD", slot)
    monkeypatch.setattr(fitter, "init_params", recorded)
    return calls


def images(n, points, seed):
    return torch.rand(n, points, 1, generator=torch.Generator().manual_seed(seed))


def test_draw_ahead_fits_the_same_bits_over_groups_and_chunks(ahead):
    """Two consecutive chunks (7 and 3 networks) in groups of 3: ragged last groups, the second chunk
    taking the first rows of the draw the first one started. Every draw but the first is made on the
    background thread, and the result is bitwise the plain path's."""
    rng = np.random.default_rng(1)
    spec = SirenSpec((2, int(rng.integers(4, 12)), int(rng.integers(4, 12)), 1), init="reference")
    grid, cfg, seed = Grid2D.square(6), FitConfig(steps=4, lr=1e-3, psnr_stop=None), 11
    targets = images(10, 36, seed)
    chunks = [range(0, 7), range(7, 10)]
    plain = [fit_batch(spec, grid, targets[c.start : c.stop], c, seed, cfg, group=3, draw_ahead=False) for c in chunks]
    ahead.clear()
    overlapped = [fit_batch(spec, grid, targets[c.start : c.stop], c, seed, cfg, group=3, draw_ahead=True)
                  for c in chunks]
    for p, o in zip(plain, overlapped):
        assert_same_bits(arrays(p), arrays(o))
    in_place = [ids for thread, ids in ahead if not thread.startswith("zoo-init-ahead")]
    assert in_place == [[0, 1, 2]]  # only the very first group is drawn in place
    drawn_ahead = [ids for thread, ids in ahead if thread.startswith("zoo-init-ahead")]
    assert drawn_ahead[:3] == [[3, 4, 5], [6], [7, 8, 9]]  # the next chunk's first group, from the end of the first


def test_a_draw_that_does_not_match_is_replaced(ahead):
    """Another seed or networks that are not the start of the draw under way: drawn in place, same bits."""
    spec = SirenSpec((2, 8, 8, 1))
    slot = fitter.INIT_AHEAD
    slot.start(spec, 3, range(10, 20))
    for seed, ids in [(4, range(10, 12)), (3, range(11, 13))]:
        got = slot.take(spec, seed, ids)
        assert_same_bits(got[0] + got[1], sum(init_params_one_by_one(spec, seed, list(ids)), []))
        slot.start(spec, 3, range(10, 20))
    got = slot.take(spec, 3, range(10, 14))  # a prefix: taken from the draw
    assert_same_bits(got[0] + got[1], sum(init_params_one_by_one(spec, 3, list(range(10, 14))), []))
    assert [ids for thread, ids in ahead if not thread.startswith("zoo-init-ahead")] == [[10, 11], [11, 12]]


def test_a_failed_background_draw_raises_its_own_error(ahead, monkeypatch):
    """The error of the draw made ahead is the fit's error (not a hang, not another error), and the
    slot works again afterwards."""
    planted, raised_on = RuntimeError("planted draw failure"), []
    draw = fitter.init_params

    def failing(spec, seed, indices):
        if 4 in list(indices):
            raised_on.append(threading.current_thread().name)
            raise planted
        return draw(spec, seed, indices)

    monkeypatch.setattr(fitter, "init_params", failing)
    spec, grid, cfg = SirenSpec((2, 8, 8, 1)), Grid2D.square(5), FitConfig(steps=2, lr=1e-3, psnr_stop=None)
    targets = images(6, 25, 0)
    result = {}

    def fit():
        try:
            fit_batch(spec, grid, targets, range(6), 0, cfg, group=2, draw_ahead=True)
        except BaseException as exc:  # handed to the test's thread
            result["error"] = exc

    worker = threading.Thread(target=fit, daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "the fit hung on the failed draw"
    assert result.get("error") is planted
    assert len(raised_on) == 1 and raised_on[0].startswith("zoo-init-ahead")  # it failed in the background
    monkeypatch.setattr(fitter, "init_params", draw)
    again = fit_batch(spec, grid, targets, range(6), 0, cfg, group=2, draw_ahead=True)
    plain = fit_batch(spec, grid, targets, range(6), 0, cfg, group=2, draw_ahead=False)
    assert_same_bits(arrays(again), arrays(plain))


@pytest.mark.skipif(not triton_step.available(), reason="Triton is not installed")
@pytest.mark.skipif(not triton_step.interpreted() and not torch.cuda.is_available(),
                    reason="neither a GPU nor Triton's interpreter")
def test_triton_fit_takes_the_draw_made_ahead(ahead):
    """The Triton step (interpreted where no GPU is present) given its parameters drawn ahead: the same
    bits as drawing them itself, with a ragged last group."""
    spec = SirenSpec((2, 16, 16, 1), init="reference")
    grid, cfg = Grid2D.square(4), FitConfig(steps=2, lr=1e-3, psnr_stop=None)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    targets = images(3, 16, 2)
    plain = fit_batch(spec, grid, targets, range(3), 5, cfg, device=device, group=2, backend="triton",
                      draw_ahead=False)
    overlapped = fit_batch(spec, grid, targets, range(3), 5, cfg, device=device, group=2, backend="triton",
                           draw_ahead=True)
    assert overlapped.implementation == "triton"
    assert_same_bits(arrays(plain), arrays(overlapped))
    assert [ids for thread, ids in ahead if thread.startswith("zoo-init-ahead")][:1] == [[2]]


def test_draw_ahead_defaults_to_cuda_only(ahead):
    spec, grid = SirenSpec((2, 8, 8, 1)), Grid2D.square(4)
    fit_batch(spec, grid, images(3, 16, 0), range(3), 0, FitConfig(steps=1, psnr_stop=None), group=2)
    assert ahead and all(not thread.startswith("zoo-init-ahead") for thread, _ in ahead)


def test_store_made_with_draws_ahead_is_the_plain_store(tmp_path, monkeypatch, tiny_store):
    """``zoo generate`` (chunks of 16, the last one ragged) with every chunk's parameters drawn ahead:
    the store is the plain run's, bit for bit."""
    from zoo.generate import inr
    from zoo.generate.run import GenerateOptions, generate

    plain_fit = inr.fit_batch
    monkeypatch.setattr(fitter, "INIT_AHEAD", InitAhead())
    monkeypatch.setattr(inr, "fit_batch", lambda *args, **kwargs: plain_fit(*args, draw_ahead=True, **kwargs))
    out = tmp_path / "digits"
    generate(GenerateOptions(out=str(out), **TINY), log=lambda *_: None)
    assert_identical_stores(out, tiny_store)
