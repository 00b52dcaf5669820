"""The seed × item bootstrap: an interval for a paired difference between two arms that holds
both sources of noise, the training seed and the test set's own sampling.

Every seed of every arm answers the same m test items, so seeds and items are *crossed*: a
replicate draws n seeds with replacement from the n seeds, and one resample of the m items
with replacement, the same item resample for every drawn seed and both arms (the test set is
one sample, shared by all of them; drawing items afresh per seed would average the test set's
noise away). With ``M_a(s, w)`` the metric of arm a's seed s on the items counted by ``w``,
replicate b's difference is

    Δ_b = (1/n) Σ_j [ M_arm(s_bj, w_b) - M_base(s_bj, w_b) ],

and the point estimate is the same with every seed once and every item once. The interval is
the 2.5 and 97.5 percentiles of the Δ_b; its standard error their standard deviation; the
minimal detectable effect ``(z_0.975 + z_0.8)·SE = 2.80·SE`` is the true difference a
two-sided 5 % test of this size would find four times in five.

A base that does not depend on the seed (a constant answer, the model before fine-tuning) is
one row used for every seed. A replicate whose difference is not finite (a metric undefined on
that resample, such as Pearson's r of constant answers) leaves the interval undefined: it is
reported as such, not computed from the other replicates.

No report uses it any more: every report reads the crossed analysis of
:mod:`numtok_compare.crossed`. It stays, beside the harness, as the method the coverage study
(``crossed_coverage.py``) compares that analysis with.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from numtok_compare.item_metrics import ITEM_METRICS

__all__ = [
    "MDE_FACTOR",
    "Resamples",
    "draw_resamples",
    "item_metric",
    "replicate_differences",
    "seed_item_difference",
]

#: z_0.975 + z_0.8: the minimal detectable effect at 80 % power of a two-sided 5 % test, in
#: standard errors.
MDE_FACTOR = 1.959964 + 0.841621


Vector = NDArray[np.float64]
Weights = NDArray[np.float64]

# The metrics of numtok_compare.item_metrics (numtok.numeric_metrics') under resampling weights:
# a resample of the m items is a vector of counts w (how often each item was drawn; all ones is
# the test set itself), W (B, m) holds B of them, q = [p is a number]:
# exact_accuracy = Σ w·q·[p = r] / Σ w; within_1_percent = Σ w·q·[|p - r| ≤ 0.01·|r|] / Σ w;
# parsed_share = Σ w·q / Σ w; mae = Σ w·q·|p - r| / Σ w·q, rmse = sqrt(Σ w·q·(p - r)² / Σ w·q),
# log_mae = Σ w·q·|slog p - slog r| / Σ w·q; pearson: Pearson's r over the parsed items, each
# counted w times. With w = 1 they are numeric_metrics' values (tests/test_bootstrap.py).


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


def item_metric(metric: str, answers: Vector, references: Vector, weights: Weights) -> Vector:
    """``metric`` of ``answers`` (m,) against ``references`` (m,) under each row of ``weights``
    (B, m) of item counts: (B,) values (a (m,) ``weights`` gives a 0-dim result)."""
    if metric not in _METRICS:
        raise ValueError(f"metric must be one of {list(ITEM_METRICS)}, got {metric!r}")
    if answers.shape != references.shape or weights.shape[-1] != answers.shape[-1]:
        raise ValueError(
            f"answers {answers.shape}, references {references.shape} and weights "
            f"{weights.shape} must share their last (item) dimension"
        )
    return _METRICS[metric](weights.astype(np.float64), answers, references)


@dataclass(frozen=True)
class Resamples:
    """B replicates of a crossed design: ``item_counts`` (B, m) how often each item was drawn,
    ``seed_draws`` (B, n) the seeds' positions drawn."""

    item_counts: NDArray[np.float64]
    seed_draws: NDArray[np.int64]

    @property
    def replicates(self) -> int:
        return int(self.item_counts.shape[0])


def draw_resamples(seeds: int, items: int, *, replicates: int = 2000, seed: int = 0) -> Resamples:
    """``replicates`` draws of ``seeds`` seed positions and ``items`` items, each with
    replacement and uniform, from a generator seeded with ``seed`` (the same draws every time)."""
    for name, value in (("seeds", seeds), ("items", items), ("replicates", replicates)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    rng = np.random.default_rng(seed)
    drawn = rng.integers(0, items, size=(replicates, items))
    offsets = np.arange(replicates)[:, None] * items
    counts = np.bincount((drawn + offsets).ravel(), minlength=replicates * items)
    return Resamples(
        item_counts=counts.reshape(replicates, items).astype(np.float64),
        seed_draws=rng.integers(0, seeds, size=(replicates, seeds)),
    )


def _per_seed(answers: NDArray[np.float64], seeds: int) -> NDArray[np.float64]:
    """(n, m) answers: one row per seed, or one row for every seed."""
    rows = answers if answers.ndim == 2 else answers[None]
    if rows.shape[0] not in (1, seeds):
        raise ValueError(f"expected answers for 1 or {seeds} seeds, got {rows.shape[0]}")
    return np.broadcast_to(rows, (seeds, rows.shape[1]))


def replicate_differences(
    metric: str,
    answers: NDArray[np.float64],
    baseline: NDArray[np.float64],
    references: NDArray[np.float64],
    resamples: Resamples,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``(per seed (n,), per replicate (B,))``: each seed's difference on the items themselves,
    and each replicate's Δ_b (module docstring); the arguments as :func:`seed_item_difference`
    takes them."""
    seeds = resamples.seed_draws.shape[1]
    arm, base = _per_seed(answers, seeds), _per_seed(baseline, seeds)

    def difference(weights: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.stack(
            [
                item_metric(metric, arm[s], references, weights)
                - item_metric(metric, base[s], references, weights)
                for s in range(seeds)
            ]
        )

    per_seed = difference(resamples.item_counts)  # (n, B)
    replicate = np.arange(resamples.replicates)[:, None]
    return difference(np.ones_like(references)), per_seed[resamples.seed_draws, replicate].mean(1)


def seed_item_difference(
    metric: str,
    answers: NDArray[np.float64],
    baseline: NDArray[np.float64],
    references: NDArray[np.float64],
    resamples: Resamples,
) -> dict[str, Any]:
    """The paired difference ``metric(answers) - metric(baseline)`` over seeds and items.

    Args:
        metric: one of :data:`numtok_compare.item_metrics.ITEM_METRICS`.
        answers: (n, m) an arm's answers per seed (NaN: no number), or (m,) one for all seeds.
        baseline: the arm compared with, likewise.
        references: (m,) the true answers.
        resamples: from :func:`draw_resamples` with n seeds and m items.

    Returns:
        ``{"mean", "low", "high", "se", "mde", "replicates", "undefined"}``: the point estimate
        (None if not finite), the 95 % percentile interval, the bootstrap standard error and the
        minimal detectable effect (None when ``undefined``, the number of replicates whose
        difference is not finite, is not 0).
    """
    full, differences = replicate_differences(metric, answers, baseline, references, resamples)
    mean = float(full.mean())
    undefined = int((~np.isfinite(differences)).sum())
    result: dict[str, Any] = {
        "mean": mean if math.isfinite(mean) else None,
        "low": None,
        "high": None,
        "se": None,
        "mde": None,
        "replicates": resamples.replicates,
        "undefined": undefined,
    }
    if undefined == 0 and result["mean"] is not None:
        low, high = np.percentile(differences, [2.5, 97.5])
        se = float(differences.std(ddof=1))
        result.update(low=float(low), high=float(high), se=se, mde=MDE_FACTOR * se)
    return result
