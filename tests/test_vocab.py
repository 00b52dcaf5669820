from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from numtok import NumberVocab
from numtok.numbers.vocab import minus_token_kind


def _number_tokens(tokenizer: Any, vocab: NumberVocab) -> list[str]:
    return tokenizer.convert_ids_to_tokens(vocab.ids.tolist())


def _snapshot(tokenizer: Any) -> tuple[int, dict[str, int]]:
    return len(tokenizer), dict(tokenizer.get_vocab())


def test_digit_tokenizer_has_exactly_the_ten_digits(digit_tokenizer: Any) -> None:
    vocab = NumberVocab.from_tokenizer(digit_tokenizer)
    assert _number_tokens(digit_tokenizer, vocab) == list("0123456789")
    assert vocab.values.tolist() == list(range(10))
    assert vocab.digits == list("0123456789")
    assert vocab.lengths.tolist() == [1] * 10
    assert vocab.vocab_size == len(digit_tokenizer) == len(vocab) + 35
    assert vocab.ids.dtype == torch.long and vocab.values.is_floating_point()
    assert vocab.missing_digits() == []


def test_sentencepiece_prefixed_digits_and_look_alikes(sentencepiece_style_tokenizer: Any) -> None:
    tokenizer = sentencepiece_style_tokenizer
    vocab = NumberVocab.from_tokenizer(tokenizer)
    tokens = _number_tokens(tokenizer, vocab)
    assert sorted(tokens) == sorted([*"0123456789", *[f"▁{d}" for d in "0123456789"], "▁12"])
    value_of = dict(zip(tokens, vocab.values.tolist(), strict=True))
    assert value_of["▁7"] == value_of["7"] == 7 and value_of["▁12"] == 12
    for look_alike in ["١٢", "½", "1_000", "1e3", "inf", "-3", "1.5", "<0x37>", "▁"]:
        assert look_alike not in tokens
    audit = vocab.describe()
    for reason in ["byte-fallback token", "non-ASCII digit or numeral", "not only digits"]:
        assert reason in audit


def test_prefixed_and_multi_digit_switches(sentencepiece_style_tokenizer: Any) -> None:
    tokenizer = sentencepiece_style_tokenizer
    plain = NumberVocab.from_tokenizer(tokenizer, prefixed=False)
    assert _number_tokens(tokenizer, plain) == list("0123456789")
    assert "word-boundary prefix (prefixed=False)" in plain.describe()
    single = NumberVocab.from_tokenizer(tokenizer, multi_digit=False)
    assert "▁12" not in _number_tokens(tokenizer, single) and len(single) == 20
    assert "several digits (multi_digit=False)" in single.describe()


def test_llama3_style_chunks_keep_their_digit_strings(llama3_style_tokenizer: Any) -> None:
    tokenizer = llama3_style_tokenizer
    vocab = NumberVocab.from_tokenizer(tokenizer)
    assert len(vocab) == 10 + 100 + 1000
    by_token = dict(zip(_number_tokens(tokenizer, vocab), range(len(vocab)), strict=True))
    k = by_token["007"]
    assert vocab.digits[k] == "007" and vocab.values[k] == 7 and vocab.lengths[k] == 3
    assert vocab.group_lengths == [1, 2, 3]
    assert "1: 10, 2: 100, 3: 1000" in vocab.describe()
    # Each length is compared on its own scale: a 3-digit chunk's distances run 0 to 9.99.
    assert vocab.max_distance == pytest.approx(9.99)
    assert vocab.min_nonzero_distance == pytest.approx(0.01)
    assert tokenizer.tokenize("12345") == ["123", "45"]


def test_gpt2_byte_level_numbers(gpt2_tokenizer: Any) -> None:
    before = _snapshot(gpt2_tokenizer)
    vocab = NumberVocab.from_tokenizer(gpt2_tokenizer)
    assert _snapshot(gpt2_tokenizer) == before, "the tokenizer must not be modified"
    tokens = set(_number_tokens(gpt2_tokenizer, vocab))
    assert {"0", "9", "Ġ7", "Ġ2024", "123"} <= tokens
    assert vocab.vocab_size == 50257
    # GPT-2 has single digits with and without Ġ: twenty one-digit tokens.
    assert int((vocab.lengths == 1).sum()) == 20
    for token in ["½", "Ġinf", "ĠInfinity"]:
        assert token not in tokens
    assert vocab.missing_digits() == []


def test_mistral_sentencepiece_single_digits(mistral_tokenizer: Any) -> None:
    before = _snapshot(mistral_tokenizer)
    vocab = NumberVocab.from_tokenizer(mistral_tokenizer)
    assert _snapshot(mistral_tokenizer) == before
    assert sorted(_number_tokens(mistral_tokenizer, vocab)) == list("0123456789")
    assert vocab.vocab_size == 32000
    audit = vocab.describe()
    assert "byte-fallback token: 10" in audit  # <0x30> ... <0x39> are skipped, and said so
    ids = mistral_tokenizer("x 2024", add_special_tokens=False)["input_ids"]
    assert sum(int(i in set(vocab.ids.tolist())) for i in ids) == 4


def test_missing_digits_warn_and_are_reported() -> None:
    class OnlySomeDigits:
        def get_vocab(self) -> dict[str, int]:
            return {"a": 0, "1": 1, "2": 2, "▁3": 3}

        def __len__(self) -> int:
            return 4

    with pytest.warns(UserWarning, match=r"0, 4, 5, 6, 7, 8, 9"):
        vocab = NumberVocab.from_tokenizer(OnlySomeDigits())
    assert vocab.missing_digits() == list("0456789")
    assert "WARNING: no single-digit token for 0, 4, 5" in vocab.describe()


def test_padded_vocab_size(digit_tokenizer: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        vocab = NumberVocab.from_tokenizer(digit_tokenizer, vocab_size=64)
    assert vocab.vocab_size == 64
    assert vocab.tables().position_of_id.shape == (64,)
    with pytest.raises(
        ValueError, match=r"vocab_size=40 is smaller than the tokenizer, which has 45"
    ):
        NumberVocab.from_tokenizer(digit_tokenizer, vocab_size=40)


def test_from_values_digit_strings_and_numbers() -> None:
    vocab = NumberVocab.from_values({5: "007", 2: 3, 9: 2.5, 1: "12"}, vocab_size=10)
    assert vocab.ids.tolist() == [1, 2, 5, 9]
    assert vocab.values.tolist() == [12.0, 3.0, 7.0, 2.5]
    assert vocab.digits == ["12", "3", "007", "2.5"]
    assert vocab.lengths.tolist() == [2, 1, 3, 1]
    assert vocab.scaled_values.tolist() == pytest.approx([1.2, 3.0, 0.07, 2.5])
    tables = vocab.tables()
    assert tables.position_of_id.tolist() == [-1, 0, 1, -1, -1, 2, -1, -1, -1, 3]
    assert vocab.tables() is tables, "tables are built once per device"


def test_repr_and_len() -> None:
    vocab = NumberVocab.from_values({i: str(i) for i in range(10)}, vocab_size=12)
    assert len(vocab) == 10
    assert repr(vocab) == "NumberVocab(10 number tokens, vocab_size=12, digit lengths [1])"


@pytest.mark.parametrize(
    ("values", "vocab_size", "error", "message"),
    [
        ({}, 10, ValueError, "at least one token id"),
        ([1, 2], 10, TypeError, "values must be a mapping"),
        ({10: "1"}, 10, ValueError, r"token id 10 is outside the vocabulary \[0, 10\)"),
        ({-1: "1"}, 10, ValueError, r"token id -1 is outside"),
        ({"1": 1}, 10, TypeError, "token ids must be int, got '1'"),
        ({1: "1.5"}, 10, ValueError, "string of ASCII digits or a finite number, got '1.5'"),
        ({1: float("inf")}, 10, ValueError, "must be finite, got inf"),
        ({1: None}, 10, TypeError, "must be a number or a digit string, got NoneType"),
        ({1: "1"}, 0, ValueError, "vocab_size must be a positive int, got 0"),
    ],
)
def test_from_values_rejects_bad_input(
    values: Any, vocab_size: int, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        NumberVocab.from_values(values, vocab_size=vocab_size)


def test_from_tokenizer_rejects_bad_input() -> None:
    class NoDigits:
        def get_vocab(self) -> dict[str, int]:
            return {"a": 0, "b": 1, "1.5": 2}

    with pytest.raises(ValueError, match="has no number tokens"):
        NumberVocab.from_tokenizer(NoDigits())
    with pytest.raises(TypeError, match=r"get_vocab\(\) method .* got dict"):
        NumberVocab.from_tokenizer({"1": 1})
    with pytest.raises(TypeError, match="multi_digit must be a bool, got 'yes'"):
        NumberVocab.from_tokenizer(NoDigits(), multi_digit="yes")


# ------------------------------------------------------------------ what whole numbers are made of


def test_from_tokenizer_reads_the_grammar(gpt2_tokenizer: Any, mistral_tokenizer: Any) -> None:
    gpt2 = NumberVocab.from_tokenizer(gpt2_tokenizer)
    tokens = gpt2_tokenizer.convert_ids_to_tokens
    minus = tokens(list(gpt2.minus_ids))
    assert {"-", "Ġ-", "(-", "=-"} <= set(minus)
    assert not {"a-", "3-", "->"} & set(minus)
    # Runs of dashes are no signs: every minus token holds one minus, at its end.
    assert not {"--", "----", "Ġ--", "=-=-", "Ġ<!--"} & set(minus)
    assert all(t.count("-") == 1 and t.endswith("-") for t in minus), minus
    assert tokens(list(gpt2.decimal_point_ids)) == ["."]
    marked = tokens(list(gpt2.word_start_ids))
    assert "Ġ-" in marked and "Ġ123" in marked and "123" not in marked
    number_ids = set(gpt2.ids.tolist())
    assert all(
        t.startswith("Ġ")
        for i, t in zip(gpt2.word_start_ids, marked, strict=True)
        if i in number_ids
    )
    mistral = NumberVocab.from_tokenizer(mistral_tokenizer, multi_digit=False)
    assert {"-", "▁-"} <= set(mistral_tokenizer.convert_ids_to_tokens(list(mistral.minus_ids)))
    assert len(mistral) == 10
    assert repr(gpt2).startswith("NumberVocab(1691 number tokens")
    assert f"decimal_point_ids={list(gpt2.decimal_point_ids)}" in repr(gpt2)
    assert "whole numbers: minus signs '-', " in gpt2.describe()
    assert "decimal points '.'" in gpt2.describe()


def test_from_values_takes_the_whole_number_ids() -> None:
    digits = {i: str(i) for i in range(10)}
    vocab = NumberVocab.from_values(
        digits, vocab_size=14, minus_ids=[11, 10], decimal_point_ids=[12], word_start_ids=[11, 3]
    )
    assert (vocab.minus_ids, vocab.decimal_point_ids, vocab.word_start_ids) == (
        (10, 11),
        (12,),
        (3, 11),
    )
    plain = NumberVocab.from_values(digits, vocab_size=14)
    assert plain.minus_ids == plain.decimal_point_ids == plain.word_start_ids == ()
    assert "minus signs none, decimal points none, 0 word starts" in plain.describe()


@pytest.mark.parametrize(
    ("ids", "error", "message"),
    [
        ({"minus_ids": [30]}, ValueError, r"minus_ids holds 30, outside the vocabulary \[0, 30\)"),
        ({"minus_ids": 24}, TypeError, "minus_ids must be an iterable of int token ids, got 24"),
        ({"decimal_point_ids": "."}, TypeError, "decimal_point_ids must be an iterable"),
        (
            {"decimal_point_ids": ["."]},
            TypeError,
            r"decimal_point_ids must hold int token ids, got '\.'",
        ),
        ({"minus_ids": [3]}, ValueError, r"minus_ids must not be number tokens, got .*\[3\]"),
        ({"decimal_point_ids": [4]}, ValueError, r"decimal_point_ids must not be number tokens"),
        ({"minus_ids": [27], "decimal_point_ids": [27]}, ValueError, r"disjoint, both hold \[27\]"),
        (
            {"word_start_ids": [27]},
            ValueError,
            r"word_start_ids must be number tokens or minus_ids",
        ),
        (
            {"word_start_ids": [26], "decimal_point_ids": [26]},
            ValueError,
            r"got \[26\] \(neither\)",
        ),
    ],
)
def test_from_values_rejects_bad_whole_number_ids(
    ids: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        NumberVocab.from_values({i: str(i) for i in range(10)}, vocab_size=30, **ids)


@pytest.mark.parametrize(
    ("token", "kind"),
    [
        ("-", "minus"),
        ("\u2212", "minus"),
        ("Ġ-", "sign"),
        ("▁-", "sign"),
        (" -", "sign"),
        ("(-", "sign"),
        ("=-", "sign"),
        ("--", None),
        ("----", None),
        ("Ġ--", None),
        ("=-=-", None),
        ("\u2212-", None),
        ("Ġ(-", "sign"),
        ("a-", None),
        ("3-", None),
        (").-", None),
        ("->", None),
        ("", None),
    ],
)
def test_minus_token_kind(token: str, kind: str | None) -> None:
    assert minus_token_kind(token) == kind


def test_describe_does_not_depend_on_the_order_of_get_vocab(gpt2_tokenizer: Any) -> None:
    """A fast tokenizer's get_vocab() comes from a hash map whose order changes from process to
    process; the audit, its examples of skipped tokens included, must not."""

    class Reordered:
        def __init__(self, order: int) -> None:
            self.items = sorted(gpt2_tokenizer.get_vocab().items(), key=lambda kv: kv[1])
            if order:
                self.items = self.items[::-1]

        def get_vocab(self) -> dict[str, int]:
            return dict(self.items)

        def __len__(self) -> int:
            return len(self.items)

    forward, backward = (NumberVocab.from_tokenizer(Reordered(o)).describe() for o in (0, 1))
    assert "skipped 17 digit-like tokens" in forward
    assert forward == backward
