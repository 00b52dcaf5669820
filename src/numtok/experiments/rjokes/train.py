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
from numtok.experiments.rjokes.evaluate import (
    head_predictions,
    mean_by_score,
    readouts_of,
    regression_metrics,
    token_predictions,
)
from numtok.experiments.rjokes.model import ScoreRegressor
from numtok.experiments.scratch import Arm, Scored
from numtok.experiments.tasks.rjokes import Joke, RJokesData, evaluation_subset
from numtok.experiments.tokenizer import WordTokenizer

__all__ = [
    "RJokesTask",
    "ScoredTrainingSet",
    "arm_step",
    "build_tokenizer",
    "evaluation_jokes",
    "prepare_training",
]

_EXAMPLES = 8


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


def evaluation_jokes(config: RJokesConfig, data: RJokesData) -> list[Joke]:
    split = data.validation if config.evaluate_on == "validation" else data.test
    return evaluation_subset(split, config.eval_jokes)


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


def _examples(
    jokes: Sequence[Joke], predictions: dict[str, list[float | None]]
) -> list[dict[str, Any]]:
    return [
        {
            "joke": text[:100],
            "score": score,
            **{readout: values[index] for readout, values in predictions.items()},
        }
        for index, (text, score) in enumerate(jokes[:_EXAMPLES])
    ]


class RJokesTask:
    """The rJokes comparison as a :class:`~numtok.experiments.scratch.ScratchTask`: the word
    vocabulary and scored training jokes of ``data`` (built once per process), and the jokes of
    the ``evaluate_on`` split, read out greedily and by the distribution's mean and median (token
    arms) or by the head."""

    def __init__(self, config: RJokesConfig, data: RJokesData) -> None:
        self.config = config
        self.jokes = evaluation_jokes(config, data)
        self.tokenizer, self.training = prepare_training(config, data)

    @property
    def scored_items(self) -> int:
        return len(self.jokes)

    def build(self, seed: int, arm: str) -> Arm:
        model, optimizer, objective = build_arm(self.config, seed, arm, self.tokenizer)
        step = arm_step(self.config, seed, model, optimizer, objective, self.training)
        has_ntl = objective is not None and objective.ntl is not None
        return Arm(model, optimizer, step, has_ce=objective is not None, has_ntl=has_ntl)

    def score(self, arm: str, model: nn.Module, progress: Progress) -> Scored:
        """``{"metrics": {readout: {metric: value}}, "mass" (the mean probability the
        distribution readouts cover; token arms), "pruned" (the largest probability pruning
        left out of one joke's distribution), "by_score" (the mean prediction per true score,
        per readout), "examples"}``; ``progress`` hears of every scored joke."""
        config, jokes, device = self.config, self.jokes, torch.device(self.config.device)
        mass: list[float] | None = None
        pruned: list[float] | None = None
        if isinstance(model, ScoreRegressor):
            predictions = head_predictions(
                model,
                self.tokenizer,
                jokes,
                batch_size=config.eval_batch_size,
                mean=self.training.score_mean,
                std=self.training.score_std,
                device=device,
                progress=progress,
            )
        else:
            assert isinstance(model, Transformer)
            predictions, mass, pruned = token_predictions(
                model,
                self.tokenizer,
                jokes,
                batch_size=config.eval_batch_size,
                max_digits=config.max_digits,
                min_probability=config.min_probability,
                device=device,
                progress=progress,
            )
        scores = [score for _, score in jokes]
        return Scored(
            {
                "metrics": {
                    r: regression_metrics(predictions[r], scores) for r in readouts_of(arm)
                },
                "mass": None if mass is None else sum(mass) / len(mass),
                "pruned": None if pruned is None else max(pruned),
                "by_score": {r: mean_by_score(predictions[r], scores) for r in readouts_of(arm)},
                "examples": _examples(jokes, predictions),
            },
            {**predictions, "mass": mass, "pruned": pruned, "scores": scores},
        )
