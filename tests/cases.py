"""Number vocabularies and random batches shared by the loss tests: single digits, 1-3-digit chunks
(plain and word-prefixed digits, as GPT-2 has both) and custom float values."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from numtok import NumberVocab

DIGITS: dict[int, str | float] = {3 + d: str(d) for d in range(10)}  # ids 3..12 in V=17
# Tokenizers with 1-3 digit chunks: "0".."9", "00".."99" (every 7th) and "000".."999" (every 97th).
CHUNKS: dict[int, str | float] = {
    **{d: str(d) for d in range(10)},
    **{10 + d: str(d) for d in range(10)},  # the same digits again, as word-prefixed tokens
    **{20 + k: f"{i:02d}" for k, i in enumerate(range(0, 100, 7))},  # ids 20..34
    **{40 + k: f"{i:03d}" for k, i in enumerate(range(0, 1000, 97))},  # ids 40..50
}
CUSTOM: dict[int, str | float] = {1: 0.5, 4: -2.0, 6: 3.25, 7: 10.0}
VOCABS: dict[str, tuple[Mapping[int, str | float], int]] = {
    "digits": (DIGITS, 17),
    "chunks": (CHUNKS, 59),
    "custom": (CUSTOM, 11),
}
KINDS: list[Any] = ["was", "mse", "mae", "huber", lambda p, t: (p - t).abs() ** 1.5]
KIND_IDS = ["was", "mse", "mae", "huber", "callable"]


def make_vocab(name: str) -> NumberVocab:
    values, vocab_size = VOCABS[name]
    return NumberVocab.from_values(dict(values), vocab_size=vocab_size)


def make_labels(
    name: str, shape: tuple[int, ...], generator: torch.Generator, ignore_index: int = -100
) -> torch.Tensor:
    """Labels mixing number tokens (~65%), other tokens (~25%) and ignore_index (~10%)."""
    values, vocab_size = VOCABS[name]
    number_ids = torch.tensor(sorted(values))
    labels = number_ids[torch.randint(len(number_ids), shape, generator=generator)]
    text = torch.randint(vocab_size, shape, generator=generator)
    choice = torch.rand(shape, generator=generator)
    labels = torch.where(choice < 0.25, text, labels)
    return torch.where(choice > 0.9, torch.full_like(labels, ignore_index), labels)


def make_batch(
    name: str, shape: tuple[int, ...] = (3, 5), seed: int = 0, dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(*shape, VOCABS[name][1], generator=generator, dtype=dtype)
    return logits.requires_grad_(), make_labels(name, shape, generator)
