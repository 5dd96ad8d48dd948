"""ScaleGMN under ``zoo train --precision bf16`` (bfloat16 autocast): every per-edge tensor stays bfloat16
between products (small float32 operands, biases and the input networks' weights, are cast to it
instead of promoting the per-edge result to float32), and the step still computes the model's function
up to bfloat16 rounding (against the same model in float64), on random architectures, both variants
and both symmetries. The float32 function is covered by tests/test_scalegmn_speed.py (against the plain
equations)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.overrides import TorchFunctionMode

from dws.scalegmn import ScaleGMNInvariant
from dws_helpers import random_widths, random_ws

D = 16  # the models' channels: no width of the random input networks (<= 6) is this


def random_model(variant, symmetry, seed):
    widths = random_widths(600 + seed, min_layers=2, max_layers=4, max_width=6)
    torch.manual_seed(seed)
    model = ScaleGMNInvariant(widths, 3, symmetry, variant, hidden=D, num_layers=2 + seed % 3)
    return model, random_ws(widths, 4, seed=seed, dtype=torch.float32)


def bf16_step(model, ws):
    """Forward and loss under autocast, gradients outside it (as the trainer runs a step)."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(ws)
    grads = torch.autograd.grad(out.float().square().sum(), list(model.parameters()), allow_unused=True)
    return out, grads


class PerEdgeDtypes(TorchFunctionMode):
    """The dtypes of every torch function's per-edge outputs in the forward pass, ``[B, n_out, n_in, D]``
    with both widths above 1 (a gradient takes its tensor's dtype, so the backward pass follows)."""

    def __init__(self):
        super().__init__()
        self.seen: dict[torch.dtype, set[str]] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dim() == 4 and t.shape[-1] == D and min(t.shape[1:3]) > 1:
                self.seen.setdefault(t.dtype, set()).add(getattr(func, "__name__", str(func)))
        return out


@pytest.mark.parametrize("variant", ["forward", "bidirectional"])
@pytest.mark.parametrize("symmetry", ["sign", "scale"])
def test_no_per_edge_tensor_is_float32_under_bf16_autocast(variant, symmetry):
    """A float32 per-edge tensor would be a float32 copy of a bfloat16 one (a cast each way, float32
    LayerNorm and SiLU forward and backward), which is where the step's time went before."""
    model, ws = random_model(variant, symmetry, seed=1)
    with PerEdgeDtypes() as dtypes, torch.autocast("cpu", dtype=torch.bfloat16):
        model(ws)
    assert dtypes.seen.get(torch.bfloat16), "no per-edge tensor seen: the check would be empty"
    assert torch.float32 not in dtypes.seen, f"float32 per-edge tensors from {sorted(dtypes.seen[torch.float32])}"


def relative_error(got, want) -> float:
    return ((got.double() - want).norm() / want.norm()).item()


@pytest.mark.parametrize("variant", ["forward", "bidirectional"])
@pytest.mark.parametrize("symmetry", ["sign", "scale"])
@pytest.mark.parametrize("seed", range(2))
def test_the_bf16_step_is_the_float64_function_up_to_bf16_rounding(variant, symmetry, seed):
    """Output and all gradients (concatenated) against the same weights in float64; bfloat16 keeps 8
    bits, ~0.4% per rounding, so a few percent after the layers. Control: the result is not float32's."""
    model, ws = random_model(variant, symmetry, seed)
    exact = copy.deepcopy(model).double()
    want = exact(ws.to(torch.float64))
    want_grads = torch.autograd.grad(want.square().sum(), list(exact.parameters()), allow_unused=True)
    got, grads = bf16_step(model, ws)
    assert got.dtype == torch.bfloat16 and relative_error(got, want) < 0.05
    pairs = [(g, w) for g, w in zip(grads, want_grads, strict=True) if w is not None]
    assert all(g is not None and g.dtype == torch.float32 for g, _ in pairs)
    flat = [torch.cat([t.flatten() for t in ts]) for ts in zip(*pairs)]
    assert relative_error(*flat) < 0.1
    assert not torch.equal(got.float(), model(ws))  # autocast reached the model

