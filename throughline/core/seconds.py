"""The one rule for a number of seconds given by a user (a wait, a timeout): finite and >= 0."""

from __future__ import annotations

import math

__all__ = ["finite_seconds"]


def finite_seconds(value: object) -> float | None:
    """``value`` as a float when it is a finite number of seconds >= 0 (a number or its text), else ``None``.

    Booleans are refused although Python counts them as integers (``wait=true`` is a mistake, not one
    second). Each caller raises its own typed error for ``None``: it knows the flag or field to name.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if not isinstance(value, int | float):
        return None
    seconds = float(value)
    return seconds if math.isfinite(seconds) and seconds >= 0 else None
