"""What every comparison trained from scratch shares, whatever its task
(:class:`ScratchComparison`, run by :func:`numtok_compare.comparison.run_comparison`): each
(seed, arm) in ``seed<N>/<arm>`` at its one λ (nothing to choose), trained and scored on
validation, then on the test splits, and the report's rows from what the task says of its run
(:class:`RunDescription`: the design, the data, the true answers) and the model's size.

A task supplies, for one seed, its :class:`~numtok_compare.runner.phases.Models` (the arm built
for the seed, rebuilt once trained, scored on a split). The arithmetic task is
:class:`numtok_compare.scratch.arithmetic.ArithmeticTask` and
:class:`numtok_compare.scratch.arithmetic.ArithmeticRun`; rJokes
:class:`numtok_compare.scratch.rjokes.RJokesTask` and
:class:`numtok_compare.scratch.rjokes.RJokesRun`.
"""

from __future__ import annotations

import statistics
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from transformers import LlamaForCausalLM

from numtok_compare.design import Design
from numtok_compare.runner.phases import Job, Phases
from numtok_compare.runner.run_folder import arm_directory
from numtok_compare.scratch.arm import llama_config
from numtok_compare.scratch.config import TrainingConfig
from numtok_compare.stats import constant_answers

__all__ = ["RunDescription", "ScratchComparison", "jobs_of", "step_costs"]

_Comparison = TypeVar("_Comparison", bound="ScratchComparison")


def step_costs(phases: Phases) -> str:
    """Each arm's training step against CE's, the medians over its seeds of each run's median
    step time, in the report's words: ``"was 1.01× CE's, mse 0.98× CE's"``, or ``"CE alone"``
    (runs in parallel worker processes share the machine: the ratios are rough)."""
    seconds: dict[str, list[float]] = {}
    for job, stored in phases.validation.items():
        seconds.setdefault(job.arm, []).append(stored["seconds_per_step"])
    medians = {arm: statistics.median(values) for arm, values in seconds.items()}
    costs = [f"{arm} {median / medians['ce']:.2f}× CE's" for arm, median in medians.items()
             if arm != "ce" and "ce" in medians]  # fmt: skip
    return ", ".join(costs) or "CE alone"


def jobs_of(config: TrainingConfig, arms: tuple[str, ...] | None = None) -> list[Job]:
    """Every seed's arm at its λ, arm by arm in the order of ``arms`` (default: the config's),
    each arm's seeds together."""
    return [Job(seed, arm, config.weight_of(arm)) for arm in arms or config.arms
            for seed in config.seeds]  # fmt: skip


@dataclass
class RunDescription:
    """What a task says of its run for the report: ``design`` (what was trained, in the report's
    words, and what it compares), ``data`` (what the report records of the data),
    ``training_answers`` (whose mean, median and mode are the constant answers every arm must
    beat) and ``references`` (each scored split's true answers: one list when every seed answers
    the same items, one list per seed when each seed drew its own)."""

    design: Design
    data: dict[str, Any]
    training_answers: list[float]
    references: dict[str, Any]


class ScratchComparison(ABC):
    """The part of a :class:`~numtok_compare.comparison.Comparison` every task trained from
    scratch shares; a task adds ``config``, ``jobs``, ``prepare`` and ``models``, and the
    abstract methods here."""

    config: TrainingConfig

    @abstractmethod
    def scored_items(self) -> dict[str, int]:
        """The items of ``validation`` and of each test split (0: the bar counts none)."""

    @abstractmethod
    def tokenizer(self) -> Any:
        """The models' tokenizer (the report counts the parameters of a model over it)."""

    @abstractmethod
    def description(self, phases: Phases, parameters: int) -> RunDescription:
        """What the report says of the finished run: ``phases``, every arm's stored results;
        ``parameters``, the model's."""

    def directory(self, run_dir: Path, job: Job) -> Path:
        return arm_directory(run_dir, job.seed, job.arm)

    def steps(self, job: Job) -> int:
        return self.config.steps

    @property
    def test_splits(self) -> tuple[str, ...]:
        return tuple(split for split in self.scored_items() if split != "validation")

    def choose(self, validation: Mapping[Job, dict[str, Any]]) -> dict[str, Any]:
        """Every arm at its one λ: nothing to choose."""
        return {"chosen": {arm: self.config.weight_of(arm) for arm in self.config.arms},
                "means": {}}  # fmt: skip

    def tested(self: _Comparison, choice: Mapping[str, Any]) -> _Comparison:
        """The test splits are scored as validation was."""
        return self

    def rows(self, phases: Phases) -> dict[str, Any]:
        parameters = LlamaForCausalLM(llama_config(self.config, self.tokenizer())).num_parameters()
        description = self.description(phases, parameters)
        return {
            "model_parameters": parameters,
            "design": description.design.to_dict(),
            "data": description.data,
            "training_constants": constant_answers(description.training_answers),
            "references": description.references,
        }
