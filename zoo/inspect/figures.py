"""Saving the figures ``zoo show`` draws."""

from __future__ import annotations

from pathlib import Path


def save_figure(fig, out) -> Path:
    """Write ``fig`` to ``out`` (creating its folder) and close it."""
    import matplotlib.pyplot as plt

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
