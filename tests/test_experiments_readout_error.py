"""The readouts' own error carried into the report (numtok_compare.readout_error): each item's
score bound against a brute force over the answers the bound allows; the estimate's bound against
the largest move of the difference any such answers make; a sampled readout's score variances
and their share of an interval against Monte Carlo draws; and the report that shows both."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from numtok_compare.analysis import Draws, comparisons
from numtok_compare.design import Design
from numtok_compare.item_metrics import MEAN_METRICS, item_scores
from numtok_compare.readout_error import (
    could_flip,
    draws_needed,
    draws_variance,
    estimate_bound,
    exact_states,
    interval_state,
    item_score_bounds,
    item_score_variances,
)
from numtok_compare.report import analyse_and_write


def _random_case(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Answers (2, 30) with unparsed ones and some exactly right or 1 % off, their bounds and the
    true answers (30,)."""
    rng = np.random.default_rng(seed)
    references = rng.integers(1, 500, size=30).astype(np.float64)
    answers = references + rng.normal(0, 20, size=(2, 30))
    answers[0, :5] = references[:5]  # exactly right: exact accuracy can only fall
    answers[1, 5:10] = references[5:10] * 1.01  # on the 1 % edge
    answers[0, 10] = np.nan  # unparsed
    bounds = rng.uniform(0, 3, size=(2, 30))
    bounds[1, :3] = 0.0
    return answers, bounds, references


@pytest.mark.parametrize("metric", MEAN_METRICS)
@pytest.mark.parametrize("seed", range(3))
def test_an_item_score_moves_at_most_its_bound(metric: str, seed: int) -> None:
    """Over a grid of answers within each bound (both ends included), the score moves by at
    most the item's bound, and for the continuous metrics the bound is reached at an end."""
    answers, bounds, references = _random_case(seed)
    bound = item_score_bounds(metric, answers, bounds, references)
    score = item_scores(metric, answers, references, unparsed=250.0)
    largest = np.zeros_like(score)
    for step in np.linspace(-1.0, 1.0, 201):
        moved = np.where(np.isnan(answers), np.nan, answers + step * bounds)
        largest = np.maximum(largest, np.abs(item_scores(metric, moved, references,
                                                         unparsed=250.0) - score))  # fmt: skip
    assert (largest <= bound + 1e-9).all()
    assert bound[0, 10] == 0.0  # an unparsed answer is scored as a constant
    if metric in ("mae", "mse"):  # reached by the answer moved away from the truth
        np.testing.assert_allclose(largest, bound, rtol=1e-9, atol=1e-12)
    elif metric != "log_mae":  # an indicator: 1 wherever an allowed answer changes it
        assert set(np.unique(bound)) <= {0.0, 1.0}
        assert ((largest == 1.0) <= (bound == 1.0)).all()


def test_an_unbounded_answer_leaves_the_estimate_unbounded() -> None:
    answers, bounds, references = _random_case(0)
    bounds[1, 20] = np.nan
    moved = item_score_bounds("mae", answers, bounds, references)
    assert np.isinf(moved[1, 20]) and np.isfinite(np.delete(moved.ravel(), 50)).all()
    assert estimate_bound(moved, np.zeros_like(moved)) is None


@pytest.mark.parametrize("seed", range(5))
def test_the_estimate_moves_at_most_its_bound(seed: int) -> None:
    """Any answers within the bounds on both sides move the mean difference by at most the
    estimate's bound; the answers at the worst ends reach it for the absolute error."""
    arm, arm_bounds, references = _random_case(seed)
    baseline, baseline_bounds, _ = _random_case(seed + 100)
    baseline = references + (baseline - references[None, :]) * 1.5

    def difference(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.mean(item_scores("mae", a, references, unparsed=250.0)
                             - item_scores("mae", b, references, unparsed=250.0)))  # fmt: skip

    bound = estimate_bound(
        item_score_bounds("mae", arm, arm_bounds, references),
        item_score_bounds("mae", baseline, baseline_bounds, references),
    )
    assert bound is not None
    centre = difference(arm, baseline)
    rng = np.random.default_rng(seed)
    for _ in range(200):
        a = arm + rng.uniform(-1, 1, arm.shape) * arm_bounds
        b = baseline + rng.uniform(-1, 1, baseline.shape) * baseline_bounds
        assert abs(difference(a, b) - centre) <= bound + 1e-9


def test_the_estimate_bound_is_reached() -> None:
    """With every error larger than its bound, answers pushed away from the truth on the arm's
    side and towards it on the baseline's move the MAE difference by the bound exactly."""
    rng = np.random.default_rng(1)
    references = rng.uniform(100, 200, size=20)
    arm = references + rng.choice([-1, 1], size=(3, 20)) * rng.uniform(5, 10, size=(3, 20))
    baseline = references + rng.choice([-1, 1], size=(3, 20)) * rng.uniform(5, 10, size=(3, 20))
    arm_bounds, baseline_bounds = rng.uniform(0, 4, size=(2, 3, 20))
    bound = estimate_bound(
        item_score_bounds("mae", arm, arm_bounds, references),
        item_score_bounds("mae", baseline, baseline_bounds, references),
    )
    pushed = arm + np.sign(arm - references) * arm_bounds
    pulled = baseline - np.sign(baseline - references) * baseline_bounds
    before = np.mean(np.abs(arm - references) - np.abs(baseline - references))
    after = np.mean(np.abs(pushed - references) - np.abs(pulled - references))
    assert after - before == pytest.approx(bound, rel=1e-12)


@pytest.mark.parametrize(
    ("low", "high", "bound", "expected"),
    [(0.5, 2.0, 0.1, False), (0.5, 2.0, 0.6, True), (-2.0, -0.05, 0.1, True),
     (-1.0, 1.0, 0.5, False), (-1.0, 1.0, 1.5, True), (0.5, 2.0, None, None),
     (None, None, 0.1, None)],
)  # fmt: skip
def test_could_flip_when_the_shifted_interval_reaches_across_zero(
    low: float | None, high: float | None, bound: float | None, expected: bool | None
) -> None:
    assert could_flip({"low": low, "high": high}, bound) is expected


SPLITS = ("test", "validation")


def _fabricated_rows(title: str, readouts: tuple[str, ...], **beside: Any) -> dict[str, Any]:
    """A finished run's rows, fabricated: CE and NTL-WAS, 3 seeds × 40 items on each of
    :data:`SPLITS`, the expected answers off the truth by normal errors (sd 8 and 6), the other
    ``readouts`` those rounded; ``beside`` added to (or replacing) the rows' keys."""
    rng = np.random.default_rng(0)
    references = rng.integers(10, 90, size=40).astype(np.float64)
    ce = references + rng.normal(0, 8, size=(3, 40))
    was = references + rng.normal(0, 6, size=(3, 40))
    design = Design(title=title, trained="fabricated.", seeds=(0, 1, 2), arms=("ce", "was"),
                    splits=("test",), metric="mae", readout="expected", max_value=99)  # fmt: skip
    answers = {split: {arm: {r: (rows if r == "expected" else np.round(rows)).tolist()
                             for r in readouts}
                       for arm, rows in (("ce", ce), ("was", was))}
               for split in SPLITS}  # fmt: skip
    return {"design": design.to_dict(), "config": {}, "choice": {"chosen": {}, "means": {}},
            "training_constants": {"mean": 50.0, "median": 50.0, "mode": 50.0}, "minutes": 1.0,
            "answers": answers,
            "references": {split: references.tolist() for split in SPLITS}, **beside}  # fmt: skip


def test_the_report_shows_the_bound_and_names_a_verdict_it_could_flip(tmp_path: Path) -> None:
    """Rows that keep the readouts' bounds: every interval of the expected readout has its ±, the
    greedy one ±0, and a verdict whose interval the bound could move across 0 is marked."""
    bounds = {split: {"ce": {"expected": np.full((3, 40), 0.01).tolist()},
                      "was": {"expected": np.full((3, 40), 5.0).tolist()}}
              for split in SPLITS}  # fmt: skip
    rows = _fabricated_rows("bounds", ("expected", "greedy"), readout_bounds=bounds)
    results = analyse_and_write(tmp_path, rows, preregistered=None)
    by_key = {(e["split"], e["arm"], e["readout"], e["metric"]): e for e in results["comparisons"]}
    expected = by_key[("test", "was", "expected", "mae")]
    assert expected["readout_bound"] == pytest.approx(5.01)
    assert expected["could_flip"] is True
    greedy = by_key[("test", "was", "greedy", "mae")]
    assert greedy["readout_bound"] == 0.0 and greedy["could_flip"] is False
    assert all("readout_bound" in entry for entry in results["gate"]["arms"])
    report = (tmp_path / "report.md").read_text()
    assert "±5" in report and "±0 |" in report
    assert "could flip within the readout's ±" in report
    assert "verdicts or gate decisions could change within it" in report
    # Rows without bounds (every run before them): no ± and no key, the report as it was.
    del rows["readout_bounds"]
    older = analyse_and_write(tmp_path, rows, preregistered=None)
    assert all("readout_bound" not in entry for entry in older["comparisons"])
    older_report = (tmp_path / "report.md").read_text()
    assert "±5" not in older_report and "readout's ±" not in older_report


# A sampled readout's noise (numtok_compare.readout_error's draws): each item's score variance
# against a Monte Carlo over normal draws' means, the estimate's against the variance of the
# mean difference those draws make, and the report that shows the share.


@pytest.mark.parametrize("metric", MEAN_METRICS)
def test_an_item_score_variance_matches_draws_of_the_mean(metric: str) -> None:
    """Means drawn around the exact answers (normal, standard error s): the variance of each
    item's score over 100,000 such means is the formula's at the exact answer, within Monte
    Carlo error where the delta method is exact or near it (mse, the indicators; the absolute
    and log errors away from the true answer), and never below it for those two (an upper bound
    at their kink)."""
    rng = np.random.default_rng(7)
    references = rng.integers(20, 500, size=40).astype(np.float64)
    exact = references + rng.normal(0, 15, size=40)
    exact[:4] = references[:4] * 1.01  # on the 1 % edge
    errors = rng.uniform(0.5, 4.0, size=40)
    formula = item_score_variances(metric, exact, errors, references)
    means = exact + rng.normal(size=(100_000, 40)) * errors
    simulated = item_scores(metric, means, references, unparsed=250.0).var(axis=0)
    if metric in ("mae", "log_mae"):  # a kink at the true answer: an upper bound there
        assert (simulated <= formula * 1.05).all()
        far = np.abs(exact - references) > 3 * errors
        np.testing.assert_allclose(simulated[far], formula[far], rtol=0.05)
    elif metric == "exact_accuracy":
        assert (formula == 0).all() and (simulated == 0).all()  # a mean is never exactly right
    else:
        np.testing.assert_allclose(simulated, formula, rtol=0.06, atol=1e-3)


def test_an_item_score_variance_of_an_unparsed_or_unknown_answer() -> None:
    references = np.array([10.0, 20.0, 30.0])
    answers = np.array([[12.0, np.nan, 28.0]])
    errors = np.array([[1.0, np.nan, np.nan]])
    variance = item_score_variances("mae", answers, errors, references)
    assert variance[0, 0] == 1.0 and variance[0, 1] == 0.0 and np.isinf(variance[0, 2])
    assert draws_variance(variance) is None
    with pytest.raises(ValueError, match="metric must be one of"):
        item_score_variances("rmse", answers, errors, references)


def test_the_draws_variance_is_the_variance_of_the_mean_difference() -> None:
    """A drawn arm (3 seeds) against a drawn base arm (one row for every seed): over 4,000 draws
    of both, the variance of the mean MSE difference is draws_variance's; and draws_needed's
    count, in the formula's own terms, leaves the draws a tenth of the variance."""
    rng = np.random.default_rng(3)
    references = rng.uniform(50, 150, size=25)
    arm = references + rng.normal(0, 10, size=(3, 25))
    base = references + rng.normal(0, 12, size=(1, 25))
    arm_errors, base_errors = rng.uniform(1, 5, size=(3, 25)), rng.uniform(1, 5, size=(1, 25))
    variance = draws_variance(
        item_score_variances("mse", arm, arm_errors, references),
        item_score_variances("mse", base, base_errors, references),
    )
    assert variance is not None
    differences = []
    for _ in range(4_000):
        drawn_arm = arm + rng.normal(size=arm.shape) * arm_errors
        drawn_base = np.broadcast_to(base + rng.normal(size=base.shape) * base_errors, arm.shape)
        differences.append(np.mean((drawn_arm - references) ** 2 - (drawn_base - references) ** 2))
    assert np.var(differences) == pytest.approx(variance, rel=0.07)
    se = 2 * np.sqrt(variance)  # the draws a quarter of the variance at 64 draws
    needed = draws_needed(64, variance, se)
    assert needed is not None
    at_needed = variance * 64 / needed
    assert at_needed / (se**2 - variance + at_needed) == pytest.approx(0.1, rel=0.01)
    assert draws_needed(64, variance, np.sqrt(variance)) is None  # the draws are all of it
    assert draws_needed(64, 0.0, 1.0) == 0 and draws_needed(64, None, 1.0) is None


def test_the_report_gives_the_draws_share_beside_each_interval(tmp_path: Path) -> None:
    """Rows of a sampled readout: every comparison and gate entry of the expected readout holds
    the draws' share of its variance (greedy's 0, the median's unknown), the report writes it
    after the interval, and the settings give the draws each primary comparison needs."""
    errors = {split: {arm: {"expected": np.full((3, 40), 3.0).tolist()} for arm in ("ce", "was")}
              for split in SPLITS}  # fmt: skip
    rows = _fabricated_rows(
        "draws", ("expected", "median", "greedy"), readout_standard_errors=errors,
        config={"readout_samples": 64},
        sampling_error={"mean": 3.0, "largest": 3.0, "mean_square": 9.0},
    )  # fmt: skip
    results = analyse_and_write(tmp_path, rows, preregistered=None)
    by_key = {(e["split"], e["arm"], e["readout"], e["metric"]): e for e in results["comparisons"]}
    expected = by_key[("test", "was", "expected", "mae")]
    assert expected["draws_share"] == pytest.approx(2 * 9.0 / 120 / expected["se"] ** 2)
    assert expected["draws_needed"] == draws_needed(64, 2 * 9.0 / 120, expected["se"])
    assert by_key[("test", "was", "greedy", "mae")]["draws_share"] == 0.0
    assert by_key[("test", "was", "median", "mae")]["draws_share"] is None
    assert all("draws_share" in entry for entry in results["gate"]["arms"])
    report = (tmp_path / "report.md").read_text()
    share = f"({100 * expected['draws_share']:.0f} % draws)"
    assert share in report and "(0 % draws)" in report and "(draws: n/a)" in report
    count = expected["draws_needed"]
    assert "(arm − CE, expected mae on test), this many draws per item" in report
    assert f"was {'n/a' if count is None else f'{count:,}'} (n/a:" in report
    # Rows without standard errors (every run before them): no share, the report as it was.
    del rows["readout_standard_errors"]
    older = analyse_and_write(tmp_path, rows, preregistered=None)
    assert all("draws_share" not in entry for entry in older["comparisons"])
    assert "% draws)" not in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize(
    ("estimate", "low", "high", "variance", "share", "expected"),
    [
        (5.0, 3.0, 7.0, 0.01, 0.1, {"above"}),  # far from 0, little noise: stays above
        (1.0, -1.0, 3.0, 0.01, 0.9, {"above"}),  # the exact interval, narrower, lies above 0
        (1.0, -1.0, 3.0, 0.01, 0.0, {"across"}),  # no draws' share: as wide, across 0
        (0.2, -1.0, 1.4, 1.0, 0.5, {"above", "below", "across"}),  # noisy: anywhere
        (-5.0, -7.0, -3.0, 4.0, 0.5, {"below", "across"}),
        (1.0, -1.0, 3.0, None, 0.5, None),
    ],
)  # fmt: skip
def test_exact_states_by_hand(
    estimate: float, low: float, high: float, variance: float | None, share: float,
    expected: set[str] | None,
) -> None:  # fmt: skip
    assert exact_states(estimate, low, high, variance, share) == expected


def test_a_drawn_verdict_the_exact_readout_changes_is_mostly_marked() -> None:
    """Two arms' exact expected answers (3 seeds × 60 items, MAE differences near 0) and draws
    around them (standard error 6): over 300 such runs, of the drawn intervals that lie
    elsewhere against 0 than the exact one, at least 80 % are marked draws_could_flip (the rest
    differ by the interval's width, which with 3 seeds the draws do not predict), and the mark
    is not on every interval (docs/compare.md gives the figures)."""
    rng = np.random.default_rng(11)
    references = rng.uniform(100, 500, 60)
    differ = marked_where_differ = marked = 0
    for _ in range(300):
        effect = rng.uniform(-0.3, 0.3)
        error = rng.normal(0, 15, (3, 60))
        exact = {"ce": references + error,
                 "was": references + error * (1 + effect) + rng.normal(0, 4, (3, 60))}  # fmt: skip
        drawn = {arm: rows + rng.normal(0, 6, rows.shape) for arm, rows in exact.items()}
        errors = {arm: {"expected": np.full((3, 60), 6.0)} for arm in drawn}

        def entry(answers: dict[str, np.ndarray], draws: Any) -> dict[str, Any]:
            split = {"test": {arm: {"expected": rows} for arm, rows in answers.items()}}
            return next(e for e in comparisons(split, {"test": references}, 3, 300.0,
                                               {"arms": []}, draws=draws)
                        if e["arm"] == "was" and e["metric"] == "mae")  # fmt: skip

        at_exact = entry(exact, None)
        at_draws = entry(drawn, {"test": Draws(errors, 64)})
        marked += bool(at_draws["draws_could_flip"])
        if interval_state(at_exact["low"], at_exact["high"]) != interval_state(
            at_draws["low"], at_draws["high"]
        ):
            differ += 1
            marked_where_differ += bool(at_draws["draws_could_flip"])
    assert differ > 50 and marked_where_differ / differ >= 0.8 and marked / 300 <= 0.7
