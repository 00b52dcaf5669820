"""Checks of a comparison's settings: errors that name the setting, what was expected and what
came, raised when the settings are made, before any work."""

from __future__ import annotations

import math

__all__ = ["check_int", "check_number"]


def check_int(name: str, value: object) -> int:
    """``value`` if it is an int (not a bool), else a ``TypeError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    return value


def check_number(name: str, value: object, *, minimum: float, inclusive: bool) -> float:
    """``value`` as a float: a finite int or float (not a bool) ``>= minimum`` when
    ``inclusive``, else ``> minimum``; a ``TypeError`` or ``ValueError`` naming ``name``."""
    bound = f"{'>=' if inclusive else '>'} {minimum:g}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number {bound}, got {value!r}")
    if not (math.isfinite(value) and (value >= minimum if inclusive else value > minimum)):
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")
    return float(value)
