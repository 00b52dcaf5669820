"""The training loop every task shares: the learning-rate schedule, one optimiser update, logged
loss averages, and checkpoints that make an interrupted run resume exactly.

A task supplies ``step(step_index, learning_rate) -> (loss, ce, ntl)``, which fetches that step's
batch, computes the arm's loss and calls :func:`optimizer_step`. Everything that varies from step
to step must be a function of (seed, step): then a run resumed from a checkpoint (weights,
optimiser moments, the logged history) continues bit for bit as if never stopped, as long as it
runs on the same device with the same thread count.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from numtok_compare.config import RunConfig
from numtok_compare.runner.run_folder import (
    CHECKPOINT,
    WEIGHTS,
    load_trainable_state,
    save_atomically,
    trainable_state,
)
from numtok_compare.runner.training_log import Progress, TrainingLog

__all__ = [
    "Schedule",
    "learning_rate_at",
    "optimizer_step",
    "train_with_checkpoints",
]

#: ``step(step_index, learning_rate) -> (loss, ce, ntl)``, after the update; ``ce`` (the token
#: cross-entropy) and ``ntl`` are None for arms that do not compute them.
Step = Callable[[int, float], tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]]


class Schedule(Protocol):
    """The settings :func:`learning_rate_at` and :func:`optimizer_step` read (every task's
    config has them)."""

    @property
    def learning_rate(self) -> float: ...
    @property
    def warmup_steps(self) -> int: ...
    @property
    def steps(self) -> int: ...
    @property
    def grad_clip(self) -> float: ...


def learning_rate_at(step: int, config: Schedule) -> float:
    """Linear warm-up over ``warmup_steps``, then cosine decay to zero at ``steps``."""
    if step < config.warmup_steps:
        return config.learning_rate * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.learning_rate * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def optimizer_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss: torch.Tensor,
    config: Schedule,
    learning_rate: float,
) -> None:
    """Backward, clip the gradient norm to ``config.grad_clip``, update; returns after the device
    has finished (so that step times are real). A parameter group with an ``lr_scale`` entry
    takes ``learning_rate`` times it (a head with a learning rate of its own)."""
    for group in optimizer.param_groups:
        group["lr"] = learning_rate * group.get("lr_scale", 1.0)
    optimizer.zero_grad(set_to_none=True)
    torch.autograd.backward(loss)
    torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    optimizer.step()
    if loss.device.type == "cuda":
        torch.cuda.synchronize(loss.device)


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

    def add(self, loss: torch.Tensor, ce: torch.Tensor | None, ntl: torch.Tensor | None) -> None:
        self.steps += 1
        self.loss = self.loss + loss.detach().cpu().double()
        if ce is not None:
            self.ce = self.ce + ce.detach().cpu().double()
        if ntl is not None:
            self.ntl = self.ntl + ntl.detach().cpu().double()

    def entry(self, step: int, has_ce: bool, has_ntl: bool) -> dict[str, Any]:
        return {
            "step": step,
            "loss": float(self.loss) / self.steps,
            "ce": float(self.ce) / self.steps if has_ce else None,
            "ntl": float(self.ntl) / self.steps if has_ntl else None,
        }


def train_with_checkpoints(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    step: Step,
    config: RunConfig,
    directory: Path,
    *,
    has_ntl: bool,
    has_ce: bool = True,
    progress: Progress | None = None,
) -> TrainingLog:
    """Run ``step`` for steps ``0 .. config.steps - 1`` with the schedule of
    :func:`learning_rate_at`, resuming from ``directory/checkpoint.pt`` when it exists and saving
    one every ``config.checkpoint_every`` steps (:func:`trainable_state` and the optimiser's).
    The finished run's trainable weights go to ``directory/model.pt``; the caller removes the
    checkpoint once the arm's results are stored."""
    directory.mkdir(parents=True, exist_ok=True)
    start_step, history, step_seconds = 0, [], []
    interval = _Interval.empty()
    checkpoint_path = directory / CHECKPOINT
    if checkpoint_path.exists():
        device = next(model.parameters()).device
        state = torch.load(checkpoint_path, map_location=device, weights_only=True)
        load_trainable_state(model, state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_step, history, step_seconds = state["step"], state["history"], state["step_seconds"]
        interval = _Interval(**state["interval"])
        if progress is not None:
            progress(start_step)

    model.train()
    for index in range(start_step, config.steps):
        started = time.perf_counter()
        loss, ce, ntl = step(index, learning_rate_at(index, config))
        interval.add(loss, ce, ntl)
        step_seconds.append(time.perf_counter() - started)

        done = index + 1
        if done % config.log_every == 0 or done == config.steps:
            history.append(interval.entry(done, has_ce, has_ntl))
            interval = _Interval.empty()
        if done % config.checkpoint_every == 0 and done < config.steps:
            save_atomically(
                {
                    "step": done,
                    "model": trainable_state(model),
                    "optimizer": optimizer.state_dict(),
                    "history": history,
                    "step_seconds": step_seconds,
                    "interval": vars(interval),
                },
                checkpoint_path,
            )
        if progress is not None:
            progress(1)
    save_atomically(trainable_state(model), directory / WEIGHTS)
    return TrainingLog(history, step_seconds)
