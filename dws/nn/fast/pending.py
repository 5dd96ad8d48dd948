"""A DWS layer output whose broadcast terms are not yet added: the hook for fusing them downstream.

A hidden weight's output is its channel-mixing product (a fresh full-size tensor) plus broadcast
terms: a row term (constant along the columns), a column term and a global one. Adding them takes
one pass over the full tensor each way per term. When batch norm + ReLU follows (the paper's
invariant DWSNets), it can add them on the fly while it reads the product anyway
(:func:`dws.nn.fast.bn_relu.bn_relu_train`), so :class:`dws.nn.fast.stack.FusedStack` hands it the
output as a :class:`PendingSum`. Everything else gets the resolved tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

Tensor = torch.Tensor


@dataclass
class PendingSum:
    """``full`` (a fresh ``[B, ..., C]`` tensor the layer owns) plus ``terms`` that broadcast into it."""

    full: Tensor
    terms: list[Tensor]
    _split: tuple | None = field(default=None, init=False, repr=False)  # row_and_column's, once computed

    def resolve(self) -> Tensor:
        """The sum, added in place into ``full`` (what the layer does when nothing fuses it)."""
        for t in self.terms:
            self.full.add_(t)
        return self.full

    def row_and_column(self) -> tuple[Tensor | None, Tensor | None] | None:
        """For a ``[B, H, W, C]`` ``full`` whose terms each broadcast over W (shape ``[B|1, H|1, 1, C]``:
        summed into a row term ``[B, H, C]``) or over H (``[B|1, 1, W, C]``: a column term
        ``[B, W, C]``), those two sums (None where there is no such term); None for other terms.
        Computed once (a fused path that declines leaves it for the batch norm's own path)."""
        if self._split is None:
            self._split = (self._row_and_column(),)
        return self._split[0]

    def _row_and_column(self):
        if self.full.dim() != 4:
            return None
        B, H, W, C = self.full.shape
        row = col = None
        for t in self.terms:
            if t.dim() > 4 or t.shape[-1] != C:
                return None
            t = t.reshape((1,) * (4 - t.dim()) + tuple(t.shape))
            if t.shape[0] not in (1, B):
                return None
            if t.shape[2] == 1 and t.shape[1] in (1, H):
                row = t if row is None else row + t
            elif t.shape[1] == 1 and t.shape[2] == W:
                col = t if col is None else col + t
            else:
                return None
        return (None if row is None else row.expand(B, H, 1, C).reshape(B, H, C).contiguous(),
                None if col is None else col.expand(B, 1, W, C).reshape(B, W, C).contiguous())
