"""A fine-tuning run's rows, as the one report writer reads them
(:mod:`numtok_compare.report`): every seed's answer to every item of every scored split,
the λ chosen on validation with each λ's parsed share, the training answers' constants, and
the run's :class:`~numtok_compare.design.Design`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from numtok_compare.design import Design
from numtok_compare.finetune.config import FinetuneConfig
from numtok_compare.finetune.data import FinetuneData
from numtok_compare.item_metrics import answer_values
from numtok_compare.objectives import NUMBER_LOSS_ARMS
from numtok_compare.runner.phases import Job, Phases
from numtok_compare.stats import constant_answers

__all__ = ["design_of", "run_rows", "upgrade_rows"]


def design_of(config: FinetuneConfig, notes: Sequence[str], chosen: Mapping[str, float]) -> Design:
    """What a fine-tuning run compared (``notes``: the data's; ``chosen``: each arm's λ)."""
    weights = ", ".join(f"{arm} {w:g}" for arm, w in chosen.items() if arm in NUMBER_LOSS_ARMS)
    trained = (
        f"{config.adaptation} fine-tuning, {config.steps} steps × {config.batch_size} examples, "
        f"learning rate {config.learning_rate:g}; λ: {weights or 'none'}. Data: "
        + "; ".join(notes or ["generated"])
        + "."
    )
    return Design(
        title=f"Fine-tuning {config.model} on {config.task}",
        trained=trained,
        seeds=config.seeds,
        arms=config.arms,
        splits=config.evaluation_splits,
        metric=config.metric,
        readout=config.readout,
        max_value=config.max_value,
        margin=config.margin,
        margin_baseline=config.equivalence_baseline,
    )


def run_rows(config: FinetuneConfig, data: FinetuneData, phases: Phases) -> dict[str, Any]:
    """What the report reads of a fine-tuning run besides the stored answers
    (:class:`~numtok_compare.comparison.Comparison`'s ``rows``): the design, the data's notes,
    digest and sizes, the training answers' constants, every scored split's true answers, the
    choice of λ with each λ's parsed share, the most probability a readout left unexplored, and
    where the readouts drew their numbers, their standard errors' mean, largest and mean square
    (``sampling_error``)."""
    splits = ("validation", *(config.evaluation_splits if phases.test else ()))
    unexplored = [u for scored in phases.scorings() for u in scored.get("unexplored", [])]
    errors = [error for scored in phases.scorings()
              for error in scored.get("standard_errors", {}).get("expected", [])
              if error is not None]  # fmt: skip
    choice = phases.choice | {"parsed": _parsed_by_weight(config, phases.validation, phases.choice)}
    return {
        "design": design_of(config, data.notes, phases.choice["chosen"]).to_dict(),
        "data": {"notes": data.notes, "digest": data.digest,
                 "sizes": {s: len(e) for s, e in data.splits.items()}},
        "training_constants": constant_answers([e.value for e in data.splits["train"]]),
        "references": {split: answer_values([e.value for e in data.splits[split]])
                       for split in splits},
        "choice": choice,
        "largest_unexplored": max(unexplored) if unexplored else None,
        **({"sampling_error": {"mean": float(np.mean(errors)), "largest": max(errors),
                               "mean_square": float(np.mean(np.square(errors)))}}
           if errors else {}),
    }  # fmt: skip


def upgrade_rows(rows: dict[str, Any]) -> dict[str, Any]:
    """Fine-tuning rows written before the rows held their design and the training answers'
    constants, with those added from their config and scored constants (newer rows: as they
    are); for ``numtok compare --reanalyse``."""
    if "design" not in rows:
        config = FinetuneConfig.from_dict(rows["config"])
        rows["design"] = design_of(
            config, rows["data"]["notes"], rows["choice"]["chosen"]
        ).to_dict()
    if "training_constants" not in rows:
        scored = rows["constants"]["validation"]
        rows["training_constants"] = {name: entry["value"] for name, entry in scored.items()}
    return rows


def _parsed_by_weight(
    config: FinetuneConfig,
    validation: Mapping[Job, dict[str, Any]],
    choice: dict[str, Any],
) -> dict[str, dict[str, float | None]]:
    """``parsed[arm][λ]``: the mean share of parsed answers of the run's readout over the seeds,
    for each arm and λ of the grid's choice."""

    def parsed(arm: str, weight: float) -> float | None:
        stored = [validation[Job(seed, arm, weight)]["answers"].get(config.readout)
                  for seed in config.seeds]  # fmt: skip
        if any(answers is None for answers in stored):
            return None
        return float(np.mean([(~np.isnan(answer_values(a))).mean() for a in stored]))

    return {arm: {f"{w:g}": parsed(arm, w) for w in config.weight_grid} for arm in choice["means"]}
