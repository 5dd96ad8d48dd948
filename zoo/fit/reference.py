"""One network at a time: a plain PyTorch SIREN (``nn.Linear`` + sine) with its own
``torch.optim.Adam`` and autograd, as the published recipe fits INRs. The yardstick that the
batched fitter is checked (tests) and timed (benchmarks) against."""

from __future__ import annotations

import torch
from torch import nn

from .fitter import FitConfig
from .siren import SirenSpec, init_params, psnr


class Siren(nn.Module):
    """``sin(w0 * (W x + b))`` hidden layers and a linear output, as :class:`SirenSpec` defines."""

    def __init__(self, spec: SirenSpec, weights, biases):
        super().__init__()
        self.spec = spec
        self.layers = nn.ModuleList()
        for w, b in zip(weights, biases):
            layer = nn.Linear(w.shape[1], w.shape[0])
            with torch.no_grad():
                layer.weight.copy_(w)
                layer.bias.copy_(b)
            self.layers.append(layer)

    def forward(self, x):
        for layer, w0 in zip(self.layers, self.spec.w0()):
            x = layer(x)
            if w0 is not None:
                x = torch.sin(w0 * x)
        return x + self.spec.output_offset if self.spec.output_offset else x


def fit_one(spec: SirenSpec, coords, target, index: int, seed: int, config: FitConfig, peak=1.0):
    """Returns ``(weights, biases, final_mse, steps_taken)`` for network ``index``."""
    w, b = init_params(spec, seed, [index])
    net = Siren(spec, [t[0] for t in w], [t[0] for t in b])
    opt = torch.optim.Adam(net.parameters(), lr=config.lr)
    steps = config.steps
    for step in range(config.steps):
        loss = (net(coords) - target).square().mean()
        if config.psnr_stop is not None and psnr(loss.detach(), peak) >= config.psnr_stop:
            steps = step
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    with torch.no_grad():
        final = (net(coords) - target).square().mean()
    return ([l.weight.detach() for l in net.layers], [l.bias.detach() for l in net.layers], float(final), steps)
