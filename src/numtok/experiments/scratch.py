"""One arm of a comparison trained from scratch, whatever its task: the arm job (train with the
loop every comparison shares, score, store) and the arms' step timing.

A task supplies two things (:class:`ScratchTask`): how to build an arm for a seed (its model
initialised from the seed, its optimiser, and its training step over the seed's batches) and how
to score a trained model. The arithmetic task is :class:`numtok.experiments.train.ArithmeticTask`,
rJokes :class:`numtok.experiments.rjokes.train.RJokesTask`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from numtok.experiments.config import TrainingConfig
from numtok.experiments.loop import (
    Progress,
    Step,
    learning_rate_at,
    median_step_seconds,
    train_with_checkpoints,
)
from numtok.experiments.run_folder import arm_directory, finish_arm, read_result
from numtok.experiments.timing import interleaved_step_times

__all__ = ["Arm", "Scored", "ScratchTask", "step_times", "train_arm"]


@dataclass
class Arm:
    """An arm ready to train: ``step(index, learning_rate) -> (loss, ce, ntl)`` runs one
    optimiser step of ``model`` on the seed's batch ``index``; ``has_ce``/``has_ntl`` say which
    terms it logs."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    step: Step
    has_ce: bool
    has_ntl: bool


@dataclass
class Scored:
    """A trained arm's scores: ``result`` the task's entries of ``result.json`` (metrics,
    examples, ...), ``predictions`` what ``predictions.json`` keeps."""

    result: dict[str, Any]
    predictions: Any


class ScratchTask(Protocol):
    """What a task trained from scratch supplies to :func:`train_arm` and :func:`step_times`."""

    @property
    def config(self) -> TrainingConfig: ...

    @property
    def scored_items(self) -> int:
        """How many items scoring an arm reports to the progress bar."""
        ...

    def build(self, seed: int, arm: str) -> Arm:
        """The arm on ``config.device``, its weights initialised from ``seed`` (the same for every
        arm of a seed)."""
        ...

    def score(self, arm: str, model: nn.Module, progress: Progress) -> Scored: ...


def _silent(_amount: int) -> None:
    return None


def train_arm(
    task: ScratchTask, seed: int, arm: str, run_dir: Path, progress: Progress | None = None
) -> dict[str, Any]:
    """Train and score one arm for one seed; returns (and writes) its result. A finished arm's
    ``result.json`` is read back; an interrupted one resumes from its checkpoint.

    Returns:
        ``{"seed", "arm", "history": [{"step", "loss", "ce", "ntl"}], **the task's scores,
        "median_step_seconds", "train_seconds", "eval_seconds"}``.
    """
    config = task.config
    directory = arm_directory(run_dir, seed, arm)
    stored = read_result(directory)
    if stored is not None:
        if progress is not None:
            progress(config.steps + task.scored_items)
        return stored
    if torch.device(config.device).type == "cpu":
        torch.set_num_threads(config.threads)
    built = task.build(seed, arm)
    log = train_with_checkpoints(
        built.model,
        built.optimizer,
        built.step,
        config,
        directory,
        has_ce=built.has_ce,
        has_ntl=built.has_ntl,
        progress=progress,
    )
    eval_started = time.perf_counter()
    scored = task.score(arm, built.model, progress or _silent)
    result = {
        "seed": seed,
        "arm": arm,
        "history": log.history,
        **scored.result,
        "median_step_seconds": median_step_seconds(log),
        "train_seconds": float(sum(log.step_seconds)),
        "eval_seconds": time.perf_counter() - eval_started,
    }
    return finish_arm(directory, result, scored.predictions)


def step_times(task: ScratchTask, *, rounds: int) -> dict[str, Any]:
    """:func:`~numtok.experiments.timing.interleaved_step_times` for every arm, on the first
    seed's initial weights and batches."""
    config = task.config
    if torch.device(config.device).type == "cpu":
        torch.set_num_threads(config.threads)
    seed = config.seeds[0]
    return interleaved_step_times(
        {arm: task.build(seed, arm).step for arm in config.arms},
        learning_rate=lambda index: learning_rate_at(index, config),
        batch_size=config.batch_size,
        device=config.device,
        threads=config.threads,
        rounds=rounds,
    )
