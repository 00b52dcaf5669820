"""Questions and answers as a pretrained chat model reads them (their batches:
:mod:`numtok_compare.runner.batches`).

A prompt is the question in the tokenizer's chat template after a short system message
(:data:`SYSTEM`; a template's default system message can be longer than the question), ending
where the assistant's answer starts (``add_generation_prompt=True``; a tokenizer without a
template gets ``"{question}\\n"``).
The answer is its digits and the end-of-turn token (the tokenizer's ``eos_token``), and only the
answer is trained on: the prompt's labels are ``-100``.
"""

from __future__ import annotations

from typing import Any

from numtok_compare.runner.batches import Encoded

__all__ = ["SYSTEM", "encode", "encode_prompt"]

SYSTEM = "Answer with the number only."


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
