"""Every arm a comparison trains, trained by ``transformers.Trainer``, as users train theirs.

* **Settings** (:func:`training_arguments`): ``config.steps`` optimiser steps of
  ``config.batch_size`` examples (an epoch's last, partial batch dropped), the Trainer's AdamW at
  ``learning_rate`` with ``weight_decay``, linear warm-up over ``warmup_steps`` then cosine decay
  to zero, the gradient norm clipped to ``grad_clip``, the loss logged every ``log_every`` steps,
  a checkpoint every ``checkpoint_every`` steps into the job's ``checkpoints/``, and the job's
  seed. The Trainer seeds its shuffling with it, so every arm of a seed sees the same batches.
* **The loss** (:func:`compute_loss_func`, :meth:`TrainerArm.trainer`): CE is the model's
  own; the arms of :data:`~numtok_compare.objectives.ATTACHED_ARMS` add theirs with
  ``NTLossForTrainer(vocab, kind=arm, ntl_weight=λ).attach(trainer)``, which logs ``ce`` and
  ``ntl``; the others (``gls``, ``number``, ``ntil``) pass
  :class:`~numtok_compare.objectives.Objective` as the Trainer's ``compute_loss_func``; the
  ``head`` arm's model (:class:`~numtok_compare.regression_head.RegressionHead`) returns its own.
* **Several processes**: launched by ``torchrun`` or ``accelerate launch``, every process runs
  the comparison, and the Trainer trains each arm on all of them (``batch_size`` examples per
  process and micro-batch); every process writes the same ``model.pt`` atomically, and the first
  one scores the arm (:mod:`~numtok_compare.runner.phases`).
* **Resume** (:meth:`TrainerArm.fit`): an arm whose folder holds a checkpoint resumes from the
  last complete one (:func:`last_complete_checkpoint`; weights, optimiser, schedule and random
  states: it continues as if never stopped; the log entry that spans the interruption averages
  the steps after it only).
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import Trainer, TrainerCallback, TrainingArguments
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import logging as transformers_logging

from numtok import NumberVocab
from numtok.hf import NTLossForTrainer
from numtok_compare.config import RunConfig
from numtok_compare.objectives import ATTACHED_ARMS, IGNORE_INDEX, Objective
from numtok_compare.runner.run_folder import CHECKPOINTS, WEIGHTS, save_atomically, trainable_state
from numtok_compare.runner.training_log import Progress, TrainingLog

__all__ = [
    "TrainerArm",
    "checkpoint_step",
    "compute_loss_func",
    "last_complete_checkpoint",
    "objective_loss",
    "training_arguments",
]


def training_arguments(
    config: RunConfig, seed: int, directory: Path, passed: Mapping[str, Any]
) -> TrainingArguments:
    """The ``TrainingArguments`` of ``seed``'s arm in ``directory`` (see the module docstring),
    the user's ``passed`` fields over the harness's defaults (a schedule, warm-up ratio,
    accumulation, precision, ``deepspeed``, ``fsdp``, ``report_to``, ...)."""
    defaults: dict[str, Any] = dict(
        output_dir=str(directory / CHECKPOINTS), max_steps=config.steps,
        per_device_train_batch_size=config.batch_size, dataloader_drop_last=True,
        learning_rate=config.learning_rate, weight_decay=config.weight_decay,
        lr_scheduler_type="cosine", warmup_steps=config.warmup_steps,
        max_grad_norm=config.grad_clip, logging_steps=config.log_every,
        save_steps=config.checkpoint_every, save_total_limit=1, seed=seed,
        use_cpu=torch.device(config.device).type == "cpu", remove_unused_columns=False,
        report_to="none", disable_tqdm=True, ddp_find_unused_parameters=False,
    )  # fmt: skip
    return TrainingArguments(**{**defaults, **passed})


def objective_loss(objective: Objective) -> Callable[..., torch.Tensor]:
    """``compute_loss_func(outputs, labels, num_items_in_batch)`` of ``objective``: its loss on
    the logits at ``t`` (B, T - 1, V) against the labels at ``t + 1`` that are not -100. The
    Trainer adds the micro-batches of a step: each is weighed by its share of the step's
    ``num_items_in_batch`` labelled positions (exact for one micro-batch)."""

    def compute_loss(outputs: Any, labels: torch.Tensor, num_items_in_batch: Any = None) -> Any:
        targets = labels[:, 1:]
        labelled = targets != IGNORE_INDEX
        loss, _, _ = objective(outputs["logits"][:, :-1][labelled], targets[labelled])
        if num_items_in_batch is None:
            return loss
        return loss * labelled.sum() / num_items_in_batch

    return compute_loss


def compute_loss_func(
    arm: str, vocab: NumberVocab, weight: float
) -> Callable[..., torch.Tensor] | None:
    """The Trainer's ``compute_loss_func`` for ``arm`` at λ = ``weight``: None where the model's
    own loss is the arm's (``ce``, ``head``) or :class:`NTLossForTrainer` adds it
    (:data:`~numtok_compare.objectives.ATTACHED_ARMS`)."""
    if arm in ("ce", "head") or arm in ATTACHED_ARMS:
        return None
    return objective_loss(Objective(arm, vocab, ntl_weight=weight))


def checkpoint_step(folder: str | Path) -> int:
    """The step of the Trainer's ``checkpoint-<step>`` folder."""
    return int(str(folder).rpartition("-")[2])


def last_complete_checkpoint(checkpoints: Path) -> str | None:
    """The newest of the Trainer's ``checkpoint-<step>`` folders in ``checkpoints`` that it
    finished writing (``trainer_state.json`` is written last; the folder before it is deleted
    only after), None if there is none. Folders a killed process left half-written are
    deleted."""
    complete = None
    folders = sorted(checkpoints.glob(f"{PREFIX_CHECKPOINT_DIR}-*"), key=checkpoint_step)
    for folder in folders:
        if (folder / TRAINER_STATE_NAME).exists():
            complete = str(folder)
        else:
            shutil.rmtree(folder, ignore_errors=True)
    return complete


class _Watch(TrainerCallback):
    """Times every optimiser step, tells ``progress`` of the steps done (a resumed run's
    earlier steps with its first), and logs the last step (the losses since the last entry)."""

    def __init__(self, progress: Progress | None) -> None:
        self.progress = progress
        self.step_seconds: list[float] = []
        self._began = 0.0
        self._reported = 0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._began = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if args.device.type == "cuda":
            torch.cuda.synchronize(args.device)
        self.step_seconds.append(time.perf_counter() - self._began)
        if self.progress is not None:
            self.progress(state.global_step - self._reported)
        self._reported = state.global_step
        if state.global_step == state.max_steps:
            control.should_log = True


@dataclass
class TrainerArm:
    """One job's arm as the Trainer trains it: ``model`` (a causal LM, or a
    :class:`~numtok_compare.regression_head.RegressionHead`), the ``train`` examples and the
    ``collate`` that makes a batch of them, ``vocab`` for the number losses, ``optimizer``
    (None: the Trainer's AdamW) and the user's ``training_args`` (fields of
    ``TrainingArguments`` over the harness's). ``answerer`` is what the comparison scores once
    it is trained."""

    model: nn.Module
    config: RunConfig
    seed: int
    arm: str
    weight: float
    train: Sequence[Any]
    collate: Callable[[Sequence[Any]], dict[str, Any]]
    vocab: NumberVocab
    answerer: Any
    optimizer: torch.optim.Optimizer | None = None
    training_args: Mapping[str, Any] = field(default_factory=dict)

    def trainer(self, directory: Path) -> Any:
        """The ``transformers.Trainer`` of this arm, its loss attached, checkpointing in
        ``directory``."""
        trainer = Trainer(
            model=self.model,
            args=training_arguments(self.config, self.seed, directory, self.training_args),
            train_dataset=self.train, data_collator=self.collate,
            optimizers=(self.optimizer, None),
            compute_loss_func=compute_loss_func(self.arm, self.vocab, self.weight),
        )  # fmt: skip
        for chatty in (PrinterCallback, ProgressCallback):
            trainer.remove_callback(chatty)
        if self.arm in ATTACHED_ARMS:
            NTLossForTrainer(self.vocab, kind=self.arm, ntl_weight=self.weight).attach(trainer)
        return trainer

    def fit(self, directory: Path, progress: Progress | None) -> TrainingLog:
        """Train (resuming from the last checkpoint in ``directory``, said on stderr with its
        step), store the trained parameters in ``model.pt``, and leave the model in eval mode."""
        # The harness trains many arms: no bar for every checkpoint the Trainer writes.
        transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        trainer = self.trainer(directory)
        watch = _Watch(progress)
        trainer.add_callback(watch)
        checkpoint = last_complete_checkpoint(directory / CHECKPOINTS)
        resumed_at = None
        if checkpoint is not None:
            resumed_at = checkpoint_step(checkpoint)
            print(
                f"numtok: seed {self.seed} {self.arm} λ={self.weight:g}: resuming at step "
                f"{resumed_at} from its checkpoint in {directory}",
                file=sys.stderr,
                flush=True,
            )
        trainer.train(resume_from_checkpoint=checkpoint)
        self.model.eval()
        save_atomically(trainable_state(self.model), directory / WEIGHTS)
        history = [
            {"step": entry["step"], "loss": entry["loss"],
             "ce": entry.get("ce"), "ntl": entry.get("ntl")}
            for entry in trainer.state.log_history if "loss" in entry
        ]  # fmt: skip
        return TrainingLog(history, watch.step_seconds, resumed_at)
