"""The arithmetic comparison's arms (:class:`ArithmeticTask`;
:func:`numtok.experiments.scratch.train_arm` runs it): the small transformer of
:func:`~numtok.experiments.transformer_arm.build_transformer_arm` on the character tokens, scored
by greedy decoding.
"""

from __future__ import annotations

import torch
from torch import nn

from numtok.experiments.batches import TrainingSet
from numtok.experiments.config import ExperimentConfig
from numtok.experiments.evaluate import greedy_answers
from numtok.experiments.loop import Progress
from numtok.experiments.model import Transformer
from numtok.experiments.scratch import Arm, Scored
from numtok.experiments.tasks.mathematics import MathData
from numtok.experiments.tokenizer import CharTokenizer
from numtok.experiments.transformer_arm import build_transformer_arm
from numtok.numbers.text import last_number

__all__ = ["ArithmeticTask"]


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
        return build_transformer_arm(self.config, seed, arm, self.tokenizer, self.training)

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
