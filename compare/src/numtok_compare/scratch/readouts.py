"""Scoring the models trained from scratch: each answer by every readout.

Token arms are read out by greedy decoding (:func:`greedy_answers`; the paper reads the last
number of each generated answer, :func:`numtok.numbers.text.last_number`) and, where the task asks
for them, by the mean (``expected``) and median of the model's distribution over whole numbers
(:func:`token_predictions`, from :func:`numtok.readout.distribution.number_distribution`, exact for
answers of up to ``max_digits`` digits). A regression head predicts its scalar
(:func:`head_predictions`). All of them read the model through :class:`CachedScorer`: the prompts
once (left-padded, with a key/value cache), then one token at a time for any tree of
continuations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from numtok import last_number, number_distribution
from numtok.readout import greedy_tokens
from numtok_compare.runner.training_log import Progress
from numtok_compare.scratch.arm import ScoreRegressor
from numtok_compare.scratch.model import KeyValueCache, Transformer
from numtok_compare.scratch.tokenizer import PromptAnswerTokenizer

__all__ = ["CachedScorer", "greedy_answers", "head_predictions", "token_predictions"]

#: The generator never produces longer answers (``generate_settings.MAX_ANSWER_LENGTH``); one
#: more token leaves room for ``<eos>``.
MAX_ANSWER_TOKENS = 31

# Prompts per enumeration batch: at 2 digits the cache holds 100 rows per prompt.
_READOUT_PROMPTS = 16

Predictions = list[float | None]


def _silent(amount: int) -> None:
    pass


def _by_length(prompts: Sequence[list[int]], size: int) -> list[list[int]]:
    """Indices of ``prompts`` in batches of ``size`` similar lengths (little padding)."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    return [order[start : start + size] for start in range(0, len(order), size)]


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


class CachedScorer:
    """The model as a :class:`numtok.readout.distribution.NextTokenScorer` over a batch of prompts.

    ``start()`` reads the prompts, left-padded so that every row's next token is at the end:
    padding keys are masked out, positions count real tokens only, and each padding query may
    attend to itself so that no softmax row is empty (that would give NaN values that spread
    through later layers). ``extend(parents, tokens)`` selects the cached rows ``parents`` and
    feeds each one token.
    """

    def __init__(
        self, model: Transformer, prompts: Sequence[Sequence[int]], pad_id: int, device: Any
    ) -> None:
        self.model = model
        width = max(len(p) for p in prompts)
        tokens = torch.full((len(prompts), width), pad_id, dtype=torch.long)
        real = torch.zeros((len(prompts), width), dtype=torch.bool)
        for row, prompt in enumerate(prompts):
            tokens[row, width - len(prompt) :] = torch.tensor(prompt)
            real[row, width - len(prompt) :] = True
        self.tokens, self.real = tokens.to(device), real.to(device)  # (B, S)
        self.cache = KeyValueCache(model.config.n_layers)
        self.positions = (self.real.long().cumsum(dim=1) - 1).clamp_min(0)  # (B, S)

    @torch.no_grad()
    def start(self) -> torch.Tensor:
        return self.model.logits(self.prefill())  # (B, V)

    @torch.no_grad()
    def prefill(self) -> torch.Tensor:
        """Read the prompts into the cache; the hidden states (B, C) at their last tokens."""
        width = self.tokens.shape[1]
        causal = torch.ones(width, width, dtype=torch.bool, device=self.tokens.device).tril()
        diagonal = torch.eye(width, dtype=torch.bool, device=self.tokens.device)
        allowed = (causal & self.real[:, None, :]) | diagonal  # (B, S, S)
        hidden = self.model.features(
            self.tokens, positions=self.positions, allowed=allowed[:, None], cache=self.cache
        )
        self.positions = self.positions[:, -1:] + 1  # (B, 1): where the next token goes
        last: torch.Tensor = hidden[:, -1]
        return last

    @torch.no_grad()
    def extend(self, parents: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        parents = parents.to(self.real.device)
        self.cache = self.cache.select(parents)
        self.real = torch.cat((self.real[parents], torch.ones_like(self.real[parents, :1])), 1)
        hidden = self.model.features(
            tokens.to(self.real.device)[:, None],
            positions=self.positions[parents],
            allowed=self.real[:, None, None, :],
            cache=self.cache,
        )
        self.positions = self.positions[parents] + 1
        return self.model.logits(hidden[:, -1])  # (M, V)


def _greedy_batch(
    model: Transformer,
    tokenizer: PromptAnswerTokenizer,
    questions: Sequence[str],
    max_new_tokens: int,
    device: torch.device,
) -> list[str]:
    """Generate answers for one batch: the most likely token at every step, until ``<eos>``
    (:func:`numtok.readout.decoding.greedy_tokens` over the cached scorer)."""
    scorer = CachedScorer(
        model, [tokenizer.encode_prompt(q) for q in questions], tokenizer.pad_id, device
    )
    answers = greedy_tokens(scorer, max_new_tokens, eos_id=tokenizer.end_id)
    return [tokenizer.decode(answer) for answer in answers]


def greedy_answers(
    model: Transformer,
    tokenizer: PromptAnswerTokenizer,
    questions: Sequence[str],
    *,
    batch_size: int,
    device: torch.device,
    max_new_tokens: int = MAX_ANSWER_TOKENS,
) -> list[str]:
    """The model's greedy answer to each question (text up to ``<eos>``), in input order.

    Questions are decoded in batches of similar length so that little padding is computed.
    """
    was_training = model.training
    model.eval()
    order = sorted(range(len(questions)), key=lambda i: len(questions[i]))
    answers: list[str] = [""] * len(questions)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        texts = _greedy_batch(
            model, tokenizer, [questions[i] for i in chunk], max_new_tokens, device
        )
        for index, text in zip(chunk, texts, strict=True):
            answers[index] = text
    model.train(was_training)
    return answers


@torch.no_grad()
def token_predictions(
    model: Transformer,
    tokenizer: PromptAnswerTokenizer,
    questions: Sequence[str],
    *,
    batch_size: int,
    max_new_tokens: int,
    max_digits: int,
    min_probability: float,
    device: torch.device,
    progress: Progress = _silent,
) -> tuple[dict[str, Predictions], list[float], list[float]]:
    """Each readout's prediction per question (``greedy``, of at most ``max_new_tokens``
    tokens; ``expected`` and ``median``, over numbers of up to ``max_digits`` digits, prefixes
    below ``min_probability`` not extended; None: no number), and per question the probability
    mass the distribution readouts cover and the probability pruning left out (bounded)."""
    was_training = model.training
    model.eval()
    greedy = greedy_answers(
        model, tokenizer, questions, batch_size=batch_size, device=device,
        max_new_tokens=max_new_tokens,
    )  # fmt: skip
    predictions: dict[str, Predictions] = {"greedy": [last_number(answer) for answer in greedy]}
    mean: Predictions = [None] * len(questions)
    median: Predictions = [None] * len(questions)
    mass = [0.0] * len(questions)
    pruned = [0.0] * len(questions)
    vocab = tokenizer.number_vocab()
    prompts = [tokenizer.encode_prompt(question) for question in questions]
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
    tokenizer: PromptAnswerTokenizer,
    questions: Sequence[str],
    *,
    batch_size: int,
    mean: float,
    std: float,
    device: torch.device,
    progress: Progress = _silent,
) -> dict[str, Predictions]:
    """The head's prediction per question, mapped back from the standardised scale (the
    training answers' ``mean`` and ``std``)."""
    was_training = model.training
    model.eval()
    prompts = [tokenizer.encode_prompt(question) for question in questions]
    scores: Predictions = [None] * len(questions)
    for chunk in _by_length(prompts, batch_size):
        scorer = CachedScorer(model.trunk, [prompts[i] for i in chunk], tokenizer.pad_id, device)
        predicted = model(scorer.prefill()) * std + mean  # (B,)
        for index, value in zip(chunk, predicted.tolist(), strict=True):
            scores[index] = value
        progress(len(chunk))
    model.train(was_training)
    return {"head": scores}
