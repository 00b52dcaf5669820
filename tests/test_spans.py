"""numtok.numbers.spans: whole numbers in token ids (find_number_spans, span_values), against a
plain loop reference."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, NamedTuple

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from numtok import NumberVocab
from numtok.numbers.spans import NumberSpans, find_number_spans, span_values
from numtok.numbers.text import find_numbers

# ------------------------------------------------------------------ tokens: a plain reference


class TokenKind(NamedTuple):
    """How the reference scanner sees a token: ``digits`` for number tokens, ``marked`` for a
    word-boundary marker, ``minus``/``point`` for the span grammar's other tokens."""

    digits: str | None = None
    marked: bool = False
    minus: bool = False
    point: bool = False


class ReferenceSpan(NamedTuple):
    positions: list[int]  # every position of the span, minus sign and decimal point included
    numbers: list[tuple[int, int]]  # (position, place) of each number token
    text: str  # the decimal number the span writes, e.g. "-12.34"
    negative: bool


def token_kinds(vocab: NumberVocab) -> dict[int, TokenKind]:
    """Read a NumberVocab's span grammar into plain Python (ids absent here are ordinary
    tokens)."""
    marked = set(vocab.word_start_ids)
    kinds = {
        i: TokenKind(digits=d, marked=i in marked)
        for i, d in zip(vocab.ids.tolist(), vocab.digits, strict=True)
    }
    kinds |= {i: TokenKind(minus=True, marked=i in marked) for i in vocab.minus_ids}
    kinds |= {i: TokenKind(point=True) for i in vocab.decimal_point_ids}
    return kinds


def reference_spans(row: list[int], kinds: dict[int, TokenKind]) -> list[ReferenceSpan]:
    """The span grammar of find_number_spans, read left to right with a plain loop."""
    kind = [kinds.get(token, TokenKind()) for token in row]
    is_digits = [k.digits is not None for k in kind]
    unmarked_digits = [d and not k.marked for d, k in zip(is_digits, kind, strict=True)]
    spans: list[ReferenceSpan] = []
    i = 0
    while i < len(row):
        next_unmarked = i + 1 < len(row) and unmarked_digits[i + 1]
        after_number = i > 0 and (is_digits[i - 1] or kind[i - 1].point)
        if kind[i].minus and next_unmarked and (kind[i].marked or not after_number):
            positions, j, negative = [i], i + 1, True
        elif is_digits[i]:
            positions, j, negative = [], i, False
        else:
            i += 1
            continue
        run = [j]
        j += 1
        while j < len(row) and unmarked_digits[j]:
            run.append(j)
            j += 1
        fraction: list[int] = []
        if j + 1 < len(row) and kind[j].point and unmarked_digits[j + 1]:
            positions.append(j)
            j += 1
            while j < len(row) and unmarked_digits[j]:
                fraction.append(j)
                j += 1
        integer_text = "".join(str(kind[t].digits) for t in run)
        fraction_text = "".join(str(kind[t].digits) for t in fraction)
        numbers = []
        remaining = len(integer_text)
        for t in run:
            remaining -= len(str(kind[t].digits))
            numbers.append((t, remaining))
        place = 0
        for t in fraction:
            place -= len(str(kind[t].digits))
            numbers.append((t, place))
        text = ("-" if negative else "") + integer_text
        if fraction:
            text += "." + fraction_text
        spans.append(ReferenceSpan(sorted(positions + run + fraction), numbers, text, negative))
        i = j
    return spans


def assert_value_within_precision(spans: NumberSpans, index: int, text: str) -> None:
    """``spans.values[index]`` is what NumberSpans promises for the decimal number ``text``:
    ``float(text)`` itself where ``spans.exact`` (always for an integer of at most 18 digits),
    otherwise within a relative error of ``(K + 5) · 2**-53`` for K number tokens."""
    value, expected = float(spans.values[index]), float(text)
    digits = sum(c.isdigit() for c in text)
    if "." not in text and digits <= 18:
        assert bool(spans.exact[index]), text
    if bool(spans.exact[index]) or math.isinf(expected) or expected == 0:
        assert value == expected, text
        return
    tokens = int((spans.number_span == index).sum())
    error = abs(Fraction(value) - Fraction(text)) / abs(Fraction(text))
    assert error <= Fraction(tokens + 5, 2**53), (text, value)


def assert_spans_match_reference(token_ids: torch.Tensor, vocab: NumberVocab) -> NumberSpans:
    spans = find_number_spans(token_ids, vocab)
    kinds = token_kinds(vocab)
    rows = token_ids.reshape(-1, token_ids.shape[-1]).tolist()
    width = token_ids.shape[-1]
    expected = [(r, s) for r, row in enumerate(rows) for s in reference_spans(row, kinds)]
    assert len(spans) == len(expected)
    span_of_token = spans.span_of_token.reshape(-1).tolist()
    in_any_span = {r * width + p for r, s in expected for p in s.positions}
    assert [i for i, s in enumerate(span_of_token) if s >= 0] == sorted(in_any_span)
    number_place = dict(
        zip(spans.number_positions.tolist(), spans.number_place.tolist(), strict=True)
    )
    for index, (r, span) in enumerate(expected):
        flat = [r * width + p for p in span.positions]
        assert [span_of_token[p] for p in flat] == [index] * len(flat)
        assert (int(spans.start[index]), int(spans.end[index])) == (flat[0], flat[-1] + 1)
        assert int(spans.first_number[index]) == r * width + span.numbers[0][0]
        assert bool(spans.negative[index]) == span.negative
        assert {r * width + p: place for p, place in span.numbers} == {
            p: number_place[p] for p in (r * width + q for q, _ in span.numbers)
        }
        assert_value_within_precision(spans, index, span.text)
    return spans


# ------------------------------------------------------------------ tokens: a synthetic vocabulary

# ids: 0-9 digits, 10-19 marked digits ("Ġ0".."Ġ9"), 20 "12", 21 "345", 22 "007", 23 "Ġ45",
# 24 "-", 25 "Ġ-", 26 ".", 27-29 words.
SYNTHETIC_DIGITS = {i: str(i) for i in range(10)} | {10 + i: str(i) for i in range(10)}
SYNTHETIC_DIGITS |= {20: "12", 21: "345", 22: "007", 23: "45"}


@pytest.fixture(scope="module")
def synthetic() -> NumberVocab:
    return NumberVocab.from_values(
        SYNTHETIC_DIGITS,
        vocab_size=30,
        minus_ids=[24, 25],
        decimal_point_ids=[26],
        word_start_ids=[*range(10, 20), 23, 25],
    )


@pytest.mark.parametrize(
    ("ids", "values"),
    [
        ([1, 2, 27, 3], [12.0, 3.0]),
        ([24, 1, 2, 26, 3, 4], [-12.34]),
        ([20, 21, 7], [123457.0]),  # place value across chunks: 12|345|7
        ([22, 26, 22], [7.007]),  # "007.007"
        ([1, 11, 2], [1.0, 12.0]),  # a marked digit starts a new number
        ([1, 23], [1.0, 45.0]),
        ([3, 24, 4], [3.0, 4.0]),  # an unmarked minus after a number is an operator
        ([3, 25, 4], [3.0, -4.0]),  # a marked one is a sign
        ([3, 26, 24, 4], [3.0, 4.0]),  # "3.-4": no sign right after a point, as in text
        ([26, 24, 4], [4.0]),
        ([27, 24, 14], [4.0]),  # a minus before a marked digit is no sign ("- 4")
        ([1, 26, 2, 26, 3], [1.2, 3.0]),
        ([1, 26, 2, 26, 3, 26, 4], [1.2, 3.4]),
        ([1, 26, 2, 26, 3, 26, 4, 26, 5], [1.2, 3.4, 5.0]),
        ([1, 26, 27, 2], [1.0, 2.0]),
        ([1, 26, 12], [1.0, 2.0]),  # a marked digit after the point is not a decimal
        ([1, -100, 2], [1.0, 2.0]),  # ignore_index ends a number
        ([24, 24, 1], [-1.0]),
        ([27, 28, 29], []),
        ([-100, -100], []),
    ],
)
def test_span_grammar_examples(synthetic: NumberVocab, ids: list[int], values: list[float]) -> None:
    spans = assert_spans_match_reference(torch.tensor([ids]), synthetic)
    assert spans.values.tolist() == values


@given(
    st.lists(
        st.lists(st.sampled_from([*range(30), -100]), min_size=1, max_size=12),
        min_size=1,
        max_size=4,
    ).map(lambda rows: [r + [-100] * (12 - len(r)) for r in rows])
)
@settings(max_examples=300, deadline=None)
def test_span_finder_matches_the_reference_on_random_token_sequences(
    synthetic: NumberVocab, rows: list[list[int]]
) -> None:
    assert_spans_match_reference(torch.tensor(rows), synthetic)


def test_batches_of_any_shape_and_span_positions(synthetic: NumberVocab) -> None:
    ids = torch.tensor([[[1, 2, 27], [24, 3, 27]], [[27, 27, 27], [20, 26, 5]]])  # (2, 2, 3)
    spans = assert_spans_match_reference(ids, synthetic)
    assert spans.span_of_token.shape == ids.shape
    assert spans.values.tolist() == [12.0, -3.0, 12.5]
    assert spans.start.tolist() == [0, 3, 9]
    assert spans.end.tolist() == [2, 5, 12]
    assert spans.first_number.tolist() == [0, 4, 9]
    assert spans.digits.tolist() == [2, 1, 3]
    assert spans.fraction_digits.tolist() == [0, 0, 1]
    one_row = find_number_spans(torch.tensor([20, 26, 5]), synthetic)
    assert one_row.values.tolist() == [12.5]


def test_ignore_index_can_be_chosen(synthetic: NumberVocab) -> None:
    spans = find_number_spans(torch.tensor([[1, 0, 2]]), synthetic, ignore_index=0)
    assert spans.values.tolist() == [1.0, 2.0]


# ------------------------------------------------------------------ tokens: real tokenizers

TOKENIZERS = ["digit_tokenizer", "llama3_style_tokenizer", "gpt2_tokenizer", "mistral_tokenizer"]


@pytest.fixture(scope="module", params=TOKENIZERS)
def tokenizer_and_spans(request: pytest.FixtureRequest) -> tuple[Any, NumberVocab]:
    tokenizer = request.getfixturevalue(request.param)
    return tokenizer, NumberVocab.from_tokenizer(tokenizer)


def _encode(tokenizer: Any, text: str) -> torch.Tensor:
    return torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])


@pytest.mark.parametrize(
    "text",
    [
        "x = -12.34 and 1234567 or 3-4, then 1.2.3.4 and -0.05",
        "12 34 -7",
        "007 apples",
        "9876543210.0123",
    ],
)
def test_spans_read_text_like_find_numbers(
    tokenizer_and_spans: tuple[Any, NumberVocab], text: str
) -> None:
    tokenizer, vocab = tokenizer_and_spans
    ids = _encode(tokenizer, text)
    spans = assert_spans_match_reference(ids, vocab)
    assert spans.values.tolist() == find_numbers(text)
    assert bool(spans.exact.all())


def test_thousands_separators_in_tokens_are_two_numbers(
    tokenizer_and_spans: tuple[Any, NumberVocab],
) -> None:
    tokenizer, vocab = tokenizer_and_spans
    assert find_number_spans(_encode(tokenizer, "1,234"), vocab).values.tolist() == [1.0, 234.0]


@given(st.integers(min_value=-(10**15), max_value=10**15), st.integers(0, 3))
@settings(max_examples=25, deadline=None)
def test_span_values_of_tokenised_numbers_are_the_numbers(
    tokenizer_and_spans: tuple[Any, NumberVocab], n: int, decimals: int
) -> None:
    tokenizer, vocab = tokenizer_and_spans
    text = f"{n / 10**decimals:.{decimals}f}" if decimals else str(n)
    for context in (text, f"x = {text} and", f"({text})"):
        spans = find_number_spans(_encode(tokenizer, context), vocab)
        assert spans.values.tolist() == [float(text)], (context, spans)
        assert spans.exact.tolist() == [True]


# ------------------------------------------------------------------ tokens: exactness and range


def _digits_ids(digits: str) -> list[int]:
    return [int(d) for d in digits]


def _decimal_ids(text: str) -> list[int]:
    """Synthetic ids of a decimal number written with single digits."""
    return [26 if c == "." else 24 if c == "-" else int(c) for c in text]


def test_exactness_flag(synthetic: NumberVocab) -> None:
    below = str(2**53 - 1)  # 16 digits as one integer, below 2**53
    above = str(2**53 + 1)  # not a float64, but an integer of at most 18 digits: rounded once
    digits_19 = str(10**18 + 1)  # not a float64, and beyond int64's 18 digits
    decimal_above = "9007199254.740993"  # 16 digits, 2**53 + 1 as one integer: rounded twice
    places_22 = "0." + "0" * 21 + "1"  # 1e-22 = 1 / 10**22, both exact
    places_23 = "0." + "0" * 22 + "1"  # 10**23 is not a float64
    digits_22 = "1." + "0" * 21 + "1"  # 22 places, but 10**22 + 1 is not below 2**53
    texts = [below, above, digits_19, decimal_above, places_22, places_23, digits_22]
    ids = [token for text in texts for token in [*_decimal_ids(text), 27]]
    spans = find_number_spans(torch.tensor(ids), synthetic)
    assert spans.exact.tolist() == [True, True, False, False, True, False, False]
    assert spans.values[0] == float(below) and spans.values[4] == float(places_22)
    assert spans.values[1] == float(above)
    for value, text in zip(spans.values.tolist(), texts, strict=True):
        assert value == pytest.approx(float(text), rel=1e-15)


# Single digits (ids 0-9) and every 3-digit chunk "000".."999" (ids 10-1009), a minus (1010) and a
# decimal point (1011): a number can be written with any mix of them.
CHUNKS = {i: str(i) for i in range(10)} | {10 + i: f"{i:03d}" for i in range(1000)}


@pytest.fixture(scope="module")
def chunks() -> NumberVocab:
    return NumberVocab.from_values(
        CHUNKS, vocab_size=1012, minus_ids=[1010], decimal_point_ids=[1011]
    )


def _chunked_ids(text: str, cuts: list[bool]) -> list[int]:
    """``text`` (``-``, digits, ``.``) as token ids: each digit alone, or (where ``cuts`` says
    so) three digits at once."""
    ids, i, cut = [], 0, iter(cuts * len(text))
    while i < len(text):
        if text[i] in "-.":
            ids.append(1010 if text[i] == "-" else 1011)
            i += 1
        elif text[i : i + 3].isdigit() and len(text[i : i + 3]) == 3 and next(cut):
            ids.append(10 + int(text[i : i + 3]))
            i += 3
        else:
            ids.append(int(text[i]))
            i += 1
    return ids


@given(
    st.integers(min_value=-(10**18) + 1, max_value=10**18 - 1),
    st.lists(st.booleans(), min_size=1, max_size=6),
)
@example(34500000123453451, [False])  # one ulp away from float(text) when summed in float64
@example(10**18 - 1, [True])
@settings(max_examples=300, deadline=None)
def test_integers_of_at_most_18_digits_are_exact(
    chunks: NumberVocab, n: int, cuts: list[bool]
) -> None:
    spans = find_number_spans(torch.tensor(_chunked_ids(str(n), cuts)), chunks)
    assert spans.values.tolist() == [float(str(n))]
    assert spans.exact.tolist() == [True]


@given(
    st.integers(min_value=1, max_value=10**60),
    st.integers(min_value=0, max_value=30),
    st.booleans(),
    st.lists(st.booleans(), min_size=1, max_size=6),
)
@settings(max_examples=300, deadline=None)
def test_longer_numbers_are_within_the_stated_precision(
    chunks: NumberVocab, n: int, places: int, negative: bool, cuts: list[bool]
) -> None:
    digits = str(n).rjust(places + 1, "0")
    text = ("-" if negative else "") + digits[: len(digits) - places]
    text += "." + digits[len(digits) - places :] if places else ""
    spans = find_number_spans(torch.tensor(_chunked_ids(text, cuts)), chunks)
    assert len(spans) == 1
    assert_value_within_precision(spans, 0, text)


def test_numbers_beyond_float64(synthetic: NumberVocab) -> None:
    huge = [24, 1, *_digits_ids("0" * 400)]  # -1e400
    long_fraction = [1, 26, *_digits_ids("0" * 400), 1]  # 1.000...001
    leading_zeros = _digits_ids("0" * 400 + "5")
    ids = torch.tensor([[*huge, 27, *long_fraction, 27, *leading_zeros]])
    spans = find_number_spans(ids, synthetic)
    assert spans.values.tolist() == [-math.inf, 1.0, 5.0]
    assert spans.exact.tolist() == [False, False, True]  # 5 is exactly 5
    assert spans.digits.tolist() == [401, 402, 401]


def test_span_values_assembles_any_token_values(synthetic: NumberVocab) -> None:
    spans = find_number_spans(torch.tensor([24, 20, 26, 5, 27, 3]), synthetic)  # -12.5, 3
    assert torch.equal(span_values(spans.values.new_tensor([12.0, 5.0, 3.0]), spans), spans.values)
    halves = span_values(torch.tensor([1.5, 0.5, 2.0]), spans)  # -(1.5 + 0.5/10), 2
    assert halves.tolist() == [-1.55, 2.0]
    with pytest.raises(ValueError, match=r"one value per number token of the spans, shape \(3,\)"):
        span_values(torch.zeros(2), spans)


# ------------------------------------------------------------------ tokens: bad input


def test_spans_need_number_tokens_that_are_digit_strings() -> None:
    with pytest.raises(ValueError, match=r"digit strings; token id 3 has the value '2\.5'"):
        find_number_spans(torch.tensor([3]), NumberVocab.from_values({3: 2.5}, vocab_size=5))
    with pytest.raises(ValueError, match="at most 18 digits; token id 2 has 19"):
        find_number_spans(torch.tensor([2]), NumberVocab.from_values({2: "1" * 19}, vocab_size=5))


def test_find_number_spans_bad_input(synthetic: NumberVocab) -> None:
    with pytest.raises(TypeError, match="vocab must be a NumberVocab"):
        find_number_spans(torch.tensor([1]), {1: "1"})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"token_ids must be a torch\.Tensor, got list"):
        find_number_spans([1, 2], synthetic)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"integer tensor of token ids, got torch\.float32"):
        find_number_spans(torch.tensor([1.0]), synthetic)
    with pytest.raises(ValueError, match="sequence dimension"):
        find_number_spans(torch.tensor(1), synthetic)
    with pytest.raises(ValueError, match=r"in \[0, 30\) or ignore_index=-100, got 30"):
        find_number_spans(torch.tensor([1, 30]), synthetic)
    with pytest.raises(ValueError, match="got -5"):
        find_number_spans(torch.tensor([-5]), synthetic)
