"""One network at a time with its own ``torch.optim.Adam`` and autograd: the yardstick that the
batched fitter is checked (tests) and timed (benchmarks) against."""

from __future__ import annotations

import torch

from .fitter import FitConfig
from .siren import SirenSpec, forward, init_params, psnr


def fit_one(spec: SirenSpec, coords, target, index: int, seed: int, config: FitConfig, peak=1.0):
    """Returns ``(weights, biases, final_mse, steps_taken)`` for network ``index``."""
    w, b = init_params(spec, seed, [index])
    params = [torch.nn.Parameter(t.clone()) for t in w + b]
    ws, bs = params[: spec.num_layers], params[spec.num_layers :]
    opt = torch.optim.Adam(params, lr=config.lr)
    target = target.unsqueeze(0)
    steps = config.steps
    for step in range(config.steps):
        loss = (forward(spec, ws, bs, coords) - target).square().mean()
        if config.psnr_stop is not None and psnr(loss.detach(), peak) >= config.psnr_stop:
            steps = step
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    with torch.no_grad():
        final = (forward(spec, ws, bs, coords) - target).square().mean()
    return [p.detach()[0] for p in ws], [p.detach()[0] for p in bs], float(final), steps
