"""Batched MLP classifiers: K networks held as stacked tensors and trained as one computation.

Convention (every classifier store's manifest states it, see :meth:`MlpSpec.to_manifest`): for
widths ``d_0 .. d_M``, ``h_0 = x``, ``h_m = act(W_m h_{m-1} + b_m)`` for ``m < M`` and
``logits = W_M h_{M-1} + b_M``, with ``W_m`` of shape ``[d_m, d_{m-1}]`` (``nn.Linear``'s layout),
so a stored network is ``nn.Sequential(Linear, act, ..., Linear)``. Training may apply inverted
dropout after each hidden activation; evaluation never does.

The backward pass is written by hand (three batched matmuls per layer and the activation's
derivative): it skips the input gradient of the first layer and autograd's bookkeeping, ~20% of
a CIFAR-sized step on a CPU core, and it gives each network's gradient of its own loss only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

Tensor = torch.Tensor
_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


@dataclass(frozen=True)
class Activation:
    name: str
    formula: str  # what the manifest states
    module: str  # the torch.nn module computing it (the one-network reference uses it)
    forward: Callable[[Tensor], Tensor]
    derivative: Callable[[Tensor, Tensor], Tensor]  # (pre-activation z, act(z)) -> d act / d z
    in_place: Callable[[Tensor], Tensor] | None = None  # forward overwriting its input, where torch has one

    def make_module(self) -> torch.nn.Module:
        return getattr(torch.nn, self.module)()


def _gelu_derivative(z: Tensor, a: Tensor) -> Tensor:
    return 0.5 * (1 + torch.erf(z * _INV_SQRT2)) + z * torch.exp(-0.5 * z * z) * _INV_SQRT_2PI


ACTIVATIONS: dict[str, Activation] = {a.name: a for a in [
    Activation("relu", "max(x, 0)", "ReLU", torch.relu, lambda z, a: (z > 0).to(z.dtype), torch.relu_),
    Activation("tanh", "tanh(x)", "Tanh", torch.tanh, lambda z, a: 1 - a * a, torch.tanh_),
    Activation("sigmoid", "1 / (1 + exp(-x))", "Sigmoid", torch.sigmoid, lambda z, a: a * (1 - a), torch.sigmoid_),
    Activation("gelu", "x * (1 + erf(x / sqrt(2))) / 2 (exact, not the tanh approximation)", "GELU", F.gelu,
               _gelu_derivative),
]}


def get_activation(name: str) -> Activation:
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; known: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


@dataclass(frozen=True)
class MlpSpec:
    """Layer widths of a classifier zoo's networks (the activation is a per-run setting)."""

    widths: tuple[int, ...]

    def __post_init__(self):
        if len(self.widths) < 2 or min(self.widths) < 1:
            raise ValueError(f"an MLP needs at least an input and an output width, got {self.widths}")

    @property
    def num_layers(self) -> int:
        return len(self.widths) - 1

    @property
    def num_classes(self) -> int:
        return self.widths[-1]


def init_bound(d_in: int, scale: float = 1.0) -> float:
    """Half-width of the uniform range of a layer's weights and bias: ``nn.Linear``'s default
    (``kaiming_uniform_(a=sqrt(5))`` gives ``1 / sqrt(d_in)``), times ``scale``."""
    return scale / math.sqrt(d_in)


def init_params(spec: MlpSpec, seeds, scales) -> tuple[list[Tensor], list[Tensor]]:
    """Stacked initial parameters: network k draws from ``torch.Generator().manual_seed(seeds[k])``,
    ``W_1, b_1, W_2, ...`` in that order, each ``U(-bound, bound)`` (:func:`init_bound`)."""
    K = len(seeds)
    weights = [torch.empty(K, o, i) for i, o in zip(spec.widths[:-1], spec.widths[1:])]
    biases = [torch.empty(K, o) for o in spec.widths[1:]]
    for k, (seed, scale) in enumerate(zip(seeds, scales)):
        gen = torch.Generator().manual_seed(int(seed))
        for w, b in zip(weights, biases):
            bound = init_bound(w.shape[2], scale)
            w[k].uniform_(-bound, bound, generator=gen)
            b[k].uniform_(-bound, bound, generator=gen)
    return weights, biases


@dataclass
class ForwardCache:
    inputs: list[Tensor]  # inputs[m]: the input of layer m (after dropout), [K, B, d_m]
    pre: list[Tensor]  # pre-activations of the hidden layers
    act: list[Tensor]  # act(pre), before dropout
    masks: list[Tensor] | None  # scaled dropout masks of the hidden layers


def forward_train(weights, biases, x: Tensor, activation: Activation, masks=None) -> tuple[Tensor, ForwardCache]:
    """Logits ``[K, B, d_M]`` of K networks on their own inputs ``x`` ``[K, B, d_0]``, and what the
    backward pass needs. ``masks[m]`` (``[K, B, d_{m+1}]``, 0 or ``1/(1-p)``) is hidden layer m's dropout."""
    cache = ForwardCache([x], [], [], masks)
    h = x
    last = len(weights) - 1
    for m, (w, b) in enumerate(zip(weights, biases)):
        z = torch.baddbmm(b.unsqueeze(1), h, w.transpose(1, 2))
        if m == last:
            return z, cache
        a = activation.forward(z)
        h = a * masks[m] if masks is not None else a
        cache.pre.append(z)
        cache.act.append(a)
        cache.inputs.append(h)
    raise AssertionError("unreachable")


def backward(weights, cache: ForwardCache, grad_logits: Tensor, activation: Activation, out=None):
    """Gradients of ``sum_k loss_k`` for every weight ``[K, d_m, d_{m-1}]`` and bias ``[K, d_m]``,
    written into ``out = (grad_w, grad_b)`` when given (a training loop reuses them: fresh
    multi-megabyte tensors every step would be page-faulted in again each time)."""
    L = len(weights)
    grad_w, grad_b = out if out is not None else ([None] * L, [None] * L)
    g = grad_logits
    for m in range(L - 1, -1, -1):
        if out is None:
            grad_w[m] = torch.bmm(g.transpose(1, 2), cache.inputs[m])
            grad_b[m] = g.sum(dim=1)
        else:
            torch.bmm(g.transpose(1, 2), cache.inputs[m], out=grad_w[m])
            torch.sum(g, dim=1, out=grad_b[m])
        if m > 0:
            g = torch.bmm(g, weights[m])
            if cache.masks is not None:
                g.mul_(cache.masks[m - 1])
            g.mul_(activation.derivative(cache.pre[m - 1], cache.act[m - 1]))
    return grad_w, grad_b


def logits(weights, biases, x: Tensor, activation: Activation) -> Tensor:
    """One network (``weights[m]`` ``[d_m, d_{m-1}]``) on ``x`` ``[N, d_0]``: ``[N, d_M]``, no dropout."""
    h = x
    for m, (w, b) in enumerate(zip(weights, biases)):
        h = torch.addmm(b, h, w.t())
        if m < len(weights) - 1:
            h = activation.forward(h)
    return h


def stacked_logits(weights, biases, x: Tensor, activation: Activation) -> Tensor:
    """K networks (``weights[m]`` ``[K, d_m, d_{m-1}]``) on shared inputs ``x`` ``[N, d_0]`` or on
    their own ``[K, N, d_0]``: logits ``[K, d_M, N]``, no dropout.

    Features come first, so every layer is one plain batched matmul and the first layer on shared
    inputs is one wide product ``[K*d_1, d_0] x [d_0, N]`` (no copy of ``x`` per network). The
    activation overwrites its input where it can: a fresh tensor per layer costs a CPU ~15% in
    page faults."""
    K = weights[0].shape[0]
    if x.dim() == 2:
        h = torch.addmm(biases[0].reshape(-1, 1), weights[0].reshape(-1, x.shape[1]), x.t()).view(K, -1, len(x))
    else:
        h = torch.baddbmm(biases[0].unsqueeze(2), weights[0], x.transpose(1, 2))
    act = activation.in_place or activation.forward
    for w, b in zip(weights[1:], biases[1:]):
        h = torch.baddbmm(b.unsqueeze(2), w, act(h))
    return h


def reference_network(weights, biases, activation: Activation, dropout: float = 0.0) -> torch.nn.Sequential:
    """The same network as a plain ``nn.Sequential`` (``Dropout`` after each hidden activation)."""
    layers: list[torch.nn.Module] = []
    for m, (w, b) in enumerate(zip(weights, biases)):
        linear = torch.nn.Linear(w.shape[1], w.shape[0])
        with torch.no_grad():
            linear.weight.copy_(w)
            linear.bias.copy_(b)
        layers.append(linear)
        if m < len(weights) - 1:
            layers.append(activation.make_module())
            if dropout:
                layers.append(torch.nn.Dropout(dropout))
    return torch.nn.Sequential(*layers)
