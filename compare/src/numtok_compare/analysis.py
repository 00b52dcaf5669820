"""What a finished ``numtok compare`` run shows: each arm's metrics on each split, each arm's
difference from CE with one interval and the verdict read from it, and the learnability gate
that decides which of those differences may have a verdict at all.

Everything is computed from the stored answers (``answers[split][arm][readout]``: (S seeds, I
items) float64, NaN where an answer held no number; ``base``, scored once, has one row) and the
true answers (``references[split]``: (I,) when every seed answers the same items, the crossed
design; (S, I) when each seed draws its own, items nested in seeds, as the arithmetic runs from
scratch do: :mod:`numtok_compare.crossed` analyses both).

* **Unparsed answers**: every error metric (MAE, RMSE, log-MAE, MSE, the share within 1 %,
  Pearson's r) scores an answer without a number as the training answers' median (``unparsed``),
  so that an arm cannot gain by answering less; exact accuracy counts it wrong; the parsed share
  is reported beside every metric (:mod:`numtok_compare.item_metrics`).
* **One interval per comparison** (:func:`comparisons`): for each split, arm but CE, readout,
  CE readout (the same one; the head against CE's ``expected`` and ``greedy``) and metric of
  :data:`~numtok_compare.item_metrics.MEAN_METRICS`, the per-item scores of the arm minus
  CE's, paired by seed and item (``base``'s one row paired with every seed of CE), analysed as
  the crossed seed × item design they are (:func:`numtok_compare.crossed.crossed_difference`:
  the generalized 95 % interval, Satterthwaite's degrees of freedom, the MDE (nominally 80 %
  power; less with few seeds, docs/statistics.md) from them). RMSE is tested as MSE; Pearson's
  r is not tested (not a mean of per-item scores). The verdict ("better", "worse", "not
  shown") is read from that interval alone, and only where the gate passed for both sides;
  else "no verdict", with the reason. One seed gives no interval and no verdict.
* **The learnability gate, per comparison** (:func:`learnability_gate`, on validation, with the
  run's metric): an arm that has not learnt the task answers with its loss's point estimate of
  the answers' marginal (CE the mode, an L1 loss the median), so comparing it ranks losses by
  those estimates, not by what they learnt. Every arm × readout of the run (K candidates) is
  tested against the best constant answer (the training answers' mean, median or mode, whichever
  scores best on validation) with the same crossed analysis, one-sided at
  :data:`GATE_ALPHA` with Bonferroni's correction over the K candidates (each interval at
  ``1 − 2·α/K``): it *learnt* when that interval lies entirely on the better side. A comparison
  "arm (readout R) − CE (readout R')" gets a verdict only where both the arm by R and CE by R'
  learnt. A candidate that did not is "not shown at this budget", with its improvement over the
  constant, the interval and the smallest improvement this design could have shown (its MDE).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from numtok_compare.crossed import CrossedDifference, crossed_difference, equivalence
from numtok_compare.item_metrics import (
    HIGHER_IS_BETTER,
    ITEM_METRICS,
    MEAN_METRICS,
    item_metrics,
    item_scores,
    per_item_metric,
)
from numtok_compare.readout_error import (
    EXACT_READOUTS,
    could_flip,
    draws_needed,
    draws_variance,
    estimate_bound,
    exact_states,
    interval_state,
    item_score_bounds,
    item_score_variances,
)
from numtok_compare.stats import summarise

__all__ = [
    "GATE_ALPHA",
    "Answers",
    "Draws",
    "comparisons",
    "draws_of_difference",
    "learnability_gate",
    "metric_table",
]

#: The gate's one-sided level over all its candidates (Bonferroni: α/K each).
GATE_ALPHA = 0.05
#: ``answers[split][arm][readout]``: (S seeds, I items); ``base`` has one row.
Answers = Mapping[str, Mapping[str, Mapping[str, NDArray[np.float64]]]]
#: ``bounds[split][arm][readout]``: how far each answer (S, I) may lie from the exact readout
#: (NaN: no bound); a readout missing is exact if in ``EXACT_READOUTS``, else unbounded.
Bounds = Answers
#: One split's arrays, ``[arm][readout]``.
ByArm = Mapping[str, Mapping[str, NDArray[np.float64]]]


@dataclass(frozen=True)
class Draws:
    """A sampled readout's noise, as the rows keep it: ``standard_errors[arm][readout]`` (S, I)
    of each drawn answer of one split (a readout missing is exact if in ``EXACT_READOUTS``, else
    of unknown noise), and the ``samples`` drawn per item."""

    standard_errors: ByArm
    samples: int


def _answer_bounds(
    bounds: ByArm, arm: str, readout: str, shape: tuple[int, ...]
) -> NDArray[np.float64]:
    """``arm``'s answer bounds (or standard errors) by ``readout`` (``bounds[arm][readout]``),
    broadcast to ``shape``; a readout not stored: 0 if it is exact (``EXACT_READOUTS``), else
    NaN."""
    stored = bounds.get(arm, {}).get(readout)
    if stored is None:
        return np.full(shape, 0.0 if readout in EXACT_READOUTS else np.nan)
    return np.broadcast_to(stored, shape)


def _with_readout_bound(
    entry: dict[str, Any], metric: str, sides: tuple[tuple[NDArray[np.float64], ...], ...],
    references: NDArray[np.float64],
) -> dict[str, Any]:  # fmt: skip
    """``entry`` with ``readout_bound`` (how far its estimate could move, the readouts' pruning
    aside from the sampling noise; None: unbounded) and ``could_flip`` (its interval's verdict,
    moved by that much; None: no interval or no bound). ``sides``: each side's (answers, answer
    bounds), or a constant's (scores,) that moves by nothing."""
    moved = [item_score_bounds(metric, side[0], side[1], references) if len(side) == 2
             else np.zeros_like(side[0]) for side in sides]  # fmt: skip
    bound = estimate_bound(*moved)
    return entry | {"readout_bound": bound, "could_flip": could_flip(entry, bound)}


def _with_draws(
    entry: dict[str, Any], se: float | None, metric: str, sides: tuple[tuple[str, str,
    NDArray[np.float64]], ...], references: NDArray[np.float64], draws: Draws,
) -> dict[str, Any]:  # fmt: skip
    """``entry`` with ``draws_share`` (the share of its interval's variance ``se²`` that the
    draws make up; None: not known), ``draws_needed`` (the draws per item for a share of
    :data:`~numtok_compare.readout_error.DRAWS_SHARE_TARGET`) and ``draws_could_flip`` (whether
    the exact readout's interval could lie elsewhere against 0: its verdict, or for a gate entry
    its decision, another; None: not known). ``sides``: each side's arm, readout and answers in
    their own rows (``base``: one), a constant's none."""
    variances = [
        item_score_variances(metric, answers,
                             _answer_bounds(draws.standard_errors, arm, readout, answers.shape),
                             references)
        for arm, readout, answers in sides
    ]  # fmt: skip
    variance = draws_variance(*variances)
    share = (
        0.0 if variance == 0 else None if variance is None or not se else min(1.0, variance / se**2)
    )
    estimate = entry.get("difference", entry.get("improvement"))
    states = exact_states(estimate, entry.get("low"), entry.get("high"), variance, share)
    flips = None
    if states is not None:
        drawn = interval_state(entry["low"], entry["high"])
        if "improvement" in entry:  # a gate entry decides only whether it lies above 0
            flips = any((state == "above") != (drawn == "above") for state in states)
        else:
            flips = any(state != drawn for state in states)
    return entry | {"draws_share": share, "draws_needed": draws_needed(draws.samples, variance, se),
                    "draws_could_flip": flips}  # fmt: skip


def draws_of_difference(
    arm: tuple[str, str], baseline: tuple[str, str], answers: ByArm,
    references: NDArray[np.float64], seeds: int, metric: str, unparsed: float, draws: Draws,
) -> dict[str, Any]:  # fmt: skip
    """The draws' part of one comparison of :func:`comparisons`, ``arm − baseline`` (each an
    ``(arm, readout)`` of one split's ``answers``) by ``metric`` of :data:`MEAN_METRICS`:
    ``{"se", "draws_share", "draws_needed", "draws_could_flip"}`` as its entry holds them (the
    last None: no interval here)."""
    rows, baseline_rows = answers[arm[0]][arm[1]], answers[baseline[0]][baseline[1]]
    shape = (seeds, rows.shape[-1])
    scores = [item_scores(metric, np.broadcast_to(side, shape), references, unparsed=unparsed)
              for side in (rows, baseline_rows)]  # fmt: skip
    se = _difference(*scores, higher_is_better=metric in HIGHER_IS_BETTER,
                     nested=references.ndim == 2)["se"]  # fmt: skip
    sides = ((*arm, rows), (*baseline, baseline_rows))
    return _with_draws({"se": se}, se, metric, sides, references, draws)


def metric_table(
    answers: Answers, references: Mapping[str, NDArray[np.float64]], seeds: int, unparsed: float
) -> list[dict[str, Any]]:
    """One entry per (split, arm, readout, metric of :data:`ITEM_METRICS`): the value on each
    seed (``base``'s one value repeated), their mean and standard deviation; an unparsed answer
    scored by the module docstring's rule."""
    entries = []
    for split, by_arm in answers.items():
        for arm, by_readout in by_arm.items():
            for readout, rows in by_readout.items():
                truths = np.broadcast_to(references[split], rows.shape)  # nested: own items
                per_seed = [item_metrics(row, truth, unparsed=unparsed)
                            for row, truth in zip(rows, truths, strict=True)]  # fmt: skip
                for metric in ITEM_METRICS:
                    values = [scored[metric] for scored in per_seed]
                    values = [v if v is not None and math.isfinite(v) else None for v in values]
                    if len(values) == 1:
                        values = values * seeds
                    entries.append(
                        {"split": split, "arm": arm, "readout": readout, "metric": metric,
                         **summarise(values)}
                    )  # fmt: skip
    return entries


def _parsed(rows: NDArray[np.float64]) -> float:
    return float((~np.isnan(rows)).mean())


def _difference(
    arm: NDArray[np.float64], baseline: NDArray[np.float64], *, higher_is_better: bool,
    nested: bool, confidence: float = 0.95,
) -> dict[str, Any]:  # fmt: skip
    """The analysis of ``arm − baseline`` (both (S, I) scores; ``nested``: items nested in
    seeds) as a JSON-ready entry:
    ``difference``, ``low``, ``high``, ``se``, ``df``, ``mde``, ``interval_verdict``, ``reason``
    and ``components`` (the variance components ``seed``, ``item``, ``resid`` that plan a next
    run); no interval where a score is infinite (an infinite answer)."""
    if not (np.isfinite(arm).all() and np.isfinite(baseline).all()):
        return {"difference": None, "low": None, "high": None, "se": None, "df": None,
                "mde": None, "interval_verdict": "no verdict",
                "reason": _INFINITE, "components": None}  # fmt: skip
    result: CrossedDifference = crossed_difference(
        arm, baseline, higher_is_better=higher_is_better, confidence=confidence, nested=nested
    )
    components = result.components
    return {
        "difference": result.difference, "low": result.low, "high": result.high,
        "se": result.se, "df": result.df, "mde": result.mde,
        "interval_verdict": result.verdict, "reason": result.reason,
        "components": None if components is None else
        {"seed": components.seed, "item": components.item, "resid": components.resid},
    }  # fmt: skip


#: Why a comparison with an infinite answer has no interval.
_INFINITE = "an answer is infinite: its error has no finite mean"


def _gated(verdict: str, reason: str, unshown: str | None) -> tuple[str, str]:
    """The verdict a comparison gets under the gate: withheld ("no verdict", ``unshown`` the
    reason) where ``unshown`` says an arm did not learn; as it is otherwise."""
    if unshown is not None and verdict != "no verdict":
        return "no verdict", unshown
    return verdict, reason


def _equivalence(
    scores: NDArray[np.float64], baseline: NDArray[np.float64], margin: float,
    unshown: str | None, nested: bool,
) -> dict[str, Any]:  # fmt: skip
    """The equivalence entry of :func:`comparisons` (``unshown``: why the gate withholds it)."""
    if not (np.isfinite(scores).all() and np.isfinite(baseline).all()):
        return {"margin": margin, "verdict": "no verdict", "low": None, "high": None,
                "reason": _INFINITE}  # fmt: skip
    result = equivalence(scores, baseline, margin=margin, nested=nested)
    verdict, reason = _gated(result.verdict, result.reason, unshown)
    return {"margin": margin, "verdict": verdict, "low": result.low, "high": result.high,
            "reason": reason}  # fmt: skip


def _baselines(arm: str, readout: str, by_arm: Mapping[str, Any]) -> list[tuple[str, str]]:
    """What ``arm`` by ``readout`` is compared with: CE by the same readout (the head: CE's
    ``expected`` and ``greedy``), and where a regression head ran, the head (every token arm,
    CE included, by each readout: the paper's claim that a token head trained with NTL matches
    a regression head)."""
    if arm == "head":
        return [("ce", r) for r in ("expected", "greedy") if r in by_arm["ce"]]
    wanted = [] if arm == "ce" else [("ce", readout)]
    if "head" in by_arm and arm != "base":
        wanted.append(("head", "head"))
    return [(a, r) for a, r in wanted if r in by_arm[a]]


def comparisons(
    answers: Answers,
    references: Mapping[str, NDArray[np.float64]],
    seeds: int,
    unparsed: float,
    gate: Mapping[str, Any],
    *,
    margin: tuple[str, float, str] | None = None,
    bounds: Bounds | None = None,
    draws: Mapping[str, Draws] | None = None,
) -> list[dict[str, Any]]:
    """One entry per (split, arm, readout, ``baseline_arm`` and its readout ``baseline``, metric
    of :data:`MEAN_METRICS`) of :func:`_baselines`' pairs: ``arm − baseline_arm`` by the crossed
    analysis, its ``verdict`` ("better", "worse", "not shown" or "no verdict") and ``reason``
    (module docstring), and ``parsed_share`` of both sides (``arm``, ``baseline``). ``gate`` is
    :func:`learnability_gate`'s. ``margin``: ``(metric, m, baseline_arm)``, and every entry of
    that metric against that baseline arm also holds ``equivalence`` within ±m
    (:func:`numtok_compare.crossed.equivalence`: its ``verdict`` "equivalent", "different" or
    "undecided", ``low`` and ``high`` of the 90 % interval, ``reason``), under the same gate.
    ``bounds``: the answers' readout bounds (:data:`Bounds`); every entry then also holds
    ``readout_bound`` and ``could_flip`` (:mod:`numtok_compare.readout_error`); ``draws``: each
    split's :class:`Draws` of a sampled readout, and every entry then also holds ``draws_share``,
    ``draws_needed`` and ``draws_could_flip`` (:func:`_with_draws`)."""
    learnt = {(e["arm"], e["readout"]): e["learnt"] for e in gate["arms"]}
    entries = []
    for split, by_arm in answers.items():
        for arm, by_readout in by_arm.items():
            for readout, rows in by_readout.items():
                for baseline_arm, baseline in _baselines(arm, readout, by_arm):
                    entries += _compared(
                        (split, arm, readout, baseline_arm, baseline), rows,
                        by_arm[baseline_arm][baseline], references[split], seeds, unparsed, learnt,
                        margin, None if bounds is None else bounds[split],
                        None if draws is None else draws[split],
                    )  # fmt: skip
    return entries


def _compared(
    key: tuple[str, str, str, str, str], rows: NDArray[np.float64],
    baseline_rows: NDArray[np.float64], references: NDArray[np.float64], seeds: int,
    unparsed: float, learnt: Mapping[tuple[str, str], bool], margin: tuple[str, float, str] | None,
    bounds: ByArm | None, draws: Draws | None,
) -> list[dict[str, Any]]:  # fmt: skip
    split, arm, readout, baseline_arm, baseline = key
    own = ((arm, readout, rows), (baseline_arm, baseline, baseline_rows))
    rows = np.broadcast_to(rows, (seeds, rows.shape[-1]))  # base: one row for every seed
    baseline_rows = np.broadcast_to(baseline_rows, rows.shape)
    unlearnt = [f"{a} ({r})" for a, r in ((arm, readout), (baseline_arm, baseline))
                if not learnt.get((a, r), False)]  # fmt: skip
    nested = references.ndim == 2
    entries = []
    for metric in MEAN_METRICS:
        scores = item_scores(metric, rows, references, unparsed=unparsed)
        baseline_scores = item_scores(metric, baseline_rows, references, unparsed=unparsed)
        entry = _difference(scores, baseline_scores, higher_is_better=metric in HIGHER_IS_BETTER,
                            nested=nested)  # fmt: skip
        unshown = ("learning not shown on validation for " + " and ".join(unlearnt)
                   if unlearnt else None)  # fmt: skip
        verdict, reason = _gated(entry["interval_verdict"], entry["reason"], unshown)
        if margin is not None and (metric, baseline_arm) == (margin[0], margin[2]):
            entry["equivalence"] = _equivalence(scores, baseline_scores, margin[1], unshown, nested)
        if bounds is not None:
            sides = (
                (rows, _answer_bounds(bounds, arm, readout, rows.shape)),
                (baseline_rows, _answer_bounds(bounds, baseline_arm, baseline, rows.shape)),
            )
            entry = _with_readout_bound(entry, metric, sides, references)  # fmt: skip
        if draws is not None:
            entry = _with_draws(entry, entry["se"], metric, own, references, draws)
        entries.append(
            {"split": split, "arm": arm, "readout": readout, "baseline_arm": baseline_arm,
             "baseline": baseline, "metric": metric, **entry, "verdict": verdict,
             "reason": reason,
             "parsed_share": {"arm": _parsed(rows), "baseline": _parsed(baseline_rows)}}
        )  # fmt: skip
    return entries


def learnability_gate(
    answers: ByArm,
    constants: Mapping[str, float],
    references: NDArray[np.float64],
    seeds: int,
    metric: str,
    unparsed: float,
    bounds: ByArm | None = None,
    draws: Draws | None = None,
) -> dict[str, Any]:
    """The gate on the validation split (module docstring): ``answers[arm][readout]`` of every
    arm, ``constants`` the training answers' mean, median and mode, ``metric`` the run's (tested
    as :func:`~numtok_compare.item_metrics.per_item_metric` says).

    Returns ``{"metric", "seeds", "tested", "alpha", "candidates", "confidence", "constant",
    "constant_value", "constant_score", "arms", "closest"}``: ``constant`` the best constant by
    the tested metric, its value and score; ``arms`` one entry per (arm, readout) with its
    ``improvement`` over that constant (positive: better), the interval ``low``..``high`` of the
    improvement at ``confidence``, ``mde``, ``parsed_share``, ``learnt`` and ``reason``;
    ``closest`` the entry that did not learn whose interval comes nearest to excluding 0 (None
    when every candidate learnt). ``bounds``: the answers' readout bounds (``bounds[arm]
    [readout]``, :data:`Bounds` of the validation split); every entry then also holds
    ``readout_bound`` and ``could_flip``, whether its decision could change within it;
    ``draws``: the validation split's :class:`Draws`, and every entry then also holds
    ``draws_share``, ``draws_needed`` and ``draws_could_flip``.
    """
    tested = per_item_metric(metric)
    higher = tested in HIGHER_IS_BETTER
    sign = 1.0 if higher else -1.0
    scores = {name: item_scores(tested, np.full_like(references, value), references,
                                unparsed=unparsed)
              for name, value in constants.items()}  # fmt: skip
    constant = max(scores, key=lambda name: sign * float(scores[name].mean()))
    constant_rows = np.broadcast_to(scores[constant], (seeds, references.shape[-1]))
    candidates = sum(len(by_readout) for by_readout in answers.values())
    confidence = 1 - 2 * GATE_ALPHA / candidates
    entries = []
    for arm, by_readout in answers.items():
        for readout, rows in by_readout.items():
            rows = np.broadcast_to(rows, (seeds, rows.shape[-1]))
            arm_scores = item_scores(tested, rows, references, unparsed=unparsed)
            entry = _difference(
                arm_scores, constant_rows, higher_is_better=higher, confidence=confidence,
                nested=references.ndim == 2,
            )  # fmt: skip
            low = high = None  # of the improvement: the difference's ends, turned by sign
            if entry["low"] is not None and entry["high"] is not None:
                low, high = sorted((sign * entry["low"], sign * entry["high"]))
            learnt = entry["interval_verdict"] == "better"
            reason = "beats the constant" if learnt else "not shown at this budget"
            if entry["interval_verdict"] == "no verdict":
                reason = entry["reason"]
            gated = {
                "arm": arm, "readout": readout,
                "improvement": None if entry["difference"] is None
                else sign * entry["difference"],
                "low": low, "high": high, "mde": entry["mde"], "parsed_share": _parsed(rows),
                "learnt": learnt, "reason": reason,
            }  # fmt: skip
            if bounds is not None:
                sides = ((rows, _answer_bounds(bounds, arm, readout, rows.shape)), (constant_rows,))
                gated = _with_readout_bound(gated, tested, sides, references)
            if draws is not None:
                own = ((arm, readout, by_readout[readout]),)
                gated = _with_draws(gated, entry["se"], tested, own, references, draws)
            entries.append(gated)

    def nearness(entry: dict[str, Any]) -> float:
        value = entry["low"] if entry["low"] is not None else entry["improvement"]
        return -math.inf if value is None else float(value)

    failed = [e for e in entries if not e["learnt"]]
    return {
        "metric": metric,
        "seeds": seeds,
        "tested": tested,
        "alpha": GATE_ALPHA,
        "candidates": candidates,
        "confidence": confidence,
        "constant": constant,
        "constant_value": constants[constant],
        "constant_score": float(scores[constant].mean()),
        "arms": entries,
        "closest": max(failed, key=nearness) if failed else None,
    }
