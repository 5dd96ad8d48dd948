"""Linear maps of per-edge and per-node feature tensors, computed as 1x1 convolutions on CPUs.

The weight-space models map features ``[B, n_out, n_in, d]`` (one per edge of a layer pair) and
``[B, n, d]`` (one per neuron) by ``[d_out, d]`` matrices: tens of thousands of rows, a few dozen
to a few hundred columns. ``F.linear`` sends that product to MKL's sgemm, which runs ``[65536, 128]
x [128, 128]`` at ~90 GFLOP/s on one core of the development machine (AMD EPYC, AVX-512); the tensor
seen as a channels-last image ``[B, d, n_out, n_in]`` (a view, no copy) goes to oneDNN's
convolution at ~200, forward and backward; node features ``[B, n, d]`` as ``[B, d, n, 1]`` gain
~1.5x (docs/dws.md, ScaleGMN's and the neural graphs' "Speed"). ``F.conv2d`` is a public API, so
any PyTorch build runs it (one without oneDNN computes the same convolution more slowly, which is
why :data:`ONEDNN` is checked).

PyTorch itself sends a 1x1 convolution of fewer than 16 images on one thread to its reference kernel
(``slow_conv2d``), not to oneDNN: edges ``[B, n_out, n_in, d]`` of such a batch (a classifier zoo's
graph models train 1-4 networks a step; a worker of a distributed run has one thread) are therefore
seen as ``B * n_out`` images of one row each, which oneDNN takes: 1.3-1.7x a training step of the
graph models on 784-128-128-128-10 classifiers at one thread, neutral at two (session 15, docs/dws.md).

Node features take it only on a CPU with AVX-512 (:data:`NODE_CONVOLUTION`): on an AVX2 one (session 34's
AMD EPYC, 2 threads) their convolution is 0.56x ``F.linear`` (``[64, 32, 128]``, forward and backward) and a
ScaleGMN step 1.11-1.29x faster without it (scalegmn-b 1.04-1.06x, the neural graphs 0.98-1.02x), where
edges stay about even (0.89-1.08x).

Only float32 CPU tensors of 3 or 4 axes and at least :data:`MIN_ROWS` rows take that route
(oneDNN's fast kernel wants that shape: a flattened ``[1, d, N, 1]`` image is as slow as sgemm;
below ~1,000 rows the call costs more than it saves); anything else (float64, a GPU, where cuBLAS
is the fast path) is ``F.linear``. A contiguous input is a channels-last image as it is; a
transposed one (``e.transpose(1, 2)``) is still mapped correctly, at whatever speed oneDNN gives
that layout.
"""

from __future__ import annotations

import torch
from torch import nn

from zoo import cpuinfo

Tensor = torch.Tensor

MIN_ROWS = 1024  # products of fewer rows stay with F.linear
ONEDNN = torch.backends.mkldnn.is_available()  # read once: torch.compile cannot trace the call (a graph break)
FEW_IMAGES = 16  # PyTorch's threshold: fewer images, on one thread, go to its reference kernel


def node_convolution(flags: set[str]) -> bool:
    """Whether node features ``[B, n, d]`` are mapped by convolution on a CPU of these ``/proc/cpuinfo`` flags:
    with AVX-512 (~1.5x ``F.linear``), or where the flags are unknown (as before the CPU was asked)."""
    return not flags or "avx512f" in flags


NODE_CONVOLUTION = node_convolution(cpuinfo.flags())  # read once, as ONEDNN


def as_convolution(x: Tensor) -> bool:
    """Whether :func:`linear` maps ``x`` by a 1x1 convolution (see the module docstring)."""
    return ((x.dim() == 4 or x.dim() == 3 and NODE_CONVOLUTION) and x.numel() >= MIN_ROWS * x.shape[-1]
            and x.device.type == "cpu"
            and x.dtype == torch.float32 and ONEDNN)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T + bias`` (``F.linear``): by a 1x1 convolution where that is faster."""
    return by_convolution(x, weight, bias) if as_convolution(x) else nn.functional.linear(x, weight, bias)


def by_convolution(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)`` of ``x`` ``[B, n_out, n_in, d]`` or ``[B, n, d]`` as a 1x1 convolution,
    whatever its dtype and size (:func:`linear` chooses when)."""
    if x.dim() == 4 and few_images(x):
        batch, n_out, n_in, d = x.shape
        return by_convolution(x.reshape(batch * n_out, 1, n_in, d), weight, bias).reshape(batch, n_out, n_in, -1)
    image = (x if x.dim() == 4 else x[:, :, None]).permute(0, 3, 1, 2)  # [B, d, n_out, n_in]: channels-last in memory
    y = nn.functional.conv2d(image, weight[:, :, None, None], bias).permute(0, 2, 3, 1)
    return y if x.dim() == 4 else y[:, :, 0]


def few_images(x: Tensor) -> bool:
    """Whether edges ``x`` are too few images for PyTorch to give their convolution to oneDNN, and
    folding the batch into ``n_out`` makes enough. Under ``torch.compile`` (whose tracing cannot read
    the thread count) a small batch is folded whatever the threads: neutral at two threads."""
    few = x.shape[0] < FEW_IMAGES <= x.shape[0] * x.shape[1]
    return few and (torch.compiler.is_compiling() or torch.get_num_threads() == 1)


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same state-dict keys) that maps features by :func:`linear`."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)
