"""Questions and answers as a pretrained chat model reads them, and their batches.

A prompt is the question in the tokenizer's chat template after a short system message
(:data:`SYSTEM`; a template's default system message can be longer than the question), ending
where the assistant's answer starts (``add_generation_prompt=True``; a tokenizer without a
template gets ``"{question}\\n"``).
The answer is its digits and the end-of-turn token (the tokenizer's ``eos_token``), and only the
answer is trained on: the prompt's labels are ``-100``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from numtok_compare.objectives import IGNORE_INDEX

__all__ = ["SYSTEM", "Encoded", "encode", "encode_prompt", "prompt_batch", "training_batch"]

SYSTEM = "Answer with the number only."


@dataclass(frozen=True)
class Encoded:
    """One example's token ids: the prompt and the answer (its end-of-turn token included), and
    the answer's value."""

    prompt: tuple[int, ...]
    answer: tuple[int, ...]
    value: float


def encode_prompt(tokenizer: Any, question: str) -> tuple[int, ...]:
    """The question as a chat turn, up to where the assistant's answer starts."""
    if getattr(tokenizer, "chat_template", None):
        turns = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        ids = tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids  # a BatchEncoding in 5.x
        return tuple(int(i) for i in ids)
    return tuple(tokenizer(f"{question}\n", add_special_tokens=False)["input_ids"])


def encode(tokenizer: Any, question: str, answer: str) -> Encoded:
    answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
    end = tokenizer.eos_token_id
    if end is None:
        raise ValueError("the tokenizer has no eos_token: the answer needs an end to learn")
    return Encoded(encode_prompt(tokenizer, question), (*answer_ids, end), float(answer))


def training_batch(examples: Sequence[Encoded], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (B, T): the labels are the
    inputs on the answer and ``-100`` on the prompt and the padding (the loss shifts them)."""
    rows = [(list(e.prompt) + list(e.answer), len(e.prompt)) for e in examples]
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for row, (ids, prompt_length) in enumerate(rows):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, prompt_length : len(ids)] = torch.tensor(ids[prompt_length:])
        attention_mask[row, : len(ids)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


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
