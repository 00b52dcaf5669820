"""What a finished comparison's answers show: each arm's metrics on each split, its paired
difference from CE with two intervals, the learnability gate, and the primary endpoint.

Everything is computed from the stored answers (``answers[split][arm][readout]``: (n seeds, m
items) float64, NaN where an answer held no number) and the true answers (``references[split]``:
(m,)), so the point estimates, the seed interval and the bootstrap all read the same numbers.

* **Paired differences from CE** (same readout; the head with CE's ``expected`` and ``greedy``
  readouts): the paired-seed t interval (:func:`numtok.experiments.stats.paired_comparison`: the
  seed-to-seed spread only) and the seed × item bootstrap
  (:func:`numtok.experiments.bootstrap.seed_item_difference`: the test set's noise too), with the
  bootstrap's minimal detectable effect. The verdict is ``"better"`` or ``"worse"`` only when
  *both* intervals exclude 0, and there is no verdict at all when the gate failed.
* **The learnability gate** (on validation, with the run's metric): an arm that has not learnt
  the task answers with its loss's point estimate of the answers' marginal (CE the mode, an L1
  loss the median), which ranks losses by their point estimates, not by what they learnt. The
  gate passes when some trained arm, by some readout, beats the best constant answer (the
  training answers' mean, median or mode, whichever scores best) by more than the bootstrap
  standard error of that difference.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from numtok.experiments.bootstrap import Resamples, draw_resamples, seed_item_difference
from numtok.experiments.item_metrics import HIGHER_IS_BETTER, ITEM_METRICS, item_metric
from numtok.experiments.stats import paired_comparison, summarise

__all__ = [
    "BOOTSTRAP_REPLICATES",
    "Answers",
    "comparisons",
    "learnability_gate",
    "metric_table",
    "resamples_of",
    "verdict",
]

#: Replicates of every bootstrap (fixed, with a fixed generator seed per split).
BOOTSTRAP_REPLICATES = 2000
#: ``answers[split][arm][readout]``: (n seeds, m items); a seed-independent arm (``base``, a
#: constant) has one row.
Answers = Mapping[str, Mapping[str, Mapping[str, NDArray[np.float64]]]]


def resamples_of(seeds: int, items: int, split: str) -> Resamples:
    """The bootstrap draws of one split: the same for every arm, and for every run of it."""
    return draw_resamples(seeds, items, replicates=BOOTSTRAP_REPLICATES, seed=sum(map(ord, split)))


def _per_seed_metric(
    metric: str, rows: NDArray[np.float64], references: NDArray[np.float64]
) -> list[float | None]:
    ones = np.ones_like(references)
    values = [float(item_metric(metric, row, references, ones)) for row in rows]
    return [v if math.isfinite(v) else None for v in values]


def metric_table(
    answers: Answers, references: Mapping[str, NDArray[np.float64]], seeds: int
) -> list[dict[str, Any]]:
    """One entry per (split, arm, readout, metric): the value on each seed (a seed-independent
    arm's one value repeated), their mean and standard deviation."""
    entries = []
    for split, by_arm in answers.items():
        for arm, by_readout in by_arm.items():
            for readout, rows in by_readout.items():
                for metric in ITEM_METRICS:
                    values = _per_seed_metric(metric, rows, references[split])
                    if len(values) == 1:
                        values = values * seeds
                    entries.append(
                        {"split": split, "arm": arm, "readout": readout, "metric": metric,
                         **summarise(values)}
                    )  # fmt: skip
    return entries


def _baselines(readout: str, ce_readouts: Sequence[str]) -> list[str]:
    wanted = ["expected", "greedy"] if readout == "head" else [readout]
    return [r for r in wanted if r in ce_readouts]


def verdict(metric: str, seed: dict[str, Any], bootstrap: dict[str, Any]) -> str | None:
    """``"better"``/``"worse"`` when both intervals (``seed``: the paired-seed t interval's
    ``mean``, ``low``, ``high``; ``bootstrap``: :func:`~numtok.experiments.bootstrap.
    seed_item_difference`'s) exclude 0, else None."""
    intervals = [(seed["low"], seed["high"]), (bootstrap["low"], bootstrap["high"])]
    if any(low is None or high is None for low, high in intervals):
        return None
    if all(low > 0 for low, _ in intervals) or all(high < 0 for _, high in intervals):
        improved = (seed["mean"] > 0) == (metric in HIGHER_IS_BETTER)
        return "better" if improved else "worse"
    return None


def _paired(
    metric: str,
    rows: NDArray[np.float64],
    baseline: NDArray[np.float64],
    references: NDArray[np.float64],
    resamples: Resamples,
) -> dict[str, Any]:
    seeds = resamples.seed_draws.shape[1]
    values = _per_seed_metric(metric, np.broadcast_to(rows, (seeds, rows.shape[-1])), references)
    base = _per_seed_metric(
        metric, np.broadcast_to(baseline, (seeds, baseline.shape[-1])), references
    )
    seed_interval = paired_comparison(values, base)
    bootstrap = seed_item_difference(metric, rows, baseline, references, resamples)
    return {
        "mean": seed_interval["mean"],
        "seed": {k: seed_interval[k] for k in ("low", "high", "t", "values")},
        "bootstrap": bootstrap,
        "verdict": verdict(metric, seed_interval, bootstrap),
    }


def comparisons(
    answers: Answers, references: Mapping[str, NDArray[np.float64]], seeds: int,
    *, verdicts: bool = True,
) -> list[dict[str, Any]]:  # fmt: skip
    """One entry per (split, arm, readout, baseline readout, metric) of every arm but CE: the
    paired difference ``arm − CE`` (see the module docstring). ``verdicts=False`` (the gate
    failed) sets every verdict to None."""
    entries = []
    for split, by_arm in answers.items():
        ce = by_arm["ce"]
        resamples = resamples_of(seeds, len(references[split]), split)
        for arm, by_readout in by_arm.items():
            if arm == "ce":
                continue
            for readout, rows in by_readout.items():
                for baseline in _baselines(readout, list(ce)):
                    for metric in ITEM_METRICS:
                        entry = _paired(metric, rows, ce[baseline], references[split], resamples)
                        if not verdicts:
                            entry["verdict"] = None
                        entries.append(
                            {"split": split, "arm": arm, "readout": readout,
                             "baseline": baseline, "metric": metric, **entry}
                        )  # fmt: skip
    return entries


def learnability_gate(
    answers: Mapping[str, Mapping[str, NDArray[np.float64]]],
    constants: Mapping[str, float],
    references: NDArray[np.float64],
    seeds: int,
    metric: str,
) -> dict[str, Any]:
    """The gate on the validation split (module docstring): ``answers[arm][readout]`` of the
    trained arms (not ``base``), ``constants`` the training answers' mean, median and mode.

    Returns ``{"passed", "metric", "constant", "constant_value", "best", "arms"}``: ``constant``
    the best constant by ``metric`` and its value; ``arms`` one entry per (arm, readout) with its
    ``improvement`` over that constant (positive: better) and the bootstrap ``se``; ``best`` the
    entry with the largest improvement in standard errors.
    """
    sign = 1.0 if metric in HIGHER_IS_BETTER else -1.0
    ones = np.ones_like(references)
    scored = {
        name: float(item_metric(metric, np.full_like(references, value), references, ones))
        for name, value in constants.items()
    }
    finite = {name: value for name, value in scored.items() if math.isfinite(value)}
    if not finite:
        raise ValueError(f"no constant answer has a defined validation {metric}: choose another")
    best_constant = max(finite, key=lambda name: sign * finite[name])
    constant_rows = np.full_like(references, constants[best_constant])
    resamples = resamples_of(seeds, len(references), "validation")
    entries = []
    for arm, by_readout in answers.items():
        for readout, rows in by_readout.items():
            difference = seed_item_difference(metric, rows, constant_rows, references, resamples)
            improvement = None if difference["mean"] is None else sign * difference["mean"]
            entries.append(
                {"arm": arm, "readout": readout, "improvement": improvement,
                 "se": difference["se"], "passes": improvement is not None
                 and difference["se"] is not None and improvement > difference["se"]}
            )  # fmt: skip

    def standard_errors(entry: dict[str, Any]) -> float:
        if entry["improvement"] is None:
            return -math.inf
        if entry["se"]:
            return float(entry["improvement"] / entry["se"])
        return math.copysign(math.inf, entry["improvement"]) if entry["improvement"] else 0.0

    best = max(entries, key=standard_errors) if entries else None
    return {
        "passed": any(entry["passes"] for entry in entries),
        "metric": metric,
        "constant": best_constant,
        "constant_value": constants[best_constant],
        "constant_metric": finite[best_constant],
        "best": best,
        "arms": entries,
    }
