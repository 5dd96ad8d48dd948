"""The zoo kinds ``zoo generate`` knows: architecture, data source and fitting schedule of each.

Schedules follow the paper's appendix (Adam; MNIST/F-MNIST: 1,000 steps at 5e-4 with a PSNR-40
early stop; sine regression: 1,000 steps at 1e-4; sine SSL: 1,500 steps at 1e-3). The paper gives
no INR schedule for CIFAR-10; it uses the MNIST one.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..fit.fitter import FitConfig


@dataclass(frozen=True)
class ZooKind:
    name: str
    source: str  # default data source (``--dataset`` overrides it)
    widths: tuple[int, ...]
    fit: FitConfig
    targets: tuple[str, ...]  # per-network columns a task can predict
    description: str


IMAGE_FIT = FitConfig(steps=1000, lr=5e-4, psnr_stop=40.0)

KINDS: dict[str, ZooKind] = {
    k.name: k
    for k in [
        ZooKind("mnist-inr", "mnist", (2, 32, 32, 1), IMAGE_FIT, ("label",),
                "SIREN INRs of MNIST digits (paper: 55K/5K/10K)"),
        ZooKind("fmnist-inr", "fashion-mnist", (2, 32, 32, 1), IMAGE_FIT, ("label",),
                "SIREN INRs of Fashion-MNIST images"),
        ZooKind("cifar10-inr", "cifar10", (2, 32, 32, 3), IMAGE_FIT, ("label",),
                "SIREN INRs of CIFAR-10 images"),
        ZooKind("sine-regression", "sine-regression", (1, 32, 32, 1),
                FitConfig(steps=1000, lr=1e-4, psnr_stop=None), ("frequency",),
                "SIRENs of sin(bx), b ~ U(0.5, 10): frequency regression (800/100/100)"),
        ZooKind("sine-ssl", "sine-ssl", (1, 32, 32, 1),
                FitConfig(steps=1500, lr=1e-3, psnr_stop=None), ("amplitude", "frequency"),
                "SIRENs of a sin(bx), a, b ~ U(0, 10): self-supervised embeddings (4000/500/500)"),
    ]
}


def get_kind(name: str) -> ZooKind:
    if name not in KINDS:
        raise KeyError(f"unknown zoo kind {name!r}; known: {', '.join(KINDS)}")
    return KINDS[name]
