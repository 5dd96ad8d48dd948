"""Batches of MLP weight-space elements and the neuron-permutation group acting on them.

Convention (the same as the weight store's): ``weights[m]`` is ``[B, d_{m+1}, d_m]`` (PyTorch's
out x in layout, layer m+1 of the paper) and ``biases[m]`` is ``[B, d_{m+1}]``; both may carry a
trailing channel dimension ``C``. The group is ``S_{d_1} x ... x S_{d_{M-1}}`` (hidden neurons
only; input and output neurons are not permuted), acting as in the paper's Eq. (3):
``W_m' = P_m^T W_m P_{m-1}``, i.e. hidden neuron ``i`` of the permuted network is neuron
``perm[i]`` of the original one. Where the activation allows it, hidden neurons may also be rescaled
(:meth:`WeightSpace.scale_neurons`: sign flips for sine and tanh, positive scales for ReLU).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

Tensor = torch.Tensor


@dataclass(frozen=True)
class WeightSpace:
    """A batch of MLPs: per-layer weight matrices and bias vectors (optionally with channels)."""

    weights: tuple[Tensor, ...]
    biases: tuple[Tensor, ...]

    def __post_init__(self):
        if len(self.weights) != len(self.biases) or len(self.weights) == 0:
            raise ValueError(
                f"need one bias per weight matrix, got {len(self.weights)} weights and "
                f"{len(self.biases)} biases"
            )
        for m, (w, b) in enumerate(zip(self.weights, self.biases)):
            if w.dim() not in (3, 4) or b.dim() != w.dim() - 1:
                raise ValueError(
                    f"layer {m}: weights must be [B, out, in(, C)] and biases [B, out(, C)], "
                    f"got {tuple(w.shape)} and {tuple(b.shape)}"
                )
            if w.shape[1] != b.shape[1] or w.shape[0] != b.shape[0]:
                raise ValueError(
                    f"layer {m}: weight {tuple(w.shape)} and bias {tuple(b.shape)} disagree"
                )
            if m > 0 and w.shape[2] != self.weights[m - 1].shape[1]:
                raise ValueError(
                    f"layer {m}: input width {w.shape[2]} != previous output width "
                    f"{self.weights[m - 1].shape[1]}"
                )

    # ------------------------------------------------------------------ shape
    @property
    def num_layers(self) -> int:
        return len(self.weights)

    @property
    def widths(self) -> tuple[int, ...]:
        """``(d_0, d_1, ..., d_M)``."""
        return (self.weights[0].shape[2],) + tuple(w.shape[1] for w in self.weights)

    @property
    def batch_size(self) -> int:
        return self.weights[0].shape[0]

    @property
    def has_channels(self) -> bool:
        return self.weights[0].dim() == 4

    # ------------------------------------------------------------- conversion
    def with_channels(self) -> "WeightSpace":
        """Add a trailing channel dimension of size 1 if there is none."""
        if self.has_channels:
            return self
        return WeightSpace(
            tuple(w.unsqueeze(-1) for w in self.weights), tuple(b.unsqueeze(-1) for b in self.biases)
        )

    def map(self, fn) -> "WeightSpace":
        """Apply ``fn`` to every tensor (e.g. ``.to(device)``, ``.double()``)."""
        return WeightSpace(tuple(fn(w) for w in self.weights), tuple(fn(b) for b in self.biases))

    def to(self, *args, **kwargs) -> "WeightSpace":
        return self.map(lambda t: t.to(*args, **kwargs))

    def flatten(self) -> Tensor:
        """``[B, P]`` (or ``[B, P, C]``): all weights then all biases, layer by layer, row-major."""
        parts = [w.flatten(1, 2) for w in self.weights] + list(self.biases)
        return torch.cat(parts, dim=1)

    @classmethod
    def unflatten(cls, flat: Tensor, widths: Sequence[int]) -> "WeightSpace":
        """Inverse of :meth:`flatten` for the given ``(d_0, ..., d_M)``."""
        weights, biases, pos = [], [], 0
        tail = flat.shape[2:]
        for d_in, d_out in zip(widths[:-1], widths[1:]):
            n = d_in * d_out
            weights.append(flat[:, pos : pos + n].reshape(flat.shape[0], d_out, d_in, *tail))
            pos += n
        for d_out in widths[1:]:
            biases.append(flat[:, pos : pos + d_out])
            pos += d_out
        if pos != flat.shape[1]:
            raise ValueError(f"flat vector has {flat.shape[1]} entries, widths {widths} need {pos}")
        return cls(tuple(weights), tuple(biases))

    def __add__(self, other: "WeightSpace") -> "WeightSpace":
        return WeightSpace(
            tuple(a + b for a, b in zip(self.weights, other.weights)),
            tuple(a + b for a, b in zip(self.biases, other.biases)),
        )

    def __sub__(self, other: "WeightSpace") -> "WeightSpace":
        return WeightSpace(
            tuple(a - b for a, b in zip(self.weights, other.weights)),
            tuple(a - b for a, b in zip(self.biases, other.biases)),
        )

    # ------------------------------------------------------------------ group
    def permute(self, perms: Sequence[Tensor]) -> "WeightSpace":
        """Apply one group element.

        ``perms[k]`` permutes hidden layer ``k+1`` (``k = 0..M-2``). Each is either ``[d]`` (the same
        permutation for the whole batch) or ``[B, d]`` (one per sample).
        """
        M = self.num_layers
        if len(perms) != M - 1:
            raise ValueError(f"need {M - 1} permutations (one per hidden layer), got {len(perms)}")
        B = self.batch_size
        perms = [p if p.dim() == 2 else p.unsqueeze(0).expand(B, -1) for p in perms]
        for k, p in enumerate(perms):
            if p.shape != (B, self.widths[k + 1]):
                raise ValueError(
                    f"permutation {k} has shape {tuple(p.shape)}, expected "
                    f"({B}, {self.widths[k + 1]})"
                )
        weights, biases = [], []
        for m, (w, b) in enumerate(zip(self.weights, self.biases)):
            if m < M - 1:  # permute rows (output neurons)
                w = _gather_dim(w, perms[m], 1)
                b = _gather_dim(b, perms[m], 1)
            if m > 0:  # permute columns (input neurons)
                w = _gather_dim(w, perms[m - 1], 2)
            weights.append(w)
            biases.append(b)
        return WeightSpace(tuple(weights), tuple(biases))

    def scale_neurons(self, scales: Sequence[Tensor]) -> "WeightSpace":
        """Rescale hidden neurons: ``W_m' = D_m W_m D_{m-1}^{-1}``, ``b_m' = D_m b_m``.

        ``scales[k]`` (``[d]`` or ``[B, d]``, nonzero) is the diagonal of ``D`` for hidden layer ``k+1``;
        input and output neurons keep scale 1. A symmetry of the networks' function wherever the
        activation commutes with the scales (:data:`ACTIVATION_SCALES`).
        """
        M, B = self.num_layers, self.batch_size
        if len(scales) != M - 1:
            raise ValueError(f"need {M - 1} scale vectors (one per hidden layer), got {len(scales)}")
        scales = [s if s.dim() == 2 else s.unsqueeze(0).expand(B, -1) for s in scales]
        for k, s in enumerate(scales):
            if s.shape != (B, self.widths[k + 1]):
                raise ValueError(f"scales {k} have shape {tuple(s.shape)}, expected ({B}, {self.widths[k + 1]})")
        tail = (1,) if self.has_channels else ()
        weights, biases = [], []
        for m, (w, b) in enumerate(zip(self.weights, self.biases)):
            if m < M - 1:  # outgoing side of hidden layer m+1: rows and bias
                s = scales[m].to(w.dtype)
                w, b = w * s.reshape(B, -1, 1, *tail), b * s.reshape(B, -1, *tail)
            if m > 0:  # incoming side of hidden layer m: columns
                w = w / scales[m - 1].to(w.dtype).reshape(B, 1, -1, *tail)
            weights.append(w)
            biases.append(b)
        return WeightSpace(tuple(weights), tuple(biases))


# the hidden-neuron scalings an activation commutes with, ``act(s z) = s act(z)``: sign flips (s = +-1)
# for odd ones, positive scales for ReLU (positively homogeneous); other activations have none
ACTIVATION_SCALES = {"sine": "sign", "tanh": "sign", "relu": "positive"}


def random_neuron_scales(
    widths: Sequence[int], batch_size: int, kind: str, generator: torch.Generator | None = None,
) -> list[Tensor]:
    """One random scale per hidden neuron and network (``[B, d]`` per hidden layer) for
    :meth:`WeightSpace.scale_neurons`: ``"sign"``: +-1 with equal odds; ``"positive"``: log-uniform in
    [1/2, 2]."""
    if kind not in ("sign", "positive"):
        raise ValueError(f"scale kind must be 'sign' or 'positive', got {kind!r}")
    scales = []
    for d in widths[1:-1]:
        u = torch.rand(batch_size, d, generator=generator)
        scales.append(torch.where(u < 0.5, -1.0, 1.0) if kind == "sign" else torch.exp2(2 * u - 1))
    return scales


def _gather_dim(x: Tensor, perm: Tensor, dim: int) -> Tensor:
    """``x`` indexed by a per-sample permutation ``perm`` [B, d] along ``dim``."""
    shape = [perm.shape[0]] + [1] * (x.dim() - 1)
    shape[dim] = perm.shape[1]
    index = perm.reshape(shape).expand(*[x.shape[i] if i != dim else perm.shape[1] for i in range(x.dim())])
    return torch.gather(x, dim, index)


def random_group_element(
    widths: Sequence[int], batch_size: int | None = None, generator: torch.Generator | None = None,
    device=None,
) -> list[Tensor]:
    """One uniformly random permutation per hidden layer (``[d]``, or ``[B, d]`` per sample)."""
    perms = []
    for d in widths[1:-1]:
        if batch_size is None:
            perms.append(torch.randperm(d, generator=generator, device=device))
        else:
            keys = torch.rand(batch_size, d, generator=generator, device=device)
            perms.append(keys.argsort(dim=1))
    return perms


def mlp_forward(ws: WeightSpace, x: Tensor, activation=torch.relu) -> Tensor:
    """Evaluate every network of the batch on inputs ``x`` [B, N, d_0] (or [N, d_0]) -> [B, N, d_M].

    No activation after the last layer. Used to check that a group element leaves the function
    unchanged and by tasks that run the networks.
    """
    if ws.has_channels:
        raise ValueError("mlp_forward needs weights without a channel dimension")
    h = x if x.dim() == 3 else x.unsqueeze(0).expand(ws.batch_size, -1, -1)
    for m, (w, b) in enumerate(zip(ws.weights, ws.biases)):
        h = torch.baddbmm(b.unsqueeze(1), h, w.transpose(1, 2))
        if m < ws.num_layers - 1:
            h = activation(h)
    return h
