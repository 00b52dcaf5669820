"""Scoring an rJokes arm: its predicted score for every evaluation joke under each readout, and
the regression metrics of each readout.

Token arms are read out three ways: ``greedy`` (decode the most likely token at each step and
parse the number, as the paper does), ``expected`` (the mean of the model's distribution over
whole numbers) and ``median`` (its median), both from
:func:`numtok.readout.distribution.number_distribution`, exact for answers of up to ``max_digits``
digits. The ``head`` arm predicts its scalar.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from numtok.experiments.evaluate import CachedScorer, greedy_answers
from numtok.experiments.model import Transformer
from numtok.experiments.tasks.rjokes import Joke
from numtok.experiments.tokenizer import WordTokenizer
from numtok.experiments.transformer_arm import ScoreRegressor
from numtok.numbers.text import last_number
from numtok.readout.distribution import number_distribution

__all__ = [
    "head_predictions",
    "token_predictions",
]

# Prompts per enumeration batch: at 2 digits the cache holds 100 rows per prompt.
_READOUT_PROMPTS = 16
# Greedy answers longer than this are cut (a score has at most two digits, then <eos>).
_GREEDY_TOKENS = 6

Predictions = list[float | None]
#: ``progress(jokes_scored_since_last_call)``.
Progress = Callable[[int], None]


def _silent(amount: int) -> None:
    pass


def _by_length(prompts: Sequence[list[int]], size: int) -> list[list[int]]:
    """Indices of ``prompts`` in batches of ``size`` similar lengths (little padding)."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    return [order[start : start + size] for start in range(0, len(order), size)]


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


@torch.no_grad()
def token_predictions(
    model: Transformer,
    tokenizer: WordTokenizer,
    jokes: Sequence[Joke],
    *,
    batch_size: int,
    max_digits: int,
    min_probability: float,
    device: torch.device,
    progress: Progress = _silent,
) -> tuple[dict[str, Predictions], list[float], list[float]]:
    """Each readout's prediction per joke (None: no number), and per joke the probability mass
    the distribution readouts cover and the probability pruning left out (bounded)."""
    was_training = model.training
    model.eval()
    texts = [text for text, _ in jokes]
    greedy = greedy_answers(
        model, tokenizer, texts, batch_size=batch_size, device=device, max_new_tokens=_GREEDY_TOKENS
    )
    predictions: dict[str, Predictions] = {"greedy": [last_number(answer) for answer in greedy]}
    mean: Predictions = [None] * len(jokes)
    median: Predictions = [None] * len(jokes)
    mass = [0.0] * len(jokes)
    pruned = [0.0] * len(jokes)
    vocab = tokenizer.number_vocab()
    prompts = [tokenizer.encode_prompt(text) for text in texts]
    for chunk in _by_length(prompts, _READOUT_PROMPTS):
        scorer = CachedScorer(model, [prompts[i] for i in chunk], tokenizer.pad_id, device)
        distribution = number_distribution(
            scorer, vocab, max_digits=max_digits, min_probability=min_probability
        )
        for row, index in enumerate(chunk):
            mean[index] = _finite_or_none(float(distribution.mean[row]))
            median[index] = _finite_or_none(float(distribution.median[row]))
            mass[index] = float(distribution.mass[row])
            pruned[index] = float(distribution.pruned[row])
        progress(len(chunk))
    predictions["expected"], predictions["median"] = mean, median
    model.train(was_training)
    return predictions, mass, pruned


@torch.no_grad()
def head_predictions(
    model: ScoreRegressor,
    tokenizer: WordTokenizer,
    jokes: Sequence[Joke],
    *,
    batch_size: int,
    mean: float,
    std: float,
    device: torch.device,
    progress: Progress = _silent,
) -> dict[str, Predictions]:
    """The head's score per joke, mapped back from the standardised scale."""
    was_training = model.training
    model.eval()
    prompts = [tokenizer.encode_prompt(text) for text, _ in jokes]
    scores: Predictions = [None] * len(jokes)
    for chunk in _by_length(prompts, batch_size):
        scorer = CachedScorer(model.trunk, [prompts[i] for i in chunk], tokenizer.pad_id, device)
        predicted = model(scorer.prefill()) * std + mean  # (B,)
        for index, value in zip(chunk, predicted.tolist(), strict=True):
            scores[index] = value
        progress(len(chunk))
    model.train(was_training)
    return {"head": scores}
