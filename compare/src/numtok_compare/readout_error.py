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

A sampled readout (``--readout-samples N``) has no bias but noise: each expected answer ``a`` is
the mean of N draws with a standard error ``s``. The noise is already in each interval (it
differs by seed and item: the crossed analysis's residual); :func:`draws_variance` says how much
of the interval's variance it is. An item's score has the variance, by the delta method at ``a``,

* ``s²`` for ``mae`` (an upper bound: the absolute value is 1-Lipschitz), ``s²/(1 + |a|)²`` for
  ``log_mae`` (the same, near the true answer, where both have a kink);
* ``4(a − r)²s² + 2s⁴`` for ``mse`` (exact where the mean's error is normal);
* ``p(1 − p)`` for ``exact_accuracy`` and ``within_1_percent``, ``p`` the normal probability
  that the answer lies within the criterion's edge of ``r``.

A mean difference over the same seeds and items has the variance ``Σ_side mean(v)/n`` from the
draws, ``v`` a side's item variances over its own ``n`` answers (``base``'s one row counts once,
whatever the seeds): the draws of different items, seeds and arms are independent. Its share of
the interval's ``se²`` falls as ``1/N``; :func:`draws_needed` gives the N at which it would be
:data:`DRAWS_SHARE_TARGET`. Against the exact readout a drawn interval could give another
verdict (:func:`exact_states`): the exact estimate lies within ``1.96·√variance`` of the drawn one
(95 %), and its interval is narrower, each side by ``√(1 − share)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy.stats import norm

from numtok_compare.item_metrics import MEAN_METRICS

__all__ = [
    "DRAWS_SHARE_TARGET",
    "EXACT_READOUTS",
    "could_flip",
    "draws_needed",
    "draws_variance",
    "estimate_bound",
    "exact_states",
    "interval_state",
    "item_score_bounds",
    "item_score_variances",
]

Array = NDArray[np.float64]

#: Readouts that prune nothing: their answers are the exact ones.
EXACT_READOUTS = ("greedy", "head")
#: The share of an interval's variance the draws may make up at :func:`draws_needed`'s count.
DRAWS_SHARE_TARGET = 0.1


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


def item_score_variances(metric: str, answers: Array, errors: Array, references: Array) -> Array:
    """The variance each item's ``metric`` score (:func:`numtok_compare.item_metrics.
    item_scores`) has from the draws (S, I), each answer (S, I) a mean of draws with the standard
    error ``errors`` (S, I; NaN: not known), by the module docstring's formulas; 0 for an
    unparsed answer (scored as a constant), ``inf`` where a parsed answer's error is not known."""
    if metric not in MEAN_METRICS:
        raise ValueError(f"metric must be one of {list(MEAN_METRICS)}, got {metric!r}")
    parsed = ~np.isnan(answers)
    s = np.where(parsed & ~np.isnan(errors), errors, 0.0)
    a = np.where(parsed, answers, 0.0)
    error = a - references
    if metric == "mae":
        variance = s**2
    elif metric == "log_mae":
        variance = (s / (1 + np.abs(a))) ** 2
    elif metric == "mse":
        variance = 4 * error**2 * s**2 + 2 * s**4
    else:
        edge = 0.0 if metric == "exact_accuracy" else 0.01 * np.abs(references)
        with np.errstate(divide="ignore", invalid="ignore"):
            inside = norm.cdf((edge - error) / s) - norm.cdf((-edge - error) / s)
        inside = np.where(s > 0, inside, (np.abs(error) <= edge).astype(np.float64))
        variance = inside * (1 - inside)
    return np.where(parsed & np.isnan(errors), np.inf, np.where(parsed, variance, 0.0))


def draws_variance(*sides: Array) -> float | None:
    """The variance the draws add to a mean difference over the same seeds and items: each side's
    item variances (:func:`item_score_variances`) over its own answers, ``Σ mean(v)/n``; None
    where one is not known."""
    total = sum(float(np.mean(side)) / side.size for side in sides)
    return total if math.isfinite(total) else None


def draws_needed(samples: int, variance: float | None, se: float | None) -> int | None:
    """The draws per item at which the draws would make up :data:`DRAWS_SHARE_TARGET` of the
    variance ``se²`` of an interval whose draws, ``samples`` per item, add ``variance``: the rest,
    ``se² − variance``, stays; the draws' part falls as ``1/N``. None where that rest is not
    positive (the draws are all the variance measured) or nothing is known."""
    # The rest within rounding of 0 is none: se² of an interval the draws make up to the last bit.
    if variance is None or se is None or se**2 <= variance * (1 + 1e-9):
        return None
    if variance == 0:
        return 0
    target = DRAWS_SHARE_TARGET
    return math.ceil(samples * variance * (1 - target) / (target * (se**2 - variance)))


def interval_state(low: float, high: float) -> str:
    """Where an interval lies: ``"above"`` 0, ``"below"`` it, or ``"across"`` it."""
    return "above" if low > 0 else "below" if high < 0 else "across"


def exact_states(
    estimate: float | None, low: float | None, high: float | None, variance: float | None,
    share: float | None,
) -> set[str] | None:  # fmt: skip
    """The states (:func:`interval_state`) the exact readout's interval could have, for a drawn
    interval ``low``..``high`` around ``estimate`` whose draws add ``variance``, ``share`` of its
    own: the exact estimate anywhere within ``1.96·√variance`` of ``estimate``, each side of the
    interval shorter by ``√(1 − share)`` (the draws' part of its variance gone; the degrees of
    freedom taken as they are). None where one of them is not known."""
    if estimate is None or low is None or high is None or variance is None or share is None:
        return None
    margin = 1.96 * math.sqrt(variance)
    shrink = math.sqrt(max(0.0, 1.0 - share))
    below, above = (estimate - low) * shrink, (high - estimate) * shrink
    states = set()
    if estimate + margin > below:  # an exact estimate whose interval lies above 0
        states.add("above")
    if estimate - margin < -above:
        states.add("below")
    if estimate - margin <= below and estimate + margin >= -above:
        states.add("across")
    return states
