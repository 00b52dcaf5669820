"""How far the distribution readouts' pruning could move an estimate of the report.

A pruned readout (``--readout-tolerance``) reads each item's expected value to within its
``mean_bound`` ``b`` (:class:`numtok.NumberPredictions`): the exact answer ``a*`` lies in
``[a − b, a + b]``. An item's score then moves by at most

* ``b`` for the absolute error (``mae``), and ``|slog(a ± b) − slog(a)|`` for ``log_mae``
  (``slog`` is monotone);
* ``b·(2|a − r| + b)`` for the squared error (``mse``, RMSE's test), ``r`` the true answer;
* 1 for ``exact_accuracy`` and ``within_1_percent`` where the interval reaches across the
  criterion's edge (``|a − r| = 0`` or ``0.01·|r|``), else 0.

A difference of two arms' mean scores, over the same seeds and items, moves by at most the mean
of both sides' item bounds (:func:`estimate_bound`): a bias bound, beside the interval, which
counts only the sampling noise. ``greedy`` and the regression head's ``head`` readouts are exact
(bound 0); an answer without a number is scored as a constant (bound 0); the ``median`` and
``mode`` of a pruned table have no bound (None: they are exact only where nothing was pruned).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from numtok_compare.item_metrics import MEAN_METRICS

__all__ = ["EXACT_READOUTS", "could_flip", "estimate_bound", "item_score_bounds"]

Array = NDArray[np.float64]

#: Readouts that prune nothing: their answers are the exact ones.
EXACT_READOUTS = ("greedy", "head")


def _slog(x: Array) -> Array:
    result: Array = np.sign(x) * np.log1p(np.abs(x))
    return result


def item_score_bounds(metric: str, answers: Array, bounds: Array, references: Array) -> Array:
    """How far each item's ``metric`` score (:func:`numtok_compare.item_metrics.item_scores`) can
    move (S, I) when each answer (S, I) is within ``bounds`` (S, I; NaN: no bound) of the exact
    one, against ``references`` (I,) or (S, I); 0 for an unparsed answer (NaN: scored as a
    constant), ``inf`` where an answer has no bound."""
    if metric not in MEAN_METRICS:
        raise ValueError(f"metric must be one of {list(MEAN_METRICS)}, got {metric!r}")
    parsed = ~np.isnan(answers)
    b = np.where(parsed, bounds, 0.0)
    a = np.where(parsed, answers, 0.0)
    error = np.abs(a - references)
    with np.errstate(invalid="ignore", over="ignore"):
        if metric == "mae":
            moved = b
        elif metric == "mse":
            moved = b * (2 * error + b)
        elif metric == "log_mae":
            moved = np.maximum(np.abs(_slog(a + b) - _slog(a)), np.abs(_slog(a - b) - _slog(a)))
        else:
            edge = 0.0 if metric == "exact_accuracy" else 0.01 * np.abs(references)
            # The score is 1 within the edge: it can change where the interval reaches it.
            moved = ((b > 0) & (np.abs(error - edge) <= b)).astype(np.float64)
    return np.where(parsed & np.isnan(bounds), np.inf, np.where(parsed, moved, 0.0))


def estimate_bound(arm: Array, baseline: Array) -> float | None:
    """How far a mean difference ``arm − baseline`` over the same (S, I) seeds and items can move:
    the mean of both sides' item bounds (:func:`item_score_bounds`); None where one is unbounded."""
    total = float(np.mean(arm) + np.mean(baseline))
    return total if np.isfinite(total) else None


def could_flip(entry: Mapping[str, Any], bound: float | None) -> bool | None:
    """Whether the verdict of an interval ``entry`` (``low``, ``high``) could change if its
    estimate moved by ``bound``: the interval, shifted by up to ``bound``, could reach across 0
    (None: no interval or no bound)."""
    low, high = entry.get("low"), entry.get("high")
    if low is None or high is None or bound is None:
        return None
    return bool(low - bound <= 0.0 <= high + bound) and not bool(low + bound <= 0.0 <= high - bound)
