"""λ chosen on the validation split by a rule fixed before the runs: for each number-loss arm,
the λ of the grid whose mean over the seeds of the run's metric (of its readout) is best —
lowest for an error, highest for an accuracy or a correlation; a tie (means equal up to float
rounding) goes to the smaller λ. Only validation answers are read: the test split is scored once,
afterwards, for the chosen λ alone.

A λ whose metric is undefined on some seed (an error metric when no answer held a number) is
not averaged over the other seeds: it ranks below every λ defined on all of them (its mean is
None); when no λ is defined on every seed, the smallest λ is kept.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from numtok_compare.item_metrics import HIGHER_IS_BETTER

__all__ = ["WeightChoice", "arm_weights_flag", "choose_weights"]


@dataclass(frozen=True)
class WeightChoice:
    """One arm's choice: ``means`` maps each λ to its mean over the seeds of the metric (None:
    undefined on some seed)."""

    arm: str
    means: dict[float, float | None]
    chosen: float


def choose_weights(
    values: Mapping[str, Mapping[float, Sequence[float | None]]], *, metric: str
) -> list[WeightChoice]:
    """For each arm of ``values`` (``{arm: {λ: [the metric on each seed]}}``), the λ with the best
    mean of ``metric``; ties go to the smaller λ."""
    higher_is_better = metric in HIGHER_IS_BETTER
    choices = []
    for arm, by_weight in values.items():
        if not by_weight:
            raise ValueError(f"arm {arm!r} has no λ to choose from")
        means: dict[float, float | None] = {}
        for weight in sorted(by_weight):
            seeds = by_weight[weight]
            finite = [v for v in seeds if v is not None and math.isfinite(v)]
            means[weight] = (
                math.fsum(finite) / len(finite) if finite and len(finite) == len(seeds) else None
            )
        defined = {w: m for w, m in means.items() if m is not None}
        chosen = min(means)
        if defined:
            best = (max if higher_is_better else min)(defined.values())
            chosen = next(
                w for w, m in defined.items() if math.isclose(m, best, rel_tol=1e-9, abs_tol=1e-12)
            )
        choices.append(WeightChoice(arm=arm, means=means, chosen=chosen))
    return choices


def arm_weights_flag(choices: Sequence[WeightChoice]) -> str:
    """The ``--arm-weights`` value of ``choices``: ``"was=1,mse=0.3"``."""
    return ",".join(f"{choice.arm}={choice.chosen:g}" for choice in choices)
