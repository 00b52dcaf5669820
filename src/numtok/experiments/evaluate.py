"""Greedy decoding and the paper's scoring: the last number of each generated answer is compared
with the reference by :func:`numtok.metrics.numeric_metrics`, per evaluation split."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from numtok.experiments.model import KeyValueCache, Transformer
from numtok.experiments.tokenizer import CharTokenizer
from numtok.metrics import numeric_metrics

__all__ = ["Evaluation", "evaluate", "greedy_answers"]

#: The generator never produces longer answers (``generate_settings.MAX_ANSWER_LENGTH``); one
#: more token leaves room for ``<eos>``.
MAX_ANSWER_TOKENS = 31
_EXAMPLES_PER_SPLIT = 5


@torch.no_grad()
def _greedy_batch(
    model: Transformer,
    tokenizer: CharTokenizer,
    questions: Sequence[str],
    max_new_tokens: int,
    device: torch.device,
) -> list[str]:
    """Generate answers for one batch, left-padded so that every row's next token is at the end.

    Padding keys are masked out, positions count real tokens only, and each padding query may
    attend to itself so that no softmax row is empty (that would give NaN values that spread
    through later layers).
    """
    prompts = [[*tokenizer.encode(q), tokenizer.separator_id] for q in questions]
    width = max(len(p) for p in prompts)
    tokens = torch.full((len(prompts), width), tokenizer.pad_id, dtype=torch.long)
    real = torch.zeros((len(prompts), width), dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        tokens[row, width - len(prompt) :] = torch.tensor(prompt)
        real[row, width - len(prompt) :] = True
    tokens, real = tokens.to(device), real.to(device)
    positions = (real.long().cumsum(dim=1) - 1).clamp_min(0)  # (B, T)

    causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
    diagonal = torch.eye(width, dtype=torch.bool, device=device)
    allowed = (causal & real[:, None, :]) | diagonal  # (B, T, T)
    cache = KeyValueCache(model.config.n_layers)
    logits = model(tokens, positions=positions, allowed=allowed[:, None], cache=cache)

    generated = []
    finished = torch.zeros(len(prompts), dtype=torch.bool, device=device)
    next_position = positions[:, -1:] + 1  # (B, 1)
    for _ in range(max_new_tokens):
        next_token = logits[:, -1].argmax(dim=-1)  # (B,)
        next_token = torch.where(finished, tokenizer.end_id, next_token)
        generated.append(next_token)
        finished |= next_token == tokenizer.end_id
        if bool(finished.all()):
            break
        real = torch.cat((real, torch.ones_like(real[:, :1])), dim=1)  # (B, S)
        logits = model(
            next_token[:, None],
            positions=next_position,
            allowed=real[:, None, None, :],
            cache=cache,
        )
        next_position = next_position + 1
    rows = torch.stack(generated, dim=1).tolist()  # (B, generated)
    return [tokenizer.decode(row) for row in rows]


def greedy_answers(
    model: Transformer,
    tokenizer: CharTokenizer,
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


@dataclass(frozen=True)
class Evaluation:
    """Per split: ``metrics`` (:class:`~numtok.metrics.NumericMetrics` as a dict), ``predictions``
    (the generated answers) and ``examples`` (a few (question, reference, prediction) rows)."""

    metrics: dict[str, dict[str, float]]
    predictions: dict[str, list[str]]
    examples: dict[str, list[tuple[str, str, str]]]


def evaluate(
    model: Transformer,
    tokenizer: CharTokenizer,
    splits: Mapping[str, Sequence[tuple[str, str]]],
    *,
    batch_size: int,
    device: torch.device,
) -> Evaluation:
    """Greedy answers and numeric metrics for every split of (question, answer) pairs."""
    metrics: dict[str, dict[str, Any]] = {}
    predictions: dict[str, list[str]] = {}
    examples: dict[str, list[tuple[str, str, str]]] = {}
    for split, pairs in splits.items():
        questions = [q for q, _ in pairs]
        references = [a for _, a in pairs]
        answers = greedy_answers(model, tokenizer, questions, batch_size=batch_size, device=device)
        metrics[split] = numeric_metrics(answers, references).as_dict()
        predictions[split] = answers
        examples[split] = list(zip(questions, references, answers, strict=True))[
            :_EXAMPLES_PER_SPLIT
        ]
    return Evaluation(metrics, predictions, examples)
