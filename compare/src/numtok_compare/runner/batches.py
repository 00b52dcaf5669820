"""Examples as token ids, and the batches the Trainer and the scoring read.

An example is a prompt and its answer (:class:`Encoded`); only the answer is trained on: the
prompt's labels are ``-100``. :func:`training_batch` right-pads rows; :func:`answer_batch`
left-pads them so that every row's answer ends at the last column, and asks the model for the
logits of the last columns only (``logits_to_keep``), where every label is: with a large
vocabulary and short answers, the output layer is most of a step, and this skips it at the
prompt positions, whose labels are ``-100`` and carry no loss. :func:`regression_batch` adds a
regression head's targets; :func:`prompt_batch` left-pads prompts for generation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from numtok_compare.objectives import IGNORE_INDEX

__all__ = [
    "Encoded",
    "answer_batch",
    "answer_scale",
    "prompt_batch",
    "regression_batch",
    "training_batch",
]


@dataclass(frozen=True)
class Encoded:
    """One example's token ids: the prompt and the answer (its end token included), and the
    answer's value."""

    prompt: tuple[int, ...]
    answer: tuple[int, ...]
    value: float


def _padded(examples: Sequence[Encoded], pad_id: int, *, left: bool) -> dict[str, torch.Tensor]:
    """``input_ids``, ``attention_mask`` and ``labels`` (B, T) of ``prompt + answer`` rows padded
    on the right (or the ``left``): the labels are the inputs on the answer and ``-100`` on the
    prompt and the padding (the loss shifts them)."""
    rows = [(list(e.prompt) + list(e.answer), len(e.prompt)) for e in examples]
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for row, (ids, prompt_length) in enumerate(rows):
        start = width - len(ids) if left else 0
        end = start + len(ids)
        input_ids[row, start:end] = torch.tensor(ids)
        labels[row, start + prompt_length : end] = torch.tensor(ids[prompt_length:])
        attention_mask[row, start:end] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def training_batch(examples: Sequence[Encoded], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (B, T): the labels are the
    inputs on the answer and ``-100`` on the prompt and the padding (the loss shifts them)."""
    return _padded(examples, pad_id, left=False)


def answer_scale(examples: Sequence[Encoded]) -> tuple[float, float]:
    """The answers' mean and standard deviation (a regression head's targets are standardised
    by the training answers')."""
    values = torch.tensor([e.value for e in examples], dtype=torch.float64)
    return float(values.mean()), float(values.std().clamp_min(1e-6))


def regression_batch(
    examples: Sequence[Encoded], pad_id: int, scale: tuple[float, float]
) -> dict[str, torch.Tensor]:
    """:func:`training_batch` and the standardised answers ``targets`` (B,) =
    ``(value − mean) / std`` for ``scale`` = (mean, std), a regression head's batch."""
    batch = training_batch(examples, pad_id)
    values = torch.tensor([e.value for e in examples], dtype=torch.float32)
    batch["targets"] = (values - scale[0]) / scale[1]
    return batch


def answer_batch(examples: Sequence[Encoded], pad_id: int) -> dict[str, torch.Tensor | int]:
    """Left-padded ``input_ids`` and ``attention_mask`` (B, T), ``logits_to_keep`` = K = the
    longest answer + 1, and the ``labels`` (B, K) of the last K columns (the answers, ``-100``
    elsewhere). A causal LM called with them computes logits (B, K, V) at those columns only;
    the loss shifts them as it would the full row's, so its value is the full row's: the first
    of the K columns is a prompt token whose label is never read, and every answer token is
    predicted from the column before it, which the K columns include."""
    padded = _padded(examples, pad_id, left=True)
    kept = max(len(e.answer) for e in examples) + 1
    return {**padded, "labels": padded["labels"][:, -kept:], "logits_to_keep": kept}


def prompt_batch(prompts: Sequence[Sequence[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Left-padded ``input_ids`` and ``attention_mask`` (B, T), for generation: every prompt ends
    at the last column."""
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, ids in enumerate(prompts):
        input_ids[row, width - len(ids) :] = torch.tensor(list(ids))
        attention_mask[row, width - len(ids) :] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask}
