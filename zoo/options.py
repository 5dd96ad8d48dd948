"""Checks of command options, shared by ``zoo generate`` and ``zoo train``: a bad value is refused
with the flag's name before any store or run directory is created, and a resume with other
settings than the interrupted work's is refused with every difference named."""

from __future__ import annotations

# A val split of fewer networks chooses a learning rate or a best epoch mostly by chance: `zoo
# generate` warns when it plans one, `zoo train` when it chooses on one.
MIN_SELECTION_NETWORKS = 50


def require_at_least(bounds: dict[str, tuple[float | None, float]]) -> None:
    """``{flag: (value, least)}``: ValueError for the first value below its bound (None: unset)."""
    for flag, (value, least) in bounds.items():
        if value is not None and value < least:
            raise ValueError(f"{flag} must be at least {least}, got {value}")


def require_positive(flag: str, value: float | None) -> None:
    """ValueError unless ``value`` is unset or > 0 (NaN included)."""
    if value is not None and not value > 0:
        raise ValueError(f"{flag} must be positive, got {value}")


def settings_diff(stored, asked, prefix: str = "", labels: tuple[str, str] = ("store", "asked")) -> list[str]:
    """``key: <labels[0]> stored, <labels[1]> asked`` for every leaf where two nested settings dicts differ."""
    if isinstance(stored, dict) and isinstance(asked, dict):
        lines = []
        for key in list(stored) + [k for k in asked if k not in stored]:
            lines += settings_diff(stored.get(key), asked.get(key), f"{prefix}{key}.", labels)
        return lines
    return [] if stored == asked else [f"{prefix.rstrip('.')}: {labels[0]} {stored!r}, {labels[1]} {asked!r}"]
