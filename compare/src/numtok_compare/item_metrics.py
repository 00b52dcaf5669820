"""The numeric metrics of :func:`numtok.numeric_metrics`, computed from per-item answers under
resampling weights, so that a bootstrap recomputes a metric on thousands of resamples of the
test items at once.

An evaluated arm is two float64 vectors over the m items: its answers ``p`` (NaN where the
answer held no number) and the references ``r``. A resample of the items is a vector of counts
``w`` (how often each item was drawn; all ones is the test set itself), and ``W`` (B, m) holds B
of them. With ``q = [p is a number]``:

* ``exact_accuracy = Σ w·q·[|p - r| ≤ tol] / Σ w`` (an unparsed answer is wrong);
* ``within_1_percent = Σ w·q·[|p - r| ≤ 0.01·|r|] / Σ w``;
* ``parsed_share = Σ w·q / Σ w``;
* ``mae = Σ w·q·|p - r| / Σ w·q``, ``rmse = sqrt(Σ w·q·(p - r)² / Σ w·q)``,
  ``log_mae = Σ w·q·|slog p - slog r| / Σ w·q`` with ``slog x = sign(x)·log1p(|x|)``;
* ``pearson``: Pearson's r of (p, r) over the parsed items, each counted ``w`` times (NaN when
  fewer than two distinct parsed items or either side is constant).

With ``w = 1`` these are :func:`numtok.numeric_metrics`' values (tested). An infinite answer
(``"1e999"``) makes the error metrics infinite wherever it is drawn, as there.

**Unparsed answers, scored by one rule** (``unparsed=``, what ``numtok compare`` passes): every
error metric (``mae``, ``rmse``, ``log_mae``, ``within_1_percent``, ``pearson``) scores an answer
without a number as if it were ``unparsed`` (the training answers' median): an arm cannot gain
by answering less than answering that median would give it. ``exact_accuracy`` still counts it
wrong, and ``parsed_share`` still counts it as unparsed. Without ``unparsed`` the error metrics
drop such answers, as :func:`numtok.numeric_metrics` does.

**Per-item scores** (:func:`item_scores`): the metrics that are means of one score per item,
:data:`MEAN_METRICS` (0/1 for ``exact_accuracy`` and ``within_1_percent``, the absolute, log or
squared error for ``mae``, ``log_mae`` and ``mse``), for an analysis over seeds and items
(:mod:`numtok_compare.crossed`). RMSE and Pearson's r are not such means: RMSE is tested as
``mse`` (the pooled RMSE is the square root of the pooled MSE, so they order arms alike,
:func:`per_item_metric`), Pearson's r not at all.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "ENDPOINT_METRICS",
    "HIGHER_IS_BETTER",
    "ITEM_METRICS",
    "MEAN_METRICS",
    "answer_values",
    "item_metric",
    "item_metrics",
    "item_scores",
    "per_item_metric",
]

Vector = NDArray[np.float64]
Weights = NDArray[np.float64]

#: Metrics where a larger value is better; for every other one (an error) smaller is better.
HIGHER_IS_BETTER = frozenset({"exact_accuracy", "within_1_percent", "parsed_share", "pearson"})


def answer_values(answers: Sequence[float | None]) -> Vector:
    """The answers as a float64 vector, NaN for an answer without a number (None or NaN)."""
    return np.array([math.nan if a is None else float(a) for a in answers], dtype=np.float64)


def _weighted_sum(weights: Weights, values: Vector) -> Vector:
    """``Σ_i w_bi·v_i`` per row b, where an item drawn zero times adds nothing even when its
    value is infinite (0·inf would be NaN)."""
    terms = np.where(weights > 0, weights * values, 0.0)
    summed: Vector = np.asarray(terms.sum(axis=-1), dtype=np.float64)
    return summed


def _share(weights: Weights, hits: NDArray[np.bool_]) -> Vector:
    share: Vector = _weighted_sum(weights, hits.astype(np.float64)) / weights.sum(axis=-1)
    return share


def _parsed_mean(weights: Weights, parsed: NDArray[np.bool_], values: Vector) -> Vector:
    """``Σ w·q·v / Σ w·q``; NaN where no drawn item was parsed."""
    kept = np.where(parsed, values, 0.0)
    count = _weighted_sum(weights, parsed.astype(np.float64))
    with np.errstate(invalid="ignore", divide="ignore"):
        mean: Vector = np.where(count > 0, _weighted_sum(weights * parsed, kept) / count, np.nan)
    return mean


def _slog(x: Vector) -> Vector:
    logged: Vector = np.sign(x) * np.log1p(np.abs(x))
    return logged


def _pearson(weights: Weights, parsed: NDArray[np.bool_], p: Vector, r: Vector) -> Vector:
    w = weights * parsed
    p0, r0 = np.where(parsed, p, 0.0), np.where(parsed, r, 0.0)
    total = w.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_p = _weighted_sum(w, p0)[..., None] / total
        mean_r = _weighted_sum(w, r0)[..., None] / total
        dp, dr = np.where(parsed, p0 - mean_p, 0.0), np.where(parsed, r0 - mean_r, 0.0)
        covariance = _weighted_sum(w, dp * dr)
        spread = np.sqrt(_weighted_sum(w, dp * dp) * _weighted_sum(w, dr * dr))
        # A constant side (spread 0, up to rounding of the mean) leaves r undefined.
        scale = np.sqrt(_weighted_sum(w, p0 * p0) * _weighted_sum(w, r0 * r0))
        defined = (spread > 1e-12 * scale) & (total[..., 0] > 1)
        r_value = np.where(defined, covariance / np.where(defined, spread, 1.0), np.nan)
    clipped: Vector = np.clip(r_value, -1.0, 1.0)
    return clipped


def _exact(tolerance: float) -> Callable[[Weights, Vector, Vector], Vector]:
    def exact_accuracy(weights: Weights, p: Vector, r: Vector) -> Vector:
        with np.errstate(invalid="ignore"):
            return _share(weights, np.abs(p - r) <= tolerance)

    return exact_accuracy


def _within_1_percent(weights: Weights, p: Vector, r: Vector) -> Vector:
    with np.errstate(invalid="ignore"):
        return _share(weights, np.abs(p - r) <= 0.01 * np.abs(r))


def _parsed_share(weights: Weights, p: Vector, r: Vector) -> Vector:
    return _share(weights, ~np.isnan(p))


def _mae(weights: Weights, p: Vector, r: Vector) -> Vector:
    return _parsed_mean(weights, ~np.isnan(p), np.abs(p - r))


def _rmse(weights: Weights, p: Vector, r: Vector) -> Vector:
    squared: Vector = np.sqrt(_parsed_mean(weights, ~np.isnan(p), (p - r) ** 2))
    return squared


def _log_mae(weights: Weights, p: Vector, r: Vector) -> Vector:
    with np.errstate(invalid="ignore"):
        return _parsed_mean(weights, ~np.isnan(p), np.abs(_slog(p) - _slog(r)))


def _pearson_metric(weights: Weights, p: Vector, r: Vector) -> Vector:
    return _pearson(weights, ~np.isnan(p), p, r)


_METRICS: dict[str, Callable[[Weights, Vector, Vector], Vector]] = {
    "exact_accuracy": _exact(0.0),
    "mae": _mae,
    "rmse": _rmse,
    "log_mae": _log_mae,
    "within_1_percent": _within_1_percent,
    "pearson": _pearson_metric,
    "parsed_share": _parsed_share,
}
#: The metrics :func:`item_metric` computes.
ITEM_METRICS = tuple(_METRICS)


#: The metrics that score an unparsed answer as ``unparsed`` when it is given.
_FILLED = frozenset({"mae", "rmse", "log_mae", "within_1_percent", "pearson", "mse"})


def _filled(metric: str, answers: Vector, unparsed: float | None) -> Vector:
    if unparsed is None or metric not in _FILLED:
        return answers
    filled: Vector = np.where(np.isnan(answers), unparsed, answers)
    return filled


def item_metric(
    metric: str,
    answers: Vector,
    references: Vector,
    weights: Weights,
    *,
    unparsed: float | None = None,
) -> Vector:
    """``metric`` of ``answers`` (m,) against ``references`` (m,) under each row of ``weights``
    (B, m) of item counts: (B,) values (see the module docstring; a (m,) ``weights`` gives a
    0-dim result). ``unparsed``: the answer an error metric scores where ``answers`` is NaN
    (None: the error metrics drop such answers)."""
    if metric not in _METRICS:
        raise ValueError(f"metric must be one of {list(ITEM_METRICS)}, got {metric!r}")
    if answers.shape != references.shape or weights.shape[-1] != answers.shape[-1]:
        raise ValueError(
            f"answers {answers.shape}, references {references.shape} and weights "
            f"{weights.shape} must share their last (item) dimension"
        )
    scored = _filled(metric, answers, unparsed)
    return _METRICS[metric](weights.astype(np.float64), scored, references)


def item_metrics(
    answers: Vector, references: Vector, *, unparsed: float | None = None
) -> dict[str, float | None]:
    """Every metric of :data:`ITEM_METRICS` on the items themselves (weights 1); None where it is
    undefined (NaN). ``unparsed`` as :func:`item_metric` takes it."""
    ones = np.ones_like(references)
    values = {
        name: float(item_metric(name, answers, references, ones, unparsed=unparsed))
        for name in _METRICS
    }
    return {name: (None if math.isnan(value) else value) for name, value in values.items()}


def _scores(metric: str, p: Vector, r: Vector) -> Vector:
    with np.errstate(invalid="ignore"):
        if metric == "exact_accuracy":
            return (np.abs(p - r) <= 0.0).astype(np.float64)  # NaN: False, wrong
        if metric == "within_1_percent":
            return (np.abs(p - r) <= 0.01 * np.abs(r)).astype(np.float64)
        if metric == "mae":
            return np.abs(p - r)
        if metric == "log_mae":
            return np.abs(_slog(p) - _slog(r))
    squared: Vector = (p - r) ** 2
    return squared


#: The metrics that are means of one score per item, :func:`item_scores`' (``mse``: the squared
#: error, RMSE's test; not in :data:`ITEM_METRICS`' tables).
MEAN_METRICS = ("exact_accuracy", "within_1_percent", "mae", "mse", "log_mae")
#: The metrics a run may choose, its ``--metric`` (λ's choice, the gate, the primary endpoint).
ENDPOINT_METRICS = ("exact_accuracy", "within_1_percent", "mae", "rmse", "log_mae")


def per_item_metric(metric: str) -> str:
    """The metric of :data:`MEAN_METRICS` that tests ``metric``: ``mse`` for ``rmse``, the
    metric itself for the others of :data:`ENDPOINT_METRICS`."""
    if metric == "rmse":
        return "mse"
    if metric not in MEAN_METRICS:
        raise ValueError(
            f"{metric!r} is not a mean of per-item scores: test one of {list(ENDPOINT_METRICS)}"
        )
    return metric


def item_scores(metric: str, answers: Vector, references: Vector, *, unparsed: float) -> Vector:
    """One score per item of ``answers`` (..., m) against ``references`` (m,): their mean over
    the items is :func:`item_metric` of ``metric`` (``mse``: the square of ``rmse``) with the same
    ``unparsed`` (module docstring); ``metric`` one of :data:`MEAN_METRICS`.

    Example:
        >>> item_scores("mae", np.array([1.0, np.nan]), np.array([2.0, 4.0]), unparsed=3.0)
        array([1., 1.])
    """
    if metric not in MEAN_METRICS:
        raise ValueError(f"metric must be one of {list(MEAN_METRICS)}, got {metric!r}")
    return _scores(metric, _filled(metric, answers, unparsed), references)
