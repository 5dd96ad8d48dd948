"""Test accuracy of stored classifiers, reproducible bit for bit by anyone with numpy.

A network's prediction for an image is ``classes[argmax_j logits[classes[j]]]`` (the first
maximum on ties) of its logits computed in **float64** from the float32 weights and inputs: float64
makes the argmax a property of the stored numbers rather than of a BLAS library's summation order
(two float32 libraries disagree on an image whose two best logits are within rounding). It is
computed in float32, and every image whose two best logits are closer than
``TIE_MARGIN * (1 + |best|)`` (far above float32's error, ~1e-6 of the logits) is recomputed in
float64; the others cannot change their argmax.
"""

from __future__ import annotations

import torch

from .mlp import Activation, logits

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
