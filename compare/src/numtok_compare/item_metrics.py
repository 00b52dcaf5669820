"""The metrics of a scored split, as :func:`numtok.numeric_metrics` computes them
(:func:`item_metrics`), and one score per item for the crossed analysis (:func:`item_scores`).

An evaluated arm is two float64 vectors over the m items: its answers ``p`` (NaN where the
answer held no number) and the references ``r``. The metrics (:data:`ITEM_METRICS`) are
``exact_accuracy``, ``mae``, ``rmse``, ``log_mae``, ``within_1_percent`` and ``pearson`` of
:func:`numtok.numeric_metrics`, and ``parsed_share``, the share of answers with a number.

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
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from numtok import numeric_metrics

__all__ = [
    "ENDPOINT_METRICS",
    "HIGHER_IS_BETTER",
    "ITEM_METRICS",
    "MEAN_METRICS",
    "answer_values",
    "item_metrics",
    "item_scores",
    "per_item_metric",
]

Vector = NDArray[np.float64]

#: Metrics where a larger value is better; for every other one (an error) smaller is better.
HIGHER_IS_BETTER = frozenset({"exact_accuracy", "within_1_percent", "parsed_share", "pearson"})


def answer_values(answers: Sequence[float | None]) -> Vector:
    """The answers as a float64 vector, NaN for an answer without a number (None or NaN)."""
    return np.array([math.nan if a is None else float(a) for a in answers], dtype=np.float64)


def _slog(x: Vector) -> Vector:
    logged: Vector = np.sign(x) * np.log1p(np.abs(x))
    return logged


#: The metrics of a scored split, in the report's column order.
ITEM_METRICS = (
    "exact_accuracy", "mae", "rmse", "log_mae", "within_1_percent", "pearson", "parsed_share",
)  # fmt: skip


#: The metrics that score an unparsed answer as ``unparsed`` when it is given.
_FILLED = frozenset({"mae", "rmse", "log_mae", "within_1_percent", "pearson", "mse"})


def _answered(answers: Vector, unparsed: float | None) -> Vector:
    """``answers`` with ``unparsed`` where they hold no number (NaN); as they are without it."""
    if unparsed is None:
        return answers
    filled: Vector = np.where(np.isnan(answers), unparsed, answers)
    return filled


def _filled(metric: str, answers: Vector, unparsed: float | None) -> Vector:
    return _answered(answers, unparsed) if metric in _FILLED else answers


def item_metrics(
    answers: Vector, references: Vector, *, unparsed: float | None = None
) -> dict[str, float | None]:
    """Every metric of :data:`ITEM_METRICS` of ``answers`` (m,) against ``references`` (m,), as
    :func:`numtok.numeric_metrics` computes them, with the module docstring's rule for an
    answer without a number (NaN) when ``unparsed`` is given; None where a metric is undefined."""
    scored = numeric_metrics(answers.tolist(), references.tolist())
    filled = scored
    if unparsed is not None:
        filled = numeric_metrics(_answered(answers, unparsed).tolist(), references.tolist())
    values = {
        "exact_accuracy": scored.exact_accuracy, "parsed_share": scored.parsed / scored.count,
        **{name: getattr(filled, name) for name in ITEM_METRICS
           if name not in ("exact_accuracy", "parsed_share")},
    }  # fmt: skip
    return {name: None if math.isnan(values[name]) else values[name] for name in ITEM_METRICS}


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
