"""The draws per item the test splits read, chosen on validation (``--readout-samples auto``, the
``--data`` default): precision spent where the statistics can use it, at no more than the
training's cost.

Validation draws ``N0 = config.readout_samples`` numbers per item. Each comparison of the
``expected`` readout (every arm's against CE's, and against the regression head where one runs)
by the run's metric then says, on validation, how many draws would leave the draws a tenth of
its variance (:func:`numtok_compare.analysis.draws_of_difference`: the draws' part falls as
``1/N``, the rest stays); the most of these is what the test splits need. What they can afford
is what keeps the run's scoring within its training: the validation's own minutes say what
scoring costs, the token arms' in proportion to the draws (an upper bound: draws that share a
prefix share its forward) and the regression head's not at all, so

    affordable = N0 · (training − validation scoring − the head's test scoring)
                 / (the token arms' validation scoring · test items / validation items).

The test splits draw ``max(N0, min(needed, affordable))`` per item, each count rounded to a
doubling of ``N0`` (``needed`` up, ``affordable`` down): never fewer than validation, never more
than they need, and a count that the small differences of the minutes between two machines
rarely change (the count and why are recorded in the rows; at any count the expected answer is
unbiased, so a count only sets the test's noise). A comparison whose draws are all of its measured
variance needs more than any count (None: it asks for the affordable one); one whose draws'
share is not known asks for nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from numtok_compare.analysis import Draws, draws_of_difference
from numtok_compare.finetune.config import FinetuneConfig
from numtok_compare.finetune.data import FinetuneData
from numtok_compare.item_metrics import answer_values, per_item_metric
from numtok_compare.runner.phases import Job
from numtok_compare.stats import constant_answers

__all__ = ["draws_for_test_splits"]


def _needed(
    config: FinetuneConfig, samples: int, chosen: Mapping[Job, dict[str, Any]], data: FinetuneData
) -> dict[str, int | None]:
    """Each comparison of the expected readout on validation, ``"was − ce"``: the draws per item
    it needs (None: more than any count) at ``samples`` drawn there; one whose draws' share is
    not known is left out."""
    by_arm = _by_arm(chosen)
    answers = {
        arm: {readout: np.stack([answer_values(s["answers"][readout]) for s in stored])
              for readout in stored[0]["answers"]}
        for arm, stored in by_arm.items()
    }  # fmt: skip
    errors = {
        arm: {"expected": np.stack([answer_values(s["standard_errors"]["expected"])
                                    for s in stored])}
        for arm, stored in by_arm.items() if "standard_errors" in stored[0]
    }  # fmt: skip
    draws = Draws(errors, samples)
    references = answer_values([e.value for e in data.splits["validation"]])
    unparsed = constant_answers([e.value for e in data.splits["train"]])["median"]
    pairs = [(arm, ("ce", "expected")) for arm in answers if arm not in ("ce", "head")]
    if "head" in answers:  # the paper's claim: a token arm's expected value against the head
        pairs += [(arm, ("head", "head")) for arm in answers if arm not in ("head", "base")]
    needed: dict[str, int | None] = {}
    for arm, baseline in pairs:
        entry = draws_of_difference(
            (arm, "expected"), baseline, answers, references, len(config.seeds),
            per_item_metric(config.metric), unparsed, draws,
        )  # fmt: skip
        if entry["draws_share"] is not None:
            needed[f"{arm} − {baseline[0]}"] = entry["draws_needed"]
    return needed


def _by_arm(chosen: Mapping[Job, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    by_arm: dict[str, list[dict[str, Any]]] = {}
    for job, stored in chosen.items():
        by_arm.setdefault(job.arm, []).append(stored)
    return by_arm


def _affordable(
    config: FinetuneConfig,
    samples: int,
    validation: Mapping[Job, dict[str, Any]],
    chosen: Mapping[Job, dict[str, Any]],
    data: FinetuneData,
) -> int:
    """The most draws per item the test splits can read with the run's scoring within its
    training (module docstring); 0 where even the validation's count would not fit."""
    training = sum(stored["train_minutes"] for stored in validation.values())
    scoring = sum(stored["score_minutes"] for stored in validation.values())
    ratio = sum(len(data.splits[split]) for split in config.evaluation_splits) / len(
        data.splits["validation"]
    )
    head = sum(s["score_minutes"] for job, s in chosen.items() if job.arm == "head") * ratio
    tokens = sum(s["score_minutes"] for job, s in chosen.items() if job.arm != "head") * ratio
    budget = training - scoring - head
    if tokens <= 0:
        return 0
    return max(0, math.floor(samples * float(budget) / float(tokens)))


def _doubling(samples: int, count: int, *, up: bool) -> int:
    """The doubling ``samples · 2^k`` (k ≥ 0) nearest ``count`` from above (``up``) or from
    below; ``samples`` where ``count`` is at most that."""
    doubled = samples
    while doubled * 2 <= count or (up and doubled < count):
        doubled *= 2
    return doubled


def draws_for_test_splits(
    config: FinetuneConfig,
    validation: Mapping[Job, dict[str, Any]],
    weights: Mapping[str, float],
    data: FinetuneData,
) -> dict[str, Any] | None:
    """The test splits' draws per item, chosen on the ``validation`` answers of each arm at its
    chosen λ (``weights``) by the module docstring's rule: ``{"validation": N0, "test": N,
    "needed": {"was − ce": count, ...}, "affordable": count}`` (``needed``: :func:`_needed`'s);
    None where the run does not choose (``config.choose_test_samples`` unset, or no
    distribution readouts)."""
    if not config.choose_test_samples or config.readout_samples is None:
        return None
    if config.max_value is None:
        return None
    chosen = {job: stored for job, stored in validation.items() if job.weight == weights[job.arm]}
    samples = config.readout_samples
    needed = _needed(config, samples, chosen, data)
    affordable = _affordable(config, samples, validation, chosen, data)
    wanted = max((affordable if c is None else c for c in needed.values()), default=0)
    test = min(_doubling(samples, wanted, up=True), _doubling(samples, affordable, up=False))
    return {
        "validation": samples,
        "test": max(samples, test),
        "needed": needed,
        "affordable": affordable,
    }
