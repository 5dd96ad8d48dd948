"""Invariant NFNs: encodings, NF layers (each followed by an optional layer norm, ReLU and channel
dropout), the invariant pooling and an MLP head.

``NFNInvariant(widths, out, mode="np")`` is ``nfn-np``, ``mode="hnp"`` is ``nfn-hnp`` (the reference
code's ``InvariantNFN`` with ``mode=NP`` + ``IOSinusoidalEncoding`` or ``mode=HNP``, Gaussian Fourier
input features and ``MlpHead``). :func:`paper_ratios` gives the sizes of the reference INR
classifier (512 channels, 128 Fourier frequencies, a 1000-wide head) scaled to one channel count,
which ``dws.tasks.models`` sizes to the DWSNet's parameter count (docs/dws.md).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from dws.nfn.dropout import ChannelDropout
from dws.nfn.encoding import NFN_REFERENCE_SCALE, FourierFeatures, IOPositionEncoding
from dws.nfn.hnp_layer import HNPLayer
from dws.nfn.norm import NFN_NORMS
from dws.nfn.np_layer import NPLayer
from dws.nfn.pooling import HNPPool, MLPHead, pooled_size
from dws.weightspace import WeightSpace

NFN_MODES = {"np": NPLayer, "hnp": HNPLayer}


class Pointwise(nn.Module):
    """An elementwise module (ReLU) applied to every tensor of a weight space."""

    def __init__(self, op: nn.Module):
        super().__init__()
        self.op = op

    def forward(self, ws: WeightSpace) -> WeightSpace:
        return ws.map(self.op)


def paper_ratios(channels: int) -> dict:
    """Fourier frequencies and head width in the reference classifier's proportions to its channels
    (128 and 1000 at 512 channels): ``channels // 4`` and ``2 * channels``."""
    return dict(hidden_channels=channels, fourier_features=max(1, channels // 4), head_hidden=2 * channels)


class NFNInvariant(nn.Module):
    """Weight space -> ``R^out_features``, invariant to permutations of hidden neurons.

    Args:
        widths: ``(d_0, ..., d_L)`` of the input MLPs (``L >= 2``).
        mode: ``"np"`` (NP layers, input/output position encoding) or ``"hnp"`` (HNP layers).
        hidden_channels: channels of every NF layer (int) or one per layer; ``num_layers`` layers (3).
        fourier_features: Fourier frequencies of the input encoding (0: raw values, ``in_channels``).
        head_hidden: width of the MLP head's two hidden layers.
        dropout: in the head (the code's ``head_cls.dropout``; 0.1 on MNIST).
        channel_dropout: :class:`~dws.nfn.dropout.ChannelDropout` after every NF layer's ReLU (the
            code's ``feature_dropout``: 0.1 in its MNIST configs, the default here).
        norm: ``None`` (the code's INR classifiers), ``"simple"`` or ``"param"``
            (:mod:`dws.nfn.norm`), between every NF layer and its ReLU.
    """

    def __init__(self, widths: Sequence[int], out_features: int, mode: str = "np",
                 hidden_channels: int | Sequence[int] = 64, num_layers: int = 3, fourier_features: int = 16,
                 fourier_scale: float = NFN_REFERENCE_SCALE, head_hidden: int = 128, dropout: float = 0.0,
                 channel_dropout: float = 0.1, norm: str | None = None, io_max_freq: float = 3.0,
                 io_bands: int = 3, in_channels: int = 1):
        super().__init__()
        if mode not in NFN_MODES:
            raise ValueError(f"mode must be one of {', '.join(NFN_MODES)}, got {mode!r}")
        if norm is not None and norm not in NFN_NORMS:
            raise ValueError(f"norm must be None or one of {', '.join(NFN_NORMS)}, got {norm!r}")
        self.widths, self.mode = tuple(int(d) for d in widths), mode
        if len(self.widths) < 3:
            raise ValueError(f"NFNs need networks with a hidden layer, got widths {self.widths}")
        channels = [hidden_channels] * num_layers if isinstance(hidden_channels, int) else list(hidden_channels)
        encode: list[nn.Module] = []
        c = in_channels
        if fourier_features:
            encode.append(FourierFeatures(c, fourier_features, fourier_scale))
            c = encode[-1].out_channels
        if mode == "np":
            encode.append(IOPositionEncoding(io_max_freq, io_bands))
            c += encode[-1].channels
        layers: list[nn.Module] = []
        for c_out in channels:
            layers.append(NFN_MODES[mode](self.widths, c, c_out))
            if norm is not None:
                layers.append(NFN_NORMS[norm](self.widths, c_out))
            layers.append(Pointwise(nn.ReLU()))
            if channel_dropout > 0:
                layers.append(ChannelDropout(channel_dropout))
            c = c_out
        self.encode = nn.Sequential(*encode)
        self.layers = nn.Sequential(*layers)
        self.pool = HNPPool()
        self.head = MLPHead(pooled_size(self.widths, c), head_hidden, out_features, dropout)

    def forward(self, ws: WeightSpace) -> torch.Tensor:
        return self.head(self.pool(self.layers(self.encode(ws.with_channels()))))
