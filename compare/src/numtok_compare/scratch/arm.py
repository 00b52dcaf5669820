"""The arms of every comparison trained from scratch (arithmetic, rJokes): the small transformer
built for a seed, and its training step (:func:`build_transformer_arm`), and the arm rebuilt as
training left it (:class:`TransformerModels`, what a task's models share).

Everything that varies from step to step is a function of (seed, step): the initial weights come
from ``torch.manual_seed(seed)``, the batch of step ``s`` from
:class:`~numtok_compare.scratch.batches.TrainingSet`, and the learning rate from the step
number. There is no dropout. So every arm of a seed starts from the same trunk weights and sees
the same batches, and :func:`~numtok_compare.runner.loop.train_with_checkpoints` resumes an
interrupted arm exactly. The arms differ in the loss:

* token arms (``ce``, ``was``, ``mse``, ``gls``, ...): the
  :class:`~numtok_compare.objectives.Objective` on the answer tokens. Logits are computed at
  those positions only, ``K`` of the batch's ``R·C``: the prompt tokens carry no loss, so the
  loss is the same as on every position with the prompt labelled -100, at a fraction of the
  output layer's cost when the vocabulary is large.
* ``head``: :class:`ScoreRegressor`, the squared error between the head's output at the first
  answer token's input (the ``<answer>`` separator) and the standardised target of
  :class:`ScoredTrainingSet`; no token loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from numtok_compare.objectives import Objective
from numtok_compare.runner.loop import Step, optimizer_step, train_with_checkpoints
from numtok_compare.runner.phases import Job
from numtok_compare.runner.run_folder import WEIGHTS, load_trainable_state
from numtok_compare.runner.training_log import Progress, TrainingLog
from numtok_compare.scratch.batches import PackedBatch, TrainingSet
from numtok_compare.scratch.config import TrainingConfig
from numtok_compare.scratch.model import Transformer
from numtok_compare.scratch.tokenizer import PromptAnswerTokenizer

__all__ = [
    "ScoreRegressor",
    "ScoredTrainingSet",
    "TransformerArm",
    "TransformerModels",
    "build_transformer_arm",
]


class ScoreRegressor(nn.Module):
    """``trunk`` (the same :class:`~numtok_compare.scratch.model.Transformer` as the token arms,
    with the same initial weights) and ``head``, a linear map from the hidden state at the
    ``<answer>`` token to the standardised target. The head starts at zero, so the first
    prediction is the training mean."""

    def __init__(self, trunk: Transformer) -> None:
        super().__init__()
        self.trunk = trunk
        self.head = nn.Linear(trunk.config.d_model, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states (K, D) at ``<answer>`` tokens -> standardised targets (K,)."""
        prediction: torch.Tensor = self.head(hidden).squeeze(-1)
        return prediction


class ScoredTrainingSet(TrainingSet):
    """The training examples ``(prompt, answer text)`` with what the head arm needs per example:
    where its ``<answer>`` token is, and its numeric target standardised by the training mean
    and standard deviation (``target = (value − score_mean) / score_std``)."""

    def __init__(
        self,
        examples: Sequence[tuple[str, str]],
        values: Sequence[float],
        tokenizer: PromptAnswerTokenizer,
    ) -> None:
        super().__init__(examples, tokenizer)
        # The <answer> token's label is the first answer token: it follows the prompt's -100s.
        self.answer_offsets = torch.tensor(
            [int((labels == -100).sum()) for _, labels in self.examples]
        )
        scores = torch.tensor(values, dtype=torch.float32)
        self.score_mean, self.score_std = float(scores.mean()), float(scores.std())
        self.targets = (scores - self.score_mean) / self.score_std


def _head_loss(
    model: ScoreRegressor,
    batch: PackedBatch,
    training: ScoredTrainingSet,
    chosen: torch.Tensor,
) -> torch.Tensor:
    """Mean squared error of the head's predictions for the batch's examples ``chosen`` (B,)."""
    hidden = model.trunk.features(
        batch.inputs, positions=batch.positions, allowed=batch.allowed
    )  # (R, C, D)
    columns = batch.example_offsets + training.answer_offsets[chosen].to(hidden.device)
    predicted = model(hidden[batch.example_rows, columns])  # (B,)
    return F.mse_loss(predicted, training.targets[chosen].to(hidden.device))


def _token_loss(
    model: Transformer, objective: Objective, batch: PackedBatch
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The objective on the answer tokens' logits (K, V) only."""
    hidden = model.features(batch.inputs, positions=batch.positions, allowed=batch.allowed)
    answer = batch.labels != -100  # (R, C)
    loss, ce, number_loss = objective(model.logits(hidden[answer]), batch.labels[answer])
    return loss, ce, number_loss


@dataclass
class TransformerArm:
    """One job's small transformer ready to train: ``step(index, learning_rate) -> (loss, CE or
    None, the unweighted number loss or None)`` runs one update of ``model`` by ``optimizer`` on
    the seed's batch ``index``; ``has_ce``/``has_ntl`` say which terms the log keeps."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    step: Step
    config: TrainingConfig
    has_ce: bool
    has_ntl: bool

    @property
    def answerer(self) -> nn.Module:
        return self.model

    def fit(self, directory: Path, progress: Progress | None) -> TrainingLog:
        """:func:`~numtok_compare.runner.loop.train_with_checkpoints` in ``directory``, then
        eval mode."""
        log = train_with_checkpoints(
            self.model, self.optimizer, self.step, self.config, directory,
            has_ce=self.has_ce, has_ntl=self.has_ntl, progress=progress,
        )  # fmt: skip
        self.model.eval()
        return log


def build_transformer_arm(
    config: TrainingConfig, seed: int, arm: str, tokenizer: PromptAnswerTokenizer,
    training: TrainingSet,
) -> TransformerArm:  # fmt: skip
    """The arm ready to train on ``config.device``: its model (the trunk initialised from
    ``seed``, the same for every arm), AdamW, and ``step(index, learning_rate) -> (loss, CE or
    None, the unweighted number loss or None)``, one optimiser step on the seed's batch
    ``index`` of ``training`` (a :class:`ScoredTrainingSet` for ``head``)."""
    if arm == "head" and not isinstance(training, ScoredTrainingSet):
        raise TypeError(
            f"the head arm trains on a ScoredTrainingSet (numeric targets), "
            f"got {type(training).__name__}"
        )
    device = torch.device(config.device)
    torch.manual_seed(seed)
    trunk = Transformer(config.model_config(len(tokenizer)))
    model: nn.Module = (ScoreRegressor(trunk) if arm == "head" else trunk).to(device)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay
    )
    objective = None
    if arm != "head":
        objective = Objective(arm, tokenizer.number_vocab(), ntl_weight=config.weight_of(arm))
        objective = objective.to(device)

    def step(index: int, learning_rate: float) -> Any:
        batch = training.batch(seed, index, config.batch_size).to(device)
        ce: torch.Tensor | None
        number_loss: torch.Tensor | None
        if objective is None:
            assert isinstance(model, ScoreRegressor) and isinstance(training, ScoredTrainingSet)
            chosen = torch.as_tensor(training.batch_indices(seed, index, config.batch_size))
            loss, ce, number_loss = _head_loss(model, batch, training, chosen), None, None
        else:
            assert isinstance(model, Transformer)
            loss, ce, number_loss = _token_loss(model, objective, batch)
        optimizer_step(model, optimizer, loss, config, learning_rate)
        return loss, ce, number_loss

    has_ntl = objective is not None and objective.ntl is not None
    return TransformerArm(
        model, optimizer, step, config, has_ce=objective is not None, has_ntl=has_ntl
    )


class TransformerModels:
    """The small transformer's arms of one seed, as the runner of every comparison builds and
    rebuilds them (:class:`~numtok_compare.runner.phases.Models`); a task sets ``config``,
    ``tokenizer`` and ``training`` and adds how an arm is scored on a split."""

    config: TrainingConfig
    tokenizer: PromptAnswerTokenizer
    training: TrainingSet

    def build(self, job: Job) -> TransformerArm:
        """:func:`build_transformer_arm` for ``job``."""
        return build_transformer_arm(self.config, job.seed, job.arm, self.tokenizer, self.training)

    def load(self, job: Job, directory: Path) -> nn.Module:
        """``job``'s model with the weights training left in ``directory`` (its ``model.pt``),
        in eval mode."""
        model = self.build(job).model
        state = torch.load(directory / WEIGHTS, map_location=self.config.device, weights_only=True)
        load_trainable_state(model, state)
        return model.eval()
