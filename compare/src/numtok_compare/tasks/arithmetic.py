"""Arithmetic written as text a pretrained tokenizer reads: ``"What is 347 + 589?"`` → ``"936"``.

Addition and subtraction of two operands; subtraction keeps the larger operand first, so every
answer is a non-negative integer (the number losses compare digits; a sign would be one more
token to learn). The splits, each drawn with its own fixed seed whatever the training seed, so
that every seed and every arm is scored on the same questions:

* ``train``: operands of 2 or 3 digits (10-999);
* ``validation``: the same difficulty, for choosing settings;
* ``test``: the same difficulty, scored once;
* ``test_harder``: operands of 4 digits (1000-9999), scored once;
* ``test_fresh_4_digit``: operands of 4 digits too, drawn with a seed of its own after every other
  split (so that adding it changed none of them): the fresh split of the pre-registered test of
  the lead ``test_harder`` produced (docs/compare.md).

No question appears in two splits (the later splits skip questions drawn before them).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["SPLITS", "Question", "arithmetic_splits", "draw_questions"]

#: The splits, in the order they are drawn (each skips the questions of the ones before).
SPLITS = ("test", "test_harder", "validation", "train", "test_fresh_4_digit")
_SEEDS = {"test": 11, "test_harder": 12, "validation": 13, "train": 14, "test_fresh_4_digit": 15}
_DIGITS = {
    "test": (2, 3),
    "test_harder": (4, 4),
    "validation": (2, 3),
    "train": (2, 3),
    "test_fresh_4_digit": (4, 4),
}


@dataclass(frozen=True)
class Question:
    """One question and its answer, as text."""

    question: str
    answer: str


def _operand(rng: random.Random, digits: tuple[int, int]) -> int:
    length = rng.randint(*digits)
    return rng.randint(10 ** (length - 1), 10**length - 1)


def draw_questions(
    count: int, digits: tuple[int, int], seed: int, exclude: set[str]
) -> list[Question]:
    """``count`` distinct questions with operands of ``digits`` = (fewest, most) digits, none of
    them in ``exclude``."""
    rng = random.Random(seed)
    drawn: dict[str, Question] = {}
    while len(drawn) < count:
        a, b = _operand(rng, digits), _operand(rng, digits)
        if rng.random() < 0.5:
            text, answer = f"What is {a} + {b}?", a + b
        else:
            a, b = max(a, b), min(a, b)
            text, answer = f"What is {a} - {b}?", a - b
        if text not in exclude and text not in drawn:
            drawn[text] = Question(text, str(answer))
    return list(drawn.values())


def arithmetic_splits(sizes: dict[str, int]) -> dict[str, list[Question]]:
    """The splits of the module docstring with ``sizes[split]`` questions each (the same for the
    same sizes, whatever else runs)."""
    unknown = set(sizes) - set(SPLITS)
    if unknown:
        raise ValueError(f"sizes names splits {sorted(unknown)}; the splits are {list(SPLITS)}")
    taken: set[str] = set()
    splits: dict[str, list[Question]] = {}
    for split in SPLITS:
        if split not in sizes:
            continue
        splits[split] = draw_questions(sizes[split], _DIGITS[split], _SEEDS[split], taken)
        taken.update(q.question for q in splits[split])
    return splits
