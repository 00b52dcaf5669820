"""Seeds are the unit of replication: summaries over seeds and paired comparisons between arms.

Both arms of a seed share initial weights and batches, so their *difference* seed by seed removes
the large seed-to-seed variation of when learning takes off. A difference "exceeds the seed
spread" when a two-sided paired t-test over seeds rejects "no difference" at the 5 % level:
``|mean Δ| > t(0.975, n-1) · sd(Δ)/√n``; the 95 % interval of the mean difference is
``mean Δ ± t(0.975, n-1) · sd(Δ)/√n``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

__all__ = [
    "constant_answers",
    "finite",
    "paired_comparison",
    "paired_test",
    "seeds_note",
    "summarise",
    "t_critical",
]

# Two-sided 95 % critical values of Student's t for 1..30 degrees of freedom; 30's is used
# beyond (slightly conservative).
_T_975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def constant_answers(values: Sequence[float]) -> dict[str, float]:
    """The constant answers every arm is measured against: the training answers' ``mean``,
    ``median`` and ``mode``."""
    return {
        "mean": statistics.fmean(values),
        "median": statistics.median(values),
        "mode": statistics.mode(values),
    }


def t_critical(degrees_of_freedom: int) -> float:
    """The two-sided 95 % critical value of Student's t."""
    return _T_975[min(degrees_of_freedom, len(_T_975)) - 1]


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


def seeds_note(kept: int, seeds: int) -> str:
    """`` (2 of 3 seeds)`` when a mean or a difference is over fewer seeds than the run has (a
    metric undefined on some seeds: Pearson's r of a constant answer), else ``""``."""
    return f" ({kept} of {seeds} seeds)" if 0 < kept < seeds else ""


def paired_test(differences: Sequence[float]) -> tuple[float | None, bool | None]:
    """(t statistic, exceeds the seed spread) for per-seed differences; (None, None) when fewer
    than two seeds leave the spread unknown."""
    n = len(differences)
    if n < 2:
        return None, None
    mean, sd = statistics.fmean(differences), statistics.stdev(differences)
    if sd == 0:
        return (math.inf if mean else 0.0), mean != 0
    t = mean / (sd / math.sqrt(n))
    return t, abs(t) > t_critical(n - 1)


def paired_comparison(
    values: Sequence[float | None], baseline: Sequence[float | None]
) -> dict[str, Any]:
    """Seed-by-seed differences ``values − baseline`` (seeds where both are finite): their
    summary, the paired t statistic, whether it exceeds the seed spread, the 95 % interval
    ``[low, high]`` of the mean difference (None with fewer than two seeds), and ``seeds``, the
    number of seeds compared (the differences are over ``len(values)`` of them)."""
    differences = [
        a - b
        for a, b in zip(values, baseline, strict=True)
        if a is not None and b is not None and math.isfinite(a) and math.isfinite(b)
    ]
    t, exceeds = paired_test(differences)
    summary = summarise(differences)
    low = high = None
    if summary["std"] is not None:
        half = t_critical(len(differences) - 1) * summary["std"] / math.sqrt(len(differences))
        low, high = summary["mean"] - half, summary["mean"] + half
    return {**summary, "t": t, "exceeds": exceeds, "low": low, "high": high, "seeds": len(values)}
