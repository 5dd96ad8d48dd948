"""Input checks shared by the weight-space modules, so a wrong architecture fails loudly."""

from __future__ import annotations

from typing import Sequence

from dws.weightspace import WeightSpace


def prepare_input(ws: WeightSpace, widths: Sequence[int], channels: int, owner: str) -> WeightSpace:
    """``ws`` with a channel axis, after checking it matches the module's widths and channels.

    A weight space without channels is accepted when the module expects one channel.
    """
    if not isinstance(ws, WeightSpace):
        raise TypeError(f"{owner} expects a WeightSpace, got {type(ws).__name__}")
    if tuple(ws.widths) != tuple(widths):
        raise ValueError(f"{owner} was built for widths {tuple(widths)}, got a weight space with widths {ws.widths}")
    if not ws.has_channels:
        if channels != 1:
            raise ValueError(f"{owner} expects {channels} channels, got a weight space without a channel axis")
        return ws.with_channels()
    got = ws.weights[0].shape[-1]
    if any(t.shape[-1] != got for t in ws.weights + ws.biases) or got != channels:
        raise ValueError(f"{owner} expects {channels} channels on every tensor, got {got}")
    return ws
