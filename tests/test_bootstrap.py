"""The seed × item bootstrap of compare/studies (seed_item_bootstrap): its weighted metrics
against numtok.numeric_metrics (what the harness's numtok_compare.item_metrics reads), and its
intervals against a brute-force enumeration of every resample on tiny data."""

from __future__ import annotations

import itertools
import math
import random
import statistics

import numpy as np
import pytest

from numtok import numeric_metrics
from numtok_compare.item_metrics import ITEM_METRICS, answer_values, item_metrics

from seed_item_bootstrap import (
    MDE_FACTOR,
    draw_resamples,
    item_metric,
    replicate_differences,
    seed_item_difference,
)

FIELDS = {name: name for name in ITEM_METRICS if name != "parsed_share"}


def _reference_metric(name: str, answers: list[float | None], references: list[float]) -> float:
    scored = numeric_metrics(answers, references)
    if name == "parsed_share":
        return scored.parsed / scored.count
    return float(getattr(scored, FIELDS[name]))


def _random_answers(rng: random.Random, references: list[float]) -> list[float | None]:
    return [None if rng.random() < 0.2 else r + rng.choice([0, 0, 1, -3, 12.5]) for r in references]


@pytest.mark.parametrize("seed", range(5))
def test_the_weighted_metrics_at_unit_weights_are_numeric_metrics(seed: int) -> None:
    rng = random.Random(seed)
    references = [float(rng.randint(0, 500)) for _ in range(40)]
    answers = _random_answers(rng, references)
    values, truth = answer_values(answers), np.array(references)
    harness = item_metrics(values, truth)
    for name in ITEM_METRICS:
        expected = _reference_metric(name, answers, references)
        computed = float(item_metric(name, values, truth, np.ones(40)))
        assert computed == pytest.approx(expected, rel=1e-12, abs=1e-12), name
        assert harness[name] == pytest.approx(expected, rel=1e-12, abs=1e-12), name


@pytest.mark.parametrize("seed", range(5))
def test_weights_count_items_as_if_repeated(seed: int) -> None:
    rng = random.Random(100 + seed)
    references = [float(rng.randint(0, 50)) for _ in range(12)]
    answers = _random_answers(rng, references)
    counts = [rng.choice([0, 0, 1, 2, 3]) for _ in references]
    counts[0] = max(counts[0], 1)
    repeated = [(a, r) for a, r, c in zip(answers, references, counts, strict=True)
                for _ in range(c)]  # fmt: skip
    weights = np.array(counts, dtype=np.float64)
    for name in ITEM_METRICS:
        expected = _reference_metric(name, [a for a, _ in repeated], [r for _, r in repeated])
        value = float(item_metric(name, answer_values(answers), np.array(references), weights))
        if math.isnan(expected):
            assert math.isnan(value), name
        else:
            assert value == pytest.approx(expected, rel=1e-12, abs=1e-12), name


def test_undefined_metrics_are_none_and_unparsed_answers_count_as_wrong() -> None:
    references = np.array([1.0, 2.0, 3.0])
    constant = item_metrics(np.array([2.0, 2.0, 2.0]), references)
    assert constant["pearson"] is None and constant["mae"] == pytest.approx(2 / 3)
    nothing = item_metrics(answer_values([None, None, None]), references)
    assert nothing["mae"] is None and nothing["exact_accuracy"] == 0.0
    with pytest.raises(ValueError, match="metric must be one of"):
        item_metric("r2", references, references, np.ones(3))
    with pytest.raises(ValueError, match="share their last"):
        item_metric("mae", references, references[:2], np.ones(3))


def _brute_force(metric: str, arm: list[list[float]], base: list[list[float]],
                 references: list[float]) -> list[float]:  # fmt: skip
    """The difference of every equally likely (seed draw, item draw), with numeric_metrics."""
    seeds, items = len(arm), len(references)
    values = []
    for drawn_seeds in itertools.product(range(seeds), repeat=seeds):
        for drawn_items in itertools.product(range(items), repeat=items):
            truth = [references[i] for i in drawn_items]
            differences = [
                _reference_metric(metric, [arm[s][i] for i in drawn_items], truth)
                - _reference_metric(metric, [base[s][i] for i in drawn_items], truth)
                for s in drawn_seeds
            ]
            values.append(statistics.fmean(differences))
    return values


@pytest.mark.parametrize("metric", ["mae", "exact_accuracy", "rmse"])
def test_the_bootstrap_matches_the_enumeration_of_every_resample(metric: str) -> None:
    references = [3.0, 7.0, 10.0]
    arm = [[3.0, 8.0, 10.0], [4.0, 7.0, 13.0]]  # two seeds
    base = [[5.0, 7.0, 6.0], [3.0, 9.0, 10.0]]
    exact = _brute_force(metric, arm, base, references)
    resamples = draw_resamples(2, 3, replicates=40_000, seed=1)
    result = seed_item_difference(
        metric, np.array(arm), np.array(base), np.array(references), resamples
    )
    exact_sd = statistics.pstdev(exact)
    point = statistics.fmean(
        _reference_metric(metric, a, references) - _reference_metric(metric, b, references)
        for a, b in zip(arm, base, strict=True)
    )
    assert result["mean"] == pytest.approx(point, abs=1e-12)
    assert result["se"] == pytest.approx(exact_sd, rel=0.03)
    # The percentile interval's ends sit at the exact distribution's 2.5 and 97.5 % points.
    below_low = sum(v < result["low"] - 1e-12 for v in exact) / len(exact)
    up_to_high = sum(v <= result["high"] + 1e-12 for v in exact) / len(exact)
    assert below_low <= 0.025 + 0.01 and up_to_high >= 0.975 - 0.01
    assert result["mde"] == pytest.approx(MDE_FACTOR * result["se"])


def test_each_replicate_is_its_drawn_seeds_and_items() -> None:
    """Replicate by replicate, the vectorised difference equals numeric_metrics on the drawn
    items (the same items for both arms and every drawn seed) averaged over the drawn seeds."""
    rng = random.Random(7)
    references = [float(rng.randint(0, 30)) for _ in range(9)]
    arm = [_random_answers(rng, references) for _ in range(3)]
    base = [_random_answers(rng, references) for _ in range(3)]
    resamples = draw_resamples(3, 9, replicates=6, seed=3)
    arm_values = np.stack([answer_values(a) for a in arm])
    base_values = np.stack([answer_values(b) for b in base])
    _, differences = replicate_differences(
        "mae", arm_values, base_values, np.array(references), resamples
    )
    for b in range(6):
        drawn = [i for i, c in enumerate(resamples.item_counts[b]) for _ in range(int(c))]
        truth = [references[i] for i in drawn]
        expected = statistics.fmean(
            _reference_metric("mae", [arm[s][i] for i in drawn], truth)
            - _reference_metric("mae", [base[s][i] for i in drawn], truth)
            for s in resamples.seed_draws[b]
        )
        assert differences[b] == pytest.approx(expected, rel=1e-12)


def test_identical_arms_differ_by_nothing_and_a_shared_baseline_broadcasts() -> None:
    references = np.array([1.0, 2.0, 4.0, 8.0])
    arm = np.array([[1.0, 2.0, 5.0, 8.0], [2.0, 2.0, 4.0, 9.0]])
    resamples = draw_resamples(2, 4, replicates=500)
    same = seed_item_difference("rmse", arm, arm, references, resamples)
    assert same["mean"] == same["low"] == same["high"] == same["se"] == 0.0
    constant = np.full(4, 3.0)
    shared = seed_item_difference("mae", arm, constant, references, resamples)
    repeated = seed_item_difference("mae", arm, np.stack([constant] * 2), references, resamples)
    assert shared == repeated
    assert seed_item_difference("mae", arm, constant, references, resamples) == shared  # fixed


def test_a_metric_undefined_on_some_resamples_leaves_the_interval_undefined() -> None:
    references = np.array([1.0, 2.0, 3.0, 4.0])
    arm = np.array([[1.0, 2.0, 2.0, 4.0]])
    constant = np.full(4, 2.0)  # Pearson's r of a constant answer is undefined everywhere
    result = seed_item_difference("pearson", arm, constant, references, draw_resamples(1, 4))
    assert result["mean"] is None and result["low"] is None and result["undefined"] > 0


def test_the_test_sets_noise_is_in_the_interval() -> None:
    """With every seed alike, the interval is the items' alone; it does not shrink as seeds are
    added (the test set is shared), where a per-seed item resample would shrink it."""
    rng = np.random.default_rng(0)
    references = rng.integers(0, 10, 200).astype(np.float64)
    arm = references + rng.choice([0.0, 1.0, -2.0], 200)
    base = references + rng.choice([0.0, 1.0, 3.0], 200)
    widths = []
    for seeds in (1, 8):
        result = seed_item_difference(
            "mae", np.stack([arm] * seeds), np.stack([base] * seeds), references,
            draw_resamples(seeds, 200, replicates=2000, seed=5),
        )  # fmt: skip
        widths.append(result["high"] - result["low"])
    assert widths[1] == pytest.approx(widths[0], rel=1e-12)
    with pytest.raises(ValueError, match="seeds must be a positive int"):
        draw_resamples(0, 3)
    with pytest.raises(ValueError, match="expected answers for 1 or 2 seeds"):
        seed_item_difference("mae", np.ones((3, 4)), np.ones(4), np.ones(4), draw_resamples(2, 4))
