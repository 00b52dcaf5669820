"""Rewards for reinforcement learning on numeric answers: a function for TRL's ``reward_funcs``
(``GRPOTrainer``, ``RLOOTrainer``) that scores how close the number a completion ends with is to
the reference, bounded in [0, 1], so that a near miss earns more than a far one (NTL's idea, for
sampled completions).

    from numtok.hf import number_reward
    trainer = GRPOTrainer(model=..., reward_funcs=[number_reward("answer")], train_dataset=data)

Nothing here imports ``transformers`` or ``trl``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from numtok._common.validation import check_number
from numtok.numbers.text import last_number

__all__ = ["number_reward"]

#: ``reward(completions, **columns) -> one float per completion``: TRL's reward function.
RewardFunction = Callable[..., list[float]]


def _text_of(completion: object) -> str:
    """A completion's text: a string, or a conversation's last message's content."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    raise TypeError(
        "a completion must be a string or a conversation (a list of {'role', 'content'} "
        f"messages), got {type(completion).__name__}"
    )


def _reference_value(reference: object, column: str) -> float:
    if isinstance(reference, (int, float)) and not isinstance(reference, bool):
        value: float | None = float(reference)
    elif isinstance(reference, str):
        value = last_number(reference)
    else:
        value = None
    if value is None or not math.isfinite(value):
        raise ValueError(
            f"the reference in column {column!r} must be a finite number or a text that ends "
            f"with one, got {reference!r}"
        )
    return value


def number_reward(answer_column: str = "answer", *, scale: float | None = None) -> RewardFunction:
    """A reward function for TRL: for each completion, the last number it states
    (:func:`numtok.last_number`, the paper's reading of a generation) against the reference
    number ``y`` in the dataset's column ``answer_column``:

        reward = 1 / (1 + |ŷ - y| / s),     s = ``scale``, or max(|y|, 1) when None

    1 for the exact number, 1/2 at a distance of ``s`` (by default a relative error of 100 %, or an
    absolute error of 1 below 1), towards 0 far away; 0 where the completion states no number.
    Completions may be strings or conversations (the last message's content is read); the
    reference a number or a text that ends with one (``"#### 42"``). The function is named
    ``number_reward``, so TRL logs ``rewards/number_reward/mean``.

    Raises (when called): ``ValueError`` for a missing column or a reference without a number.
    """
    if not isinstance(answer_column, str):
        raise TypeError(f"answer_column must be a column name (str), got {answer_column!r}")
    fixed_scale = (
        None
        if scale is None
        else check_number("scale", scale, minimum=0, inclusive=False, or_none=True)
    )

    def number_reward(completions: Sequence[Any], **columns: Any) -> list[float]:
        if answer_column not in columns:
            raise ValueError(
                f"number_reward reads the reference from the dataset's column {answer_column!r}, "
                f"which the trainer did not pass; the columns it passed: {sorted(columns)}"
            )
        references = columns[answer_column]
        rewards = []
        for completion, reference in zip(completions, references, strict=True):
            target = _reference_value(reference, answer_column)
            predicted = last_number(_text_of(completion))
            if predicted is None or not math.isfinite(predicted):
                rewards.append(0.0)
                continue
            spread = fixed_scale if fixed_scale is not None else max(abs(target), 1.0)
            rewards.append(1.0 / (1.0 + abs(predicted - target) / spread))
        return rewards

    return number_reward
