"""Number vocabularies and random batches shared by the loss tests: single digits, 1-3-digit chunks
(plain and word-prefixed digits, as GPT-2 has both) and custom float values."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
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
    name: str,
    shape: tuple[int, ...] = (3, 5),
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    ignore_index: int = -100,
) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(*shape, VOCABS[name][1], generator=generator, dtype=dtype)
    return logits.requires_grad_(), make_labels(name, shape, generator, ignore_index)


_SETTINGS: list[dict[str, Any]] = [
    {"shift": True},
    {"shift": True, "reduction": "none"},
    {"num_items_in_batch": 7},
    {"num_items_in_batch": 7, "reduction": "sum"},
    {"ignore_index": 0},
    {"reweigh": True, "shift": True, "num_items_in_batch": 3},
]


def _case(name: str, shape: tuple[int, ...], seed: int, label: str, **settings: Any) -> Any:
    return pytest.param(name, shape, seed, settings, id=f"{name}-{label}")


def _reference_cases() -> list[Any]:
    cases = [
        _case(name, (3, 5), 0, f"{kind_id}-reweigh={reweigh}-{reduction}", kind=kind,
              reweigh=reweigh, reduction=reduction)
        for name in VOCABS
        for kind, kind_id in zip(KINDS, KIND_IDS, strict=True)
        for reweigh in (False, True)
        for reduction in ("mean", "sum", "none")
    ]  # fmt: skip
    cases += [
        _case(name, (3, 5), 1, f"squash={factor}-reweigh={reweigh}", reweigh=reweigh,
              squash_factor=factor)
        for name in VOCABS
        for reweigh in (False, True)
        for factor in (1.5, 9.0, 50)
    ]  # fmt: skip
    cases += [
        _case(name, (2, 7), 2, f"{kind}-{extra}", kind=kind, **extra)
        for name in VOCABS
        for kind in ("was", "mse")
        for extra in _SETTINGS
    ]
    weights = torch.rand(2, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    weights[0, :3] = 0.0
    cases += [
        _case(name, (2, 6), 3, f"loss_weights-{kind}-{reduction}-shift={shift}", kind=kind,
              loss_weights=weights, reduction=reduction, shift=shift)
        for name in VOCABS
        for reduction in ("mean", "sum", "none")
        for shift in (False, True)
        for kind in ("was", "huber")
    ]  # fmt: skip
    for name, shape in [("digits", (13,)), ("chunks", (2, 3, 5)), ("custom", (7, 1))]:
        cases += [
            _case(name, shape, 4, f"{shape}-none-reweigh", reduction="none", reweigh=True),
            _case(name, shape, 4, f"{shape}-mse", kind="mse"),
        ]
    return cases


#: ``(name, shape, seed, settings)``: a batch ``make_batch(name, shape, seed, ignore_index=...)``
#: and the loss settings on which each loss path is compared with its reference — every kind ×
#: reweigh × reduction, squash factors, shift / num_items_in_batch / ignore_index, loss weights
#: and odd shapes. One list, so that the unfused and the fused paths meet the same cases.
REFERENCE_CASES = _reference_cases()
