"""λ chosen on the validation split by the rule fixed before the runs (docs/smollm2.md): for each
number-loss arm, among validation run folders that differ only in ``ntl_weight``, the λ whose
mean over the seeds of one metric of one readout is best (lowest for an error, highest for a
correlation); a tie (means equal up to float rounding) goes to the smaller λ.

Every folder must have been scored on the validation split, with the same seeds, and every arm
chosen for must have a value for every seed in every folder: a λ with missing seeds is an error,
not a smaller sample.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["WeightChoice", "arm_weights_flag", "choose_weights", "read_validation_runs"]

#: Metrics where a larger value is better; every other metric is an error (smaller is better).
_HIGHER_IS_BETTER = frozenset({"exact_accuracy", "within_1_percent", "pearson", "r"})


@dataclass(frozen=True)
class WeightChoice:
    """One arm's choice: ``means`` maps each λ to its mean over ``seeds`` of the metric."""

    arm: str
    means: dict[float, float]
    chosen: float


def read_validation_runs(folder: Path) -> dict[str, Any]:
    """``results.json`` of a run folder scored on the validation split (``--evaluate-on
    validation``); a ``ValueError`` names the folder otherwise."""
    path = Path(folder) / "results.json"
    if not path.is_file():
        raise ValueError(f"{folder}: no results.json (is the run finished?)")
    results: dict[str, Any] = json.loads(path.read_text())
    evaluated = results.get("config", {}).get("evaluate_on")
    if evaluated != "validation":
        raise ValueError(
            f"{folder}: λ is chosen on validation runs (--evaluate-on validation), but this folder "
            f"was scored on {evaluated!r}"
        )
    return results


def _metric(run: dict[str, Any], readout: str, metric: str) -> float:
    value = run["metrics"].get("validation", {}).get(readout, {}).get(metric)
    if not isinstance(value, int | float) or math.isnan(value):
        raise ValueError(
            f"seed {run['seed']} of arm {run['arm']!r} has no validation {readout} {metric} "
            f"(got {value!r})"
        )
    return float(value)


def _weight_of(config: dict[str, Any], arm: str) -> float:
    """λ of ``arm`` in a run's config: its ``arm_weights`` entry, else ``ntl_weight``."""
    weights = {name: weight for name, weight in config.get("arm_weights", [])}
    return float(weights.get(arm, config["ntl_weight"]))


def choose_weights(
    results: Sequence[dict[str, Any]], arms: Sequence[str], *, metric: str, readout: str = "greedy"
) -> list[WeightChoice]:
    """For each of ``arms``, the λ among ``results`` (one ``results.json`` per λ: its
    ``config.ntl_weight``, or the arm's entry in ``config.arm_weights``) with the best mean of
    ``metric`` of ``readout`` over the seeds; ties go to the smaller λ."""
    if not results:
        raise ValueError("choose_weights needs at least one validation run folder, got none")
    seeds = sorted(results[0]["config"]["seeds"])
    higher_is_better = metric in _HIGHER_IS_BETTER
    choices = []
    for arm in arms:
        means: dict[float, float] = {}
        for result in results:
            config = result["config"]
            if sorted(config["seeds"]) != seeds:
                raise ValueError(
                    f"the validation folders must share their seeds: {seeds} and {config['seeds']}"
                )
            weight = _weight_of(config, arm)
            if weight in means:
                raise ValueError(f"two validation folders give arm {arm!r} the same λ = {weight:g}")
            by_seed = {run["seed"]: run for run in result["runs"] if run["arm"] == arm}
            missing = [seed for seed in seeds if seed not in by_seed]
            if missing:
                raise ValueError(
                    f"arm {arm!r} at λ = {weight:g} has no finished run for seeds {missing}: "
                    "finish the folder before choosing"
                )
            values = [_metric(by_seed[seed], readout, metric) for seed in seeds]
            means[weight] = sum(values) / len(values)
        # A tie (means equal up to float rounding, 1e-9) goes to the smaller λ.
        ordered = sorted(means)
        best = (max if higher_is_better else min)(means.values())
        chosen = next(
            w for w in ordered if math.isclose(means[w], best, rel_tol=1e-9, abs_tol=1e-12)
        )
        choices.append(WeightChoice(arm=arm, means={w: means[w] for w in ordered}, chosen=chosen))
    return choices


def arm_weights_flag(choices: Sequence[WeightChoice]) -> str:
    """The ``--arm-weights`` value of ``choices``: ``"was=1,mse=0.3"``."""
    return ",".join(f"{choice.arm}={choice.chosen:g}" for choice in choices)
