"""Summaries over seeds, the unit of replication, and the constant answers every arm is measured
against."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

__all__ = ["constant_answers", "finite", "summarise"]


def constant_answers(values: Sequence[float]) -> dict[str, float]:
    """The constant answers every arm is measured against: the training answers' ``mean``,
    ``median`` and ``mode``."""
    return {
        "mean": statistics.fmean(values),
        "median": statistics.median(values),
        "mode": statistics.mode(values),
    }


def finite(values: Sequence[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def summarise(values: Sequence[float | None]) -> dict[str, Any]:
    """``{"mean", "std", "values"}`` over the finite values (std needs two of them)."""
    kept = finite(values)
    return {
        "mean": statistics.fmean(kept) if kept else None,
        "std": statistics.stdev(kept) if len(kept) > 1 else None,
        "values": list(values),
    }
