"""Training one arm for one seed, with checkpoints that make an interrupted run resume exactly.

Everything that varies from step to step is a function of (seed, step): the initial weights come
from ``torch.manual_seed(seed)``, the batch of step ``s`` from :class:`~.batches.TrainingSet`, and
the learning rate from the step number. There is no dropout. So every arm of a
seed starts from the same weights and sees the same batches, and a run resumed from a checkpoint
(weights, optimiser moments, the logged history) continues bit for bit as if never stopped, as
long as it runs on the same device with the same thread count.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from numtok.experiments.batches import PackedBatch, TrainingSet
from numtok.experiments.config import ExperimentConfig
from numtok.experiments.data import MathData
from numtok.experiments.evaluate import evaluate
from numtok.experiments.model import Transformer
from numtok.experiments.objectives import Objective
from numtok.experiments.tokenizer import CharTokenizer

__all__ = [
    "arm_directory",
    "build_arm",
    "learning_rate_at",
    "train_arm",
    "train_step",
]

#: ``progress(steps_done_since_last_call)``.
Progress = Callable[[int], None]

_RESULT, _CHECKPOINT, _WEIGHTS = "result.json", "checkpoint.pt", "model.pt"
# Step times of the first steps include one-off allocations; the median skips them.
_TIMING_WARMUP_STEPS = 5


def learning_rate_at(step: int, config: ExperimentConfig) -> float:
    """Linear warm-up over ``warmup_steps``, then cosine decay to zero at ``steps``."""
    if step < config.warmup_steps:
        return config.learning_rate * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.learning_rate * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


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
    objective = Objective(arm, tokenizer.number_vocab(), ntl_weight=config.ntl_weight).to(device)
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
    for group in optimizer.param_groups:
        group["lr"] = learning_rate
    logits = model(batch.inputs, positions=batch.positions, allowed=batch.allowed)  # (R, C, V)
    loss, ce, ntl = objective(logits, batch.labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    optimizer.step()
    if batch.inputs.device.type == "cuda":
        torch.cuda.synchronize(batch.inputs.device)
    return loss, ce, ntl


def arm_directory(run_dir: Path, seed: int, arm: str) -> Path:
    return Path(run_dir) / f"seed{seed}" / arm


def _save_atomically(obj: Any, path: Path) -> None:
    """Write to a temporary file, then rename: a killed process leaves the old file or the new
    one, never half of one."""
    temporary = path.with_name(f"{path.name}.tmp{os.getpid()}")
    if path.suffix == ".json":
        temporary.write_text(json.dumps(obj, indent=1))
    else:
        torch.save(obj, temporary)
    os.replace(temporary, path)


@dataclass
class _Interval:
    """Sums of the losses since the last log entry, in float64 on the CPU (saved in checkpoints,
    so that a resumed run logs the same averages)."""

    steps: int
    loss: torch.Tensor
    ce: torch.Tensor
    ntl: torch.Tensor

    @classmethod
    def empty(cls) -> _Interval:
        zero = torch.zeros((), dtype=torch.float64)
        return cls(0, zero, zero.clone(), zero.clone())

    def add(self, loss: torch.Tensor, ce: torch.Tensor, ntl: torch.Tensor | None) -> None:
        self.steps += 1
        self.loss = self.loss + loss.detach().cpu().double()
        self.ce = self.ce + ce.detach().cpu().double()
        if ntl is not None:
            self.ntl = self.ntl + ntl.detach().cpu().double()

    def entry(self, step: int, has_ntl: bool) -> dict[str, Any]:
        return {
            "step": step,
            "loss": float(self.loss) / self.steps,
            "ce": float(self.ce) / self.steps,
            "ntl": float(self.ntl) / self.steps if has_ntl else None,
        }


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
    result_path = directory / _RESULT
    if result_path.exists():
        stored: dict[str, Any] = json.loads(result_path.read_text())
        if progress is not None:
            progress(config.steps)
        return stored
    directory.mkdir(parents=True, exist_ok=True)
    device = torch.device(config.device)
    if device.type == "cpu":
        torch.set_num_threads(config.threads)

    tokenizer = CharTokenizer()
    model, optimizer, objective = build_arm(config, seed, arm, tokenizer)
    training = TrainingSet(data.train, tokenizer)

    start_step, history, step_seconds = 0, [], []
    interval = _Interval.empty()
    checkpoint_path = directory / _CHECKPOINT
    if checkpoint_path.exists():
        state = torch.load(checkpoint_path, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_step, history, step_seconds = state["step"], state["history"], state["step_seconds"]
        interval = _Interval(**state["interval"])
        if progress is not None:
            progress(start_step)

    model.train()
    for step in range(start_step, config.steps):
        started = time.perf_counter()
        batch = training.batch(seed, step, config.batch_size).to(device)
        loss, ce, ntl_value = train_step(
            model, optimizer, objective, batch, config, learning_rate_at(step, config)
        )
        interval.add(loss, ce, ntl_value)
        step_seconds.append(time.perf_counter() - started)

        done = step + 1
        if done % config.log_every == 0 or done == config.steps:
            history.append(interval.entry(done, objective.ntl is not None))
            interval = _Interval.empty()
        if done % config.checkpoint_every == 0 and done < config.steps:
            _save_atomically(
                {
                    "step": done,
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "history": history,
                    "step_seconds": step_seconds,
                    "interval": vars(interval),
                },
                checkpoint_path,
            )
        if progress is not None:
            progress(1)

    eval_started = time.perf_counter()
    evaluation = evaluate(
        model, tokenizer, data.evaluation, batch_size=config.eval_batch_size, device=device
    )
    timed = step_seconds[_TIMING_WARMUP_STEPS:] or step_seconds
    result = {
        "seed": seed,
        "arm": arm,
        "history": history,
        "metrics": evaluation.metrics,
        "examples": evaluation.examples,
        "median_step_seconds": float(np.median(timed)),
        "train_seconds": float(sum(step_seconds)),
        "eval_seconds": time.perf_counter() - eval_started,
    }
    _save_atomically(model.state_dict(), directory / _WEIGHTS)
    _save_atomically(evaluation.predictions, directory / "predictions.json")
    _save_atomically(result, result_path)
    checkpoint_path.unlink(missing_ok=True)
    # Return what a later call reads back from disk (JSON: tuples become lists).
    finished: dict[str, Any] = json.loads(result_path.read_text())
    return finished
