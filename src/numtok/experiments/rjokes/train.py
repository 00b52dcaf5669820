"""The rJokes comparison's arms: how one is built, trains a step and is scored
(:class:`RJokesTask`; :func:`numtok.experiments.scratch.train_arm` runs it).

Every arm of a seed starts from the same trunk weights (``torch.manual_seed(seed)``) and sees the
same batches (:class:`~numtok.experiments.batches.TrainingSet`); the arms differ in the loss:

* token arms (``ce``, ``was``, ``mse``, ``gls``): the arithmetic comparison's
  :class:`~numtok.experiments.objectives.Objective` on the answer tokens (the score's digits and
  ``<eos>``). Logits are computed at those positions only: the vocabulary is large and the
  prompt tokens carry no loss.
* ``head``: :class:`~.model.ScoreRegressor`, squared error between the head's output at the
  ``<answer>`` token and the standardised score; no token loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from numtok.experiments.batches import TrainingSet
from numtok.experiments.loop import Progress, Step, optimizer_step
from numtok.experiments.model import Transformer
from numtok.experiments.objectives import Objective
from numtok.experiments.rjokes.config import RJokesConfig
from numtok.experiments.rjokes.evaluate import head_predictions, token_predictions
from numtok.experiments.rjokes.model import ScoreRegressor
from numtok.experiments.scratch import Arm, Scored
from numtok.experiments.tasks.rjokes import Joke, RJokesData, evaluation_subset
from numtok.experiments.tokenizer import WordTokenizer

__all__ = [
    "RJokesTask",
    "ScoredTrainingSet",
    "arm_step",
    "build_tokenizer",
    "prepare_training",
    "scored_jokes",
]


def build_tokenizer(config: RJokesConfig, data: RJokesData) -> WordTokenizer:
    """The word vocabulary of the training jokes (validation and test jokes are not read)."""
    return WordTokenizer.from_texts(
        (text for text, _ in data.train),
        max_words=config.vocabulary_words,
        max_prompt_tokens=config.max_prompt_tokens,
    )


# Tokenizer and encoded training jokes per (data, vocabulary settings): a worker process that
# trains several arms builds them once (a few seconds each time otherwise).
_PREPARED: dict[tuple[str, int, int, int], tuple[WordTokenizer, ScoredTrainingSet]] = {}


def prepare_training(
    config: RJokesConfig, data: RJokesData
) -> tuple[WordTokenizer, ScoredTrainingSet]:
    """:func:`build_tokenizer` and the :class:`ScoredTrainingSet` of ``data.train``, built once
    per process for equal data and vocabulary settings."""
    key = (data.digest, len(data.train), config.vocabulary_words, config.max_prompt_tokens)
    if key not in _PREPARED:
        tokenizer = build_tokenizer(config, data)
        _PREPARED.clear()
        _PREPARED[key] = tokenizer, ScoredTrainingSet(data.train, tokenizer)
    return _PREPARED[key]


def scored_jokes(config: RJokesConfig, data: RJokesData) -> dict[str, list[Joke]]:
    """The jokes an arm is scored on, ``eval_jokes`` of each split (a fixed subset): validation
    (which the report's learnability gate reads), and the test split unless ``evaluate_on`` is
    ``validation`` (choosing settings)."""
    splits = {"validation": data.validation}
    if config.evaluate_on == "test":
        splits["test"] = data.test
    return {split: evaluation_subset(jokes, config.eval_jokes) for split, jokes in splits.items()}


class ScoredTrainingSet(TrainingSet):
    """The training jokes as ``joke <answer> digits <eos>`` examples, plus what the head arm
    needs per example: where its ``<answer>`` token is and its standardised score."""

    def __init__(self, jokes: Sequence[Joke], tokenizer: WordTokenizer) -> None:
        super().__init__([(text, str(score)) for text, score in jokes], tokenizer)
        # The <answer> token's label is the first digit: it follows the prompt's -100 labels.
        self.answer_offsets = torch.tensor(
            [int((labels == -100).sum()) for _, labels in self.examples]
        )
        scores = torch.tensor([score for _, score in jokes], dtype=torch.float32)
        self.score_mean, self.score_std = float(scores.mean()), float(scores.std())
        self.targets = (scores - self.score_mean) / self.score_std


def build_arm(
    config: RJokesConfig, seed: int, arm: str, tokenizer: WordTokenizer
) -> tuple[nn.Module, torch.optim.Optimizer, Objective | None]:
    """The arm's model (trunk initialised from ``seed``, the same for every arm), optimiser and
    token objective (None for ``head``), on ``config.device``."""
    device = torch.device(config.device)
    torch.manual_seed(seed)
    trunk = Transformer(config.model_config(len(tokenizer)))
    model: nn.Module = ScoreRegressor(trunk) if arm == "head" else trunk
    model = model.to(device)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay
    )
    if arm == "head":
        return model, optimizer, None
    objective = Objective(arm, tokenizer.number_vocab(), ntl_weight=config.weight_of(arm))
    return model, optimizer, objective.to(device)


def arm_step(
    config: RJokesConfig,
    seed: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    objective: Objective | None,
    training: ScoredTrainingSet,
) -> Step:
    """The arm's training step: ``step(index, learning_rate) -> (loss, ce, ntl)``."""
    device = torch.device(config.device)

    def step(index: int, learning_rate: float) -> Any:
        batch = training.batch(seed, index, config.batch_size).to(device)
        if objective is None:
            assert isinstance(model, ScoreRegressor)
            hidden = model.trunk.features(
                batch.inputs, positions=batch.positions, allowed=batch.allowed
            )  # (R, C, D)
            chosen = torch.as_tensor(training.batch_indices(seed, index, config.batch_size))
            columns = batch.example_offsets + training.answer_offsets[chosen].to(device)
            predicted = model(hidden[batch.example_rows, columns])  # (B,)
            loss = F.mse_loss(predicted, training.targets[chosen].to(device))
            optimizer_step(model, optimizer, loss, config, learning_rate)
            return loss, None, None
        assert isinstance(model, Transformer)
        hidden = model.features(batch.inputs, positions=batch.positions, allowed=batch.allowed)
        answer = batch.labels != -100  # (R, C): the digits and <eos>
        logits = model.logits(hidden[answer])  # (K, V)
        loss, ce, ntl = objective(logits, batch.labels[answer])
        optimizer_step(model, optimizer, loss, config, learning_rate)
        return loss, ce, ntl

    return step


class RJokesTask:
    """The rJokes comparison as a :class:`~numtok.experiments.scratch.ScratchTask`: the word
    vocabulary and scored training jokes of ``data`` (built once per process), and the jokes of
    :func:`scored_jokes`, read out greedily and by the distribution's mean and median (token
    arms) or by the head."""

    def __init__(self, config: RJokesConfig, data: RJokesData) -> None:
        self.config = config
        self.jokes = scored_jokes(config, data)
        self.tokenizer, self.training = prepare_training(config, data)

    @property
    def scored_items(self) -> int:
        return sum(len(jokes) for jokes in self.jokes.values())

    def build(self, seed: int, arm: str) -> Arm:
        model, optimizer, objective = build_arm(self.config, seed, arm, self.tokenizer)
        step = arm_step(self.config, seed, model, optimizer, objective, self.training)
        has_ntl = objective is not None and objective.ntl is not None
        return Arm(model, optimizer, step, has_ce=objective is not None, has_ntl=has_ntl)

    def score(self, arm: str, model: nn.Module, progress: Progress) -> Scored:
        """``result``: ``{"mass" (the mean probability the distribution readouts cover; token
        arms), "pruned" (the largest probability pruning left out of one joke's distribution)}``;
        ``predictions``: ``{"splits": {split: {readout: [score or None per joke]}}}``;
        ``progress`` hears of every scored joke."""
        config, device = self.config, torch.device(self.config.device)
        splits: dict[str, dict[str, list[float | None]]] = {}
        masses: list[float] = []
        pruned: list[float] = []
        for split, jokes in self.jokes.items():
            if isinstance(model, ScoreRegressor):
                splits[split] = head_predictions(
                    model, self.tokenizer, jokes, batch_size=config.eval_batch_size,
                    mean=self.training.score_mean, std=self.training.score_std, device=device,
                    progress=progress,
                )  # fmt: skip
                continue
            assert isinstance(model, Transformer)
            splits[split], mass, left_out = token_predictions(
                model, self.tokenizer, jokes, batch_size=config.eval_batch_size,
                max_digits=config.max_digits, min_probability=config.min_probability,
                device=device, progress=progress,
            )  # fmt: skip
            masses += mass
            pruned += left_out
        return Scored(
            {
                "mass": sum(masses) / len(masses) if masses else None,
                "pruned": max(pruned) if pruned else None,
            },
            {"splits": splits},
        )
