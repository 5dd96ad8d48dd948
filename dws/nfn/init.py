"""Initialization of an NF layer: the linear maps summed into one output share one fan-in.

As in the reference code (``set_init_``): every map feeding the same output tensor is drawn from
``U(-1/sqrt(F), 1/sqrt(F))`` with ``F`` the sum of their input sizes, so the sum behaves like one
PyTorch-default linear layer over the concatenation of their inputs.
"""

from __future__ import annotations

import math

from torch import nn


def init_summed_(*linears: nn.Linear) -> None:
    bound = 1.0 / math.sqrt(sum(lin.in_features for lin in linears))
    for lin in linears:
        nn.init.uniform_(lin.weight, -bound, bound)
        if lin.bias is not None:
            nn.init.uniform_(lin.bias, -bound, bound)
