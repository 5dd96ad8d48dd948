"""Pointwise encodings applied before the first NF layer (the reference code's INR-classification setup).

* :class:`FourierFeatures`: random Fourier features of every weight value, ``[sin(2 pi x B), cos(2 pi x B)]``
  with a fixed Gaussian ``B`` (``GaussianFourierFeatureTransform``; scale 10 in the base config, 3 in
  the MNIST ones, on *raw* SIREN weights: :data:`NFN_REFERENCE_SCALE`). Acts entry by entry, so it commutes with every permutation.
  Its frequencies are relative to its inputs' units: on weights standardized by ``s``, scale ``S * s``
  is scale ``S`` on the raw ones (``dws.tasks.models.nfn_fourier_scale``).
* :class:`IOPositionEncoding`: NP's positional features. An NP layer is equivariant to permutations of
  the input and output neurons too, which an MLP does not have; appending, as channels, a sinusoidal
  code of each input neuron's index along ``W_1``'s columns and of each output neuron's index along
  ``W_L``'s rows and ``b_L`` (zeros elsewhere) ties those neurons to their positions
  (``IOSinusoidalEncoding`` with ``enc_layers=False``; MNIST: ``max_freq=3, num_bands=3``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from dws.weightspace import WeightSpace

Tensor = torch.Tensor

# the NFN code's Fourier scale, which it applies to raw SIREN weights (inv_ff.yaml: normalize: false): 10
# in its base config (inp_enc_cls/gaussian.yaml, what its README's commands run), 3 in inv_ff_mnist.yaml.
# 10 measured best on our MNIST INRs (24 epochs: 47.5% against 38.6% at 3); docs/dws.md, NFN "Inputs"
NFN_REFERENCE_SCALE = 10.0


class FourierFeatures(nn.Module):
    """``C_in`` channels -> ``2 * mapping_size``: a fixed random Fourier feature map of each entry."""

    def __init__(self, in_channels: int, mapping_size: int, scale: float = 3.0):
        super().__init__()
        self.in_channels, self.mapping_size, self.scale = int(in_channels), int(mapping_size), float(scale)
        self.out_channels = 2 * self.mapping_size
        self.register_buffer("projection", torch.randn(self.in_channels, self.mapping_size) * self.scale)

    def encode(self, x: Tensor) -> Tensor:
        x = 2 * math.pi * (x @ self.projection)
        return torch.cat([torch.sin(x), torch.cos(x)], dim=-1)

    def forward(self, ws: WeightSpace) -> WeightSpace:
        return ws.with_channels().map(self.encode)

    def extra_repr(self) -> str:
        return f"in_channels={self.in_channels}, mapping_size={self.mapping_size}, scale={self.scale}"


def sinusoidal_code(n: int, max_freq: float, num_bands: int, like: Tensor) -> Tensor:
    """``[n, 2 * num_bands + 1]``: positions ``linspace(-1, 1, n)`` as sines, cosines and themselves."""
    x = torch.linspace(-1.0, 1.0, n, device=like.device, dtype=like.dtype)[:, None]
    scales = torch.linspace(1.0, max_freq / 2, num_bands, device=like.device, dtype=like.dtype)
    angles = x * scales * math.pi
    return torch.cat([angles.sin(), angles.cos(), x], dim=-1)


class IOPositionEncoding(nn.Module):
    """Appends ``2 * num_bands + 1`` channels: input-neuron codes on ``W_1``, output-neuron codes on
    ``W_L`` and ``b_L``, zeros on every other tensor."""

    def __init__(self, max_freq: float = 3.0, num_bands: int = 3):
        super().__init__()
        self.max_freq, self.num_bands = float(max_freq), int(num_bands)
        self.channels = 2 * self.num_bands + 1

    def forward(self, ws: WeightSpace) -> WeightSpace:
        ws = ws.with_channels()
        L, ref = ws.num_layers, ws.weights[0]
        d_in, d_out = ws.widths[0], ws.widths[-1]
        code_in = sinusoidal_code(d_in, self.max_freq, self.num_bands, ref)  # [d_0, E]
        code_out = sinusoidal_code(d_out, self.max_freq, self.num_bands, ref)  # [d_L, E]
        weights, biases = [], []
        for i, (w, b) in enumerate(zip(ws.weights, ws.biases)):
            enc_w = w.new_zeros(*w.shape[:-1], self.channels)
            enc_b = b.new_zeros(*b.shape[:-1], self.channels)
            if i == 0:
                enc_w = enc_w + code_in[None, None]  # along columns (input neurons)
            if i == L - 1:
                enc_w = enc_w + code_out[None, :, None]  # along rows (output neurons)
                enc_b = enc_b + code_out[None]
            weights.append(torch.cat([w, enc_w], dim=-1))
            biases.append(torch.cat([b, enc_b], dim=-1))
        return WeightSpace(tuple(weights), tuple(biases))

    def extra_repr(self) -> str:
        return f"max_freq={self.max_freq}, num_bands={self.num_bands}"
