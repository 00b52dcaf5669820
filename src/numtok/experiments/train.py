"""The arithmetic comparison's arms: how one is built, trains a step and is scored
(:class:`ArithmeticTask`; :func:`numtok.experiments.scratch.train_arm` runs it).

Everything that varies from step to step is a function of (seed, step): the initial weights come
from ``torch.manual_seed(seed)``, the batch of step ``s`` from :class:`~.batches.TrainingSet`, and
the learning rate from the step number. There is no dropout. So every arm of a seed starts from
the same weights and sees the same batches, and :func:`~.loop.train_with_checkpoints` resumes an
interrupted arm exactly.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from numtok.experiments.batches import PackedBatch, TrainingSet
from numtok.experiments.config import ExperimentConfig
from numtok.experiments.evaluate import greedy_answers
from numtok.experiments.loop import Progress, optimizer_step
from numtok.experiments.model import Transformer
from numtok.experiments.objectives import Objective
from numtok.experiments.scratch import Arm, Scored
from numtok.experiments.tasks.mathematics import MathData
from numtok.experiments.tokenizer import CharTokenizer
from numtok.numbers.text import last_number

__all__ = ["ArithmeticTask", "build_arm", "train_step"]


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


class ArithmeticTask:
    """The arithmetic comparison as a :class:`~numtok.experiments.scratch.ScratchTask`: the
    character tokenizer, the packed batches of ``data.train`` (batch ``s`` of a seed a function
    of (seed, s)), and greedy answers to every question of the splits the run scores."""

    #: Scoring reports no items to the progress bar (it counts training steps only).
    scored_items = 0

    def __init__(self, config: ExperimentConfig, data: MathData) -> None:
        self.config = config
        self.data = data
        self.tokenizer = CharTokenizer()
        self.training = TrainingSet(data.train, self.tokenizer)

    def build(self, seed: int, arm: str) -> Arm:
        device = torch.device(self.config.device)
        model, optimizer, objective = build_arm(self.config, seed, arm, self.tokenizer)

        def step(index: int, learning_rate: float) -> Any:
            batch = self.training.batch(seed, index, self.config.batch_size).to(device)
            return train_step(model, optimizer, objective, batch, self.config, learning_rate)

        return Arm(model, optimizer, step, has_ce=True, has_ntl=objective.ntl is not None)

    def score(self, arm: str, model: nn.Module, progress: Progress) -> Scored:
        """``result``: nothing of its own; ``predictions``: ``{"splits": {split: {"greedy":
        [the last number of the answer, or None]}}, "texts": {split: [the generated answer]}}``
        for every split the run scores."""
        assert isinstance(model, Transformer)
        texts = {
            split: greedy_answers(
                model,
                self.tokenizer,
                [question for question, _ in self.data.evaluation[split]],
                batch_size=self.config.eval_batch_size,
                device=torch.device(self.config.device),
            )
            for split in self.config.splits
        }
        answers = {split: {"greedy": [last_number(text) for text in generated]}
                   for split, generated in texts.items()}  # fmt: skip
        return Scored({}, {"splits": answers, "texts": texts})
