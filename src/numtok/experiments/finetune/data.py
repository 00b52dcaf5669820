"""The examples of a fine-tuning comparison, encoded for the model's tokenizer.

* ``arithmetic``: :func:`numtok.experiments.finetune.arithmetic.arithmetic_splits`;
* ``rjokes``: the rJokes data (:func:`numtok.experiments.rjokes.data.load_rjokes`): the
  training jokes (``train_examples`` of them, a fixed subset), the held-out validation jokes and
  the test jokes (``validation_examples`` / ``test_examples`` of them, fixed subsets), each cut
  to its first ``max_prompt_tokens`` tokens and asked as ``"How funny is this joke, on a scale
  from 0 to 11? ..."``; the answer is the score.

The evaluation splits are ``validation`` while choosing settings, else ``test`` (and, for
arithmetic, ``test_harder``: 4-digit operands).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from numtok.experiments.finetune.arithmetic import arithmetic_splits
from numtok.experiments.finetune.config import FinetuneConfig
from numtok.experiments.finetune.examples import Encoded, encode

__all__ = ["HIGHEST_SCORE", "JOKE_QUESTION", "FinetuneData", "load_finetune_data"]

#: rJokes scores run from 0 to this.
HIGHEST_SCORE = 11
JOKE_QUESTION = f"How funny is this joke, on a scale from 0 to {HIGHEST_SCORE}?\n\n"

FinetuneData = dict[str, list[Encoded]]


def _evaluation_splits(config: FinetuneConfig) -> tuple[str, ...]:
    if config.evaluate_on == "validation":
        return ("validation",)
    return ("test", "test_harder") if config.task == "arithmetic" else ("test",)


def _joke_question(tokenizer: Any, joke: str, max_tokens: int) -> str:
    ids = tokenizer(joke, add_special_tokens=False)["input_ids"][:max_tokens]
    joke_start: str = tokenizer.decode(ids).strip()
    return JOKE_QUESTION + joke_start


def load_finetune_data(
    config: FinetuneConfig, tokenizer: Any, data_dir: Path | str | None = None
) -> FinetuneData:
    """``{"train": [...], <each evaluation split>: [...]}`` for ``config`` (see the module
    docstring); ``data_dir``: the rJokes data folder (None: where :mod:`numtok.experiments.
    rjokes.data` finds it)."""
    wanted = _evaluation_splits(config)
    if config.task == "arithmetic":
        sizes = {
            "train": config.train_examples,
            "validation": config.validation_examples,
            "test": config.test_examples,
            "test_harder": config.harder_examples,
        }
        splits = arithmetic_splits(sizes)
        return {
            split: [encode(tokenizer, q.question, q.answer) for q in splits[split]]
            for split in ("train", *wanted)
        }
    from numtok.experiments.rjokes.data import evaluation_subset, load_rjokes

    jokes = load_rjokes(data_dir, validation_jokes=config.validation_examples)
    chosen = {
        "train": evaluation_subset(jokes.train, config.train_examples),
        "validation": jokes.validation,
        "test": evaluation_subset(jokes.test, config.test_examples),
    }
    return {
        split: [
            encode(tokenizer, _joke_question(tokenizer, text, config.max_prompt_tokens), str(score))
            for text, score in chosen[split]
        ]
        for split in ("train", *wanted)
    }
