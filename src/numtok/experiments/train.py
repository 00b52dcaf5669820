"""Training one arm of the arithmetic comparison for one seed, and evaluating it.

Everything that varies from step to step is a function of (seed, step): the initial weights come
from ``torch.manual_seed(seed)``, the batch of step ``s`` from :class:`~.batches.TrainingSet`, and
the learning rate from the step number. There is no dropout. So every arm of a seed starts from
the same weights and sees the same batches, and :func:`~.loop.train_with_checkpoints` resumes an
interrupted arm exactly.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from numtok.experiments.batches import PackedBatch, TrainingSet
from numtok.experiments.config import ExperimentConfig
from numtok.experiments.evaluate import evaluate
from numtok.experiments.loop import (
    Progress,
    median_step_seconds,
    optimizer_step,
    train_with_checkpoints,
)
from numtok.experiments.model import Transformer
from numtok.experiments.objectives import Objective
from numtok.experiments.run_folder import arm_directory, finish_arm, read_result
from numtok.experiments.tasks.mathematics import MathData
from numtok.experiments.tokenizer import CharTokenizer

__all__ = ["build_arm", "train_arm", "train_step"]


def build_arm(
    config: ExperimentConfig, seed: int, arm: str, tokenizer: CharTokenizer
) -> tuple[Transformer, torch.optim.Optimizer, Objective]:
    """The model (initialised from ``seed``, the same for every arm), its optimiser, and the arm's
    loss, on ``config.device``."""
    device = torch.device(config.device)
    torch.manual_seed(seed)
    model = Transformer(config.model_config(len(tokenizer))).to(device)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay
    )
    objective = Objective(arm, tokenizer.number_vocab(), ntl_weight=config.weight_of(arm)).to(
        device
    )
    return model, optimizer, objective


def train_step(
    model: Transformer,
    optimizer: torch.optim.Optimizer,
    objective: Objective,
    batch: PackedBatch,
    config: ExperimentConfig,
    learning_rate: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One optimiser step on the arm's loss (CE is the mean over answer tokens, NTL the mean over
    answer digits). Returns (loss, CE, NTL or None), after the device has finished the step."""
    logits = model(batch.inputs, positions=batch.positions, allowed=batch.allowed)  # (R, C, V)
    loss, ce, ntl = objective(logits, batch.labels)
    optimizer_step(model, optimizer, loss, config, learning_rate)
    return loss, ce, ntl


def train_arm(
    config: ExperimentConfig,
    seed: int,
    arm: str,
    data: MathData,
    run_dir: Path,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Train and evaluate one arm for one seed; returns (and writes) its result.

    A finished arm's ``result.json`` is read back instead of training again; an interrupted arm
    resumes from its ``checkpoint.pt``.

    Returns:
        ``{"seed", "arm", "history": [{"step", "loss", "ce", "ntl"}], "metrics": {split: {...}},
        "median_step_seconds", "train_seconds", "eval_seconds", "examples": {split: [...]}}``.
    """
    directory = arm_directory(run_dir, seed, arm)
    stored = read_result(directory)
    if stored is not None:
        if progress is not None:
            progress(config.steps)
        return stored
    device = torch.device(config.device)
    if device.type == "cpu":
        torch.set_num_threads(config.threads)

    tokenizer = CharTokenizer()
    model, optimizer, objective = build_arm(config, seed, arm, tokenizer)
    training = TrainingSet(data.train, tokenizer)

    def step(index: int, learning_rate: float) -> Any:
        batch = training.batch(seed, index, config.batch_size).to(device)
        return train_step(model, optimizer, objective, batch, config, learning_rate)

    log = train_with_checkpoints(
        model,
        optimizer,
        step,
        config,
        directory,
        has_ntl=objective.ntl is not None,
        progress=progress,
    )
    eval_started = time.perf_counter()
    evaluation = evaluate(
        model, tokenizer, data.evaluation, batch_size=config.eval_batch_size, device=device
    )
    result = {
        "seed": seed,
        "arm": arm,
        "history": log.history,
        "metrics": evaluation.metrics,
        "examples": evaluation.examples,
        "median_step_seconds": median_step_seconds(log),
        "train_seconds": float(sum(log.step_seconds)),
        "eval_seconds": time.perf_counter() - eval_started,
    }
    return finish_arm(directory, result, evaluation.predictions)
