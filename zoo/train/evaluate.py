"""Test accuracy of stored classifiers, reproducible bit for bit by anyone with numpy.

A network's prediction for an image is ``classes[argmax_j logits[classes[j]]]`` (the first
maximum on ties) of its logits computed in **float64** from the float32 weights and inputs: float64
makes the argmax a property of the stored numbers rather than of a BLAS library's summation order
(two float32 libraries disagree on an image whose two best logits are within rounding). It is
computed in float32, and every image whose two best logits are closer than
``TIE_MARGIN * (1 + |best|)`` (far above float32's error, ~1e-6 of the logits) is recomputed in
float64; the others cannot change their argmax.

:func:`predictions` applies the rule to one network; :func:`correct_counts` to many stacked
networks at once (a zoo's checkpoints), in blocks of networks and images whose size the caller
bounds. Its float32 logits come from other products than the one-network path's, so they differ
by float32 rounding, far below the margin: both give every image the float64 argmax, so the same
predictions (tested on near-ties and exact ties). Its float64 recomputation takes every network's
close images at once, padded to the network with most.
"""

from __future__ import annotations

import contextlib

import torch

from ..devices import free_gpu_bytes
from .data import ClassifierData, normalized
from .mlp import Activation, logits, stacked_logits

Tensor = torch.Tensor
TIE_MARGIN = 1e-3


def predictions(weights, biases, activation: Activation, x: Tensor, classes: Tensor) -> Tensor:
    """Predicted class of every row of ``x`` (float32 ``[N, d_0]``) for one network."""
    chosen = logits(weights, biases, x, activation).index_select(1, classes)
    best = chosen.argmax(dim=1)
    if chosen.shape[1] > 1:
        top = chosen.topk(2, dim=1).values
        close = ~((top[:, 0] - top[:, 1]) > TIE_MARGIN * (1 + top[:, 0].abs()))  # NaN/inf count as close
        rows = close.nonzero().squeeze(1)
        if len(rows):
            exact = logits([w.double() for w in weights], [b.double() for b in biases], x[rows].double(),
                           activation).index_select(1, classes)
            best[rows] = exact.argmax(dim=1)
    return classes[best]


def accuracy(weights, biases, activation: Activation, x: Tensor, labels: Tensor, classes: Tensor) -> float:
    """Fraction of ``x``'s rows predicted as their label (``x`` holds only images of ``classes``)."""
    if len(labels) == 0:
        return float("nan")
    correct = int((predictions(weights, biases, activation, x, classes) == labels).sum())
    return correct / len(labels)


def stacked_predictions(weights, biases, activation: Activation, x: Tensor, classes: Tensor,
                        recheck_bytes: int = 256 << 20) -> Tensor:
    """:func:`predictions` of K networks (``weights[m]`` ``[K, d_m, d_{m-1}]``) on the same rows of
    ``x``: ``[K, N]``. One block: its float32 activations are ``K * N`` times the widest layer."""
    chosen = stacked_logits(weights, biases, x, activation).index_select(1, classes).transpose(1, 2)  # [K, N, c]
    best = chosen.argmax(dim=2)
    if chosen.shape[2] > 1:
        top = chosen.topk(2, dim=2).values
        close = ~((top[..., 0] - top[..., 1]) > TIE_MARGIN * (1 + top[..., 0].abs()))  # NaN/inf count as close
        _recheck_in_float64(weights, biases, activation, x, classes, close, best, recheck_bytes)
    return classes[best]


def _recheck_in_float64(weights, biases, activation, x, classes, close: Tensor, best: Tensor, max_bytes: int) -> None:
    """Overwrite ``best`` ``[K, N]`` with the float64 argmax wherever ``close``: each network's close
    rows first (stable sort), padded to the most any network has, networks taken ``max_bytes`` at a time."""
    counts = close.sum(dim=1)
    nets = counts.nonzero().squeeze(1)
    if len(nets) == 0:
        return
    most = int(counts.max())
    widest = max(max(w.shape[1:]) for w in weights)
    step = max(1, max_bytes // (3 * 8 * most * widest))
    for s in range(0, len(nets), step):
        k = nets[s : s + step]
        rows = torch.sort(close[k].to(torch.uint8), dim=1, descending=True, stable=True).indices[:, :most]
        exact = stacked_logits([w[k].double() for w in weights], [b[k].double() for b in biases], x[rows].double(),
                               activation).index_select(1, classes).argmax(dim=1)  # [n, most]
        keep = torch.arange(most, device=best.device) < counts[k].unsqueeze(1)
        mine = best[k]
        mine.scatter_(1, rows, torch.where(keep, exact, mine.gather(1, rows)))
        best[k] = mine


def correct_counts(weights, biases, activation: Activation, x: Tensor, labels: Tensor, classes: Tensor,
                   max_bytes: int) -> Tensor:
    """How many of ``x``'s rows each of K stacked networks predicts as their label (int64 ``[K]``,
    on ``x``'s device), in blocks whose float32 activations take at most ~``max_bytes``."""
    K, N = weights[0].shape[0], len(x)
    correct = torch.zeros(K, dtype=torch.int64, device=x.device)
    if N == 0 or K == 0:
        return correct
    per_pair = 3 * 4 * max(w.shape[1] for w in weights)  # three live [K, d, N] float32 activations
    images = min(N, max(1, max_bytes // per_pair))
    nets = min(K, max(1, max_bytes // (per_pair * images)))
    with full_float32():
        for k in range(0, K, nets):
            w, b = [t[k : k + nets] for t in weights], [t[k : k + nets] for t in biases]
            for n in range(0, N, images):
                predicted = stacked_predictions(w, b, activation, x[n : n + images], classes, max_bytes)
                correct[k : k + nets] += (predicted == labels[n : n + images]).sum(dim=1)
    return correct


@contextlib.contextmanager
def full_float32():
    """IEEE float32 products while the block runs: TF32 (``torch.set_float32_matmul_precision``
    "high") errs by ~1e-3 of a logit, as much as the tie margin."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


CPU_EVALUATION_BYTES = 32 << 20  # a block's float32 activations on a CPU (measured: larger blocks gain nothing)


def evaluation_bytes(device) -> int:
    """Activation memory of one evaluation block: on a GPU a quarter of what is free (the caching
    allocator's idle blocks included), at most 8 GiB; on a CPU :data:`CPU_EVALUATION_BYTES`."""
    device = torch.device(device)
    if device.type != "cuda":
        return CPU_EVALUATION_BYTES
    return int(min(8 << 30, max(64 << 20, free_gpu_bytes(device) // 4)))


def stack_accuracies(data: ClassifierData, weights, biases, activation: Activation, classes: list[tuple[int, ...]],
                     device, max_bytes: int | None = None) -> Tensor:
    """Test accuracy of K stacked networks (float64 ``[K]`` on the host), each on the official test
    images of its ``classes[k]``: networks of the same classes are evaluated together."""
    device = torch.device(device)
    max_bytes = max_bytes or evaluation_bytes(device)
    x_test = normalized(data, "test", device)
    labels = torch.as_tensor(data.test_labels)
    out = torch.full((len(classes),), float("nan"), dtype=torch.float64)
    for subset in dict.fromkeys(classes):
        nets = [k for k, c in enumerate(classes) if c == subset]
        rows = torch.isin(labels, torch.tensor(subset))
        if not bool(rows.any()):
            continue
        x = x_test if bool(rows.all()) else x_test[rows.nonzero().squeeze(1).to(device)]
        every = nets == list(range(len(classes)))
        index = None if every else torch.tensor(nets, device=device)
        w = weights if every else [t.index_select(0, index) for t in weights]
        b = biases if every else [t.index_select(0, index) for t in biases]
        correct = correct_counts(w, b, activation, x, labels[rows].to(device), torch.tensor(subset, device=device),
                                 max_bytes)
        out[nets] = correct.cpu().double() / int(rows.sum())
    return out
