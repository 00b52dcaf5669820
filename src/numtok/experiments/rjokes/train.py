"""Training one rJokes arm for one seed, and scoring it.

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

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from numtok.experiments.batches import TrainingSet
from numtok.experiments.loop import (
    Progress,
    Step,
    median_step_seconds,
    optimizer_step,
    train_with_checkpoints,
)
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
from numtok.experiments.run_folder import arm_directory, finish_arm, read_result
from numtok.experiments.tasks.rjokes import Joke, RJokesData, evaluation_subset
from numtok.experiments.tokenizer import WordTokenizer

__all__ = [
    "ScoredTrainingSet",
    "arm_step",
    "build_tokenizer",
    "evaluation_jokes",
    "prepare_training",
    "train_arm",
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


def train_arm(
    config: RJokesConfig,
    seed: int,
    arm: str,
    data: RJokesData,
    run_dir: Path,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Train and score one arm for one seed; returns (and writes) its result. A finished arm is
    read back; an interrupted one resumes from its checkpoint. ``progress`` hears of every
    training step and every scored joke.

    Returns:
        ``{"seed", "arm", "history", "metrics": {readout: {metric: value}}, "mass" (the mean
        probability the distribution readouts cover; token arms), "pruned" (the largest
        probability pruning left out of one joke's distribution), "by_score" (the mean prediction
        per true score, per readout), "examples", "median_step_seconds", "train_seconds",
        "eval_seconds"}``.
    """
    directory = arm_directory(run_dir, seed, arm)
    jokes = evaluation_jokes(config, data)
    stored = read_result(directory)
    if stored is not None:
        if progress is not None:
            progress(config.steps + len(jokes))
        return stored
    device = torch.device(config.device)
    if device.type == "cpu":
        torch.set_num_threads(config.threads)
    tokenizer, training = prepare_training(config, data)
    model, optimizer, objective = build_arm(config, seed, arm, tokenizer)
    log = train_with_checkpoints(
        model,
        optimizer,
        arm_step(config, seed, model, optimizer, objective, training),
        config,
        directory,
        has_ce=objective is not None,
        has_ntl=objective is not None and objective.ntl is not None,
        progress=progress,
    )

    eval_started = time.perf_counter()
    scored = progress or (lambda amount: None)
    mass: list[float] | None = None
    pruned: list[float] | None = None
    if isinstance(model, ScoreRegressor):
        predictions = head_predictions(
            model,
            tokenizer,
            jokes,
            batch_size=config.eval_batch_size,
            mean=training.score_mean,
            std=training.score_std,
            device=device,
            progress=scored,
        )
    else:
        assert isinstance(model, Transformer)
        predictions, mass, pruned = token_predictions(
            model,
            tokenizer,
            jokes,
            batch_size=config.eval_batch_size,
            max_digits=config.max_digits,
            min_probability=config.min_probability,
            device=device,
            progress=scored,
        )
    scores = [score for _, score in jokes]
    result = {
        "seed": seed,
        "arm": arm,
        "history": log.history,
        "metrics": {r: regression_metrics(predictions[r], scores) for r in readouts_of(arm)},
        "mass": None if mass is None else sum(mass) / len(mass),
        "pruned": None if pruned is None else max(pruned),
        "by_score": {r: mean_by_score(predictions[r], scores) for r in readouts_of(arm)},
        "examples": _examples(jokes, predictions),
        "median_step_seconds": median_step_seconds(log),
        "train_seconds": float(sum(log.step_seconds)),
        "eval_seconds": time.perf_counter() - eval_started,
    }
    return finish_arm(
        directory, result, {**predictions, "mass": mass, "pruned": pruned, "scores": scores}
    )
