"""The rule that chooses λ on validation (numtok_compare.finetune.choose): the best mean over
seeds, by the metric's direction, ties to the smaller λ, and a λ undefined on a seed ranked
last."""

from __future__ import annotations

import pytest

from numtok_compare.finetune.choose import arm_weights_flag, choose_weights

SWEEP = {
    "was": {0.3: [0.30, 0.20, 0.25], 1.0: [0.10, 0.30, 0.20], 3.0: [0.5, 0.5, 0.5]},
    "del": {0.3: [0.5, 0.6, 0.7], 1.0: [0.4, 0.4, 0.4], 3.0: [0.9, 0.9, 0.9]},
}


def test_the_lowest_mean_error_wins_and_ties_go_to_the_smaller_weight() -> None:
    was, del_ = choose_weights(SWEEP, metric="log_mae")
    assert (was.chosen, del_.chosen) == (1.0, 1.0)
    assert was.means[0.3] == pytest.approx(0.25) and was.means[1.0] == pytest.approx(0.2)
    tied = {"was": {3.0: [0.2, 0.2], 0.3: [0.1, 0.3], 1.0: [0.3, 0.1]}}
    assert choose_weights(tied, metric="mae")[0].chosen == 0.3
    assert arm_weights_flag(choose_weights(SWEEP, metric="log_mae")) == "was=1,del=1"


def test_a_higher_is_better_metric_takes_the_highest_mean() -> None:
    was, del_ = choose_weights(SWEEP, metric="exact_accuracy")
    assert (was.chosen, del_.chosen) == (3.0, 3.0)


def test_a_weight_undefined_on_a_seed_ranks_last() -> None:
    """An arm that answered no number on one seed has no error there: its λ is not averaged over
    the other seeds (which would flatter it), it loses to every complete λ."""
    values = {"was": {0.3: [0.9, 0.9], 1.0: [0.01, None], 3.0: [0.5, float("nan")]}}
    (choice,) = choose_weights(values, metric="mae")
    assert choice.chosen == 0.3 and choice.means[1.0] is None and choice.means[3.0] is None
    nothing = {"was": {1.0: [None, 0.2], 0.3: [None, None]}}
    assert choose_weights(nothing, metric="mae")[0].chosen == 0.3  # the smallest λ
    with pytest.raises(ValueError, match="arm 'was' has no λ"):
        choose_weights({"was": {}}, metric="mae")
