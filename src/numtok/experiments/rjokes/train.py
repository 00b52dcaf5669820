"""The rJokes comparison's arms (:class:`RJokesTask`; :func:`numtok.experiments.scratch.train_arm`
runs it): the small transformer of
:func:`~numtok.experiments.transformer_arm.build_transformer_arm` on the word tokens of the
training jokes (token arms on the score's digits and ``<eos>``; ``head`` on the standardised
score), scored greedily and by the distribution's mean and median (token arms) or by the head.
"""

from __future__ import annotations

import torch
from torch import nn

from numtok.experiments.loop import Progress
from numtok.experiments.model import Transformer
from numtok.experiments.rjokes.config import RJokesConfig
from numtok.experiments.rjokes.evaluate import head_predictions, token_predictions
from numtok.experiments.scratch import Arm, Scored
from numtok.experiments.tasks.rjokes import Joke, RJokesData, evaluation_subset
from numtok.experiments.tokenizer import WordTokenizer
from numtok.experiments.transformer_arm import (
    ScoredTrainingSet,
    ScoreRegressor,
    build_transformer_arm,
)

__all__ = ["RJokesTask", "build_tokenizer", "prepare_training", "scored_jokes"]


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
        examples = [(text, str(score)) for text, score in data.train]
        training = ScoredTrainingSet(examples, [score for _, score in data.train], tokenizer)
        _PREPARED.clear()
        _PREPARED[key] = tokenizer, training
    return _PREPARED[key]


def scored_jokes(config: RJokesConfig, data: RJokesData) -> dict[str, list[Joke]]:
    """The jokes an arm is scored on, ``eval_jokes`` of each split (a fixed subset): validation
    (which the report's learnability gate reads), and the test split unless ``evaluate_on`` is
    ``validation`` (choosing settings)."""
    splits = {"validation": data.validation}
    if config.evaluate_on == "test":
        splits["test"] = data.test
    return {split: evaluation_subset(jokes, config.eval_jokes) for split, jokes in splits.items()}


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
        return build_transformer_arm(self.config, seed, arm, self.tokenizer, self.training)

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
