"""numtok.numbers.text: numbers in text (parse_number, last_number, find_numbers), by example and
by property."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numtok.numbers.text import find_numbers, last_number, parse_number

# ------------------------------------------------------------------ text: examples


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("42", 42.0),
        ("-42", -42.0),
        ("+42", 42.0),
        ("\u221242", -42.0),  # unicode minus
        ("3.25", 3.25),
        (".5", 0.5),
        ("-.5", -0.5),
        ("1,234,567", 1234567.0),
        ("-1,234.5", -1234.5),
        ("1e3", 1000.0),
        ("2.5E-3", 0.0025),
        ("1e\u22122", 0.01),
        ("The answer is 42.", 42.0),  # a trailing full stop is punctuation
        ("x = -7 apples", -7.0),
        ("(-3)", -3.0),
        ("[answer]: 0.125!", 0.125),
        ("007", 7.0),
        ("1e999", math.inf),
        ("-" + "9" * 400, -math.inf),
    ],
)
def test_parse_number_reads_one_number(text: str, expected: float) -> None:
    assert parse_number(text) == expected
    assert last_number(text) == expected


@pytest.mark.parametrize(
    ("text", "numbers"),
    [
        ("3-4", [3.0, 4.0]),  # a minus after a digit is an operator
        ("x-1", [1.0]),  # ... and after a letter
        ("(2)-1", [2.0, 1.0]),
        ("1,23", [1.0, 23.0]),  # not a thousands grouping: a list
        ("1,2345", [1.0, 2345.0]),
        ("1,234,2345", [1.0, 234.0, 2345.0]),
        ("-1,23.5e2", [-1.0, 2350.0]),  # sign to the first, decimals and exponent to the last
        ("1, 2, 3", [1.0, 2.0, 3.0]),
        ("1.2.3.4", [1.2, 3.4]),
        ("2/3", [2.0, 3.0]),
        ("3 eggs, 2e5 hens", [3.0, 200000.0]),
        ("", []),
        ("no numbers here", []),
        ("inf nan", []),
        ("١٢", []),  # other scripts' digits are not read
    ],
)
def test_find_numbers(text: str, numbers: list[float]) -> None:
    assert find_numbers(text) == numbers
    assert last_number(text) == (numbers[-1] if numbers else None)
    assert parse_number(text) == (numbers[0] if len(numbers) == 1 else None)


def test_parse_number_is_none_for_several_numbers_and_last_number_takes_the_last() -> None:
    assert parse_number("between 3 and 4") is None
    assert last_number("3 + 4 = 7") == 7.0
    assert last_number("So the total is 1,200. Final answer: -3.5") == -3.5


@pytest.mark.parametrize("function", [parse_number, last_number, find_numbers])
def test_non_strings_are_a_type_error(function: object) -> None:
    assert callable(function)
    with pytest.raises(TypeError, match="text must be a str, got int"):
        function(42)
    with pytest.raises(TypeError, match="got bytes"):
        function(b"42")


# ------------------------------------------------------------------ text: properties

finite_floats = st.floats(allow_nan=False, allow_infinity=False)


def _formats(x: float) -> list[str]:
    """Ways of writing x that are exact (parse back to x itself)."""
    signed = "\u2212" + repr(-x) if x < 0 else "+" + repr(x)
    return [repr(x), f"{x:,}", repr(x).upper(), signed]


@given(finite_floats)
def test_formatted_numbers_parse_back_to_themselves(x: float) -> None:
    for text in _formats(x):
        for wrapped in (text, f"The answer is {text}.", f"answer:{text}\n", f"= {text} units"):
            assert parse_number(wrapped) == x, wrapped
            assert last_number(f"first 12, then {wrapped}") == x, wrapped


@given(st.integers(min_value=-(10**30), max_value=10**30))
def test_integers_with_thousands_separators_parse_back(n: int) -> None:
    for text in (str(n), f"{n:,}"):
        assert parse_number(text) == float(n)


@given(st.decimals(allow_nan=False, allow_infinity=False, places=4, min_value=-1e6, max_value=1e6))
def test_fixed_point_decimals_parse_back(d: object) -> None:
    assert parse_number(f"{d}") == float(str(d))


@given(st.text())
@settings(max_examples=300)
def test_random_text_never_raises(text: str) -> None:
    numbers = find_numbers(text)
    assert all(isinstance(x, float) and not math.isnan(x) for x in numbers)
    assert last_number(text) == (numbers[-1] if numbers else None)
    assert parse_number(text) == (numbers[0] if len(numbers) == 1 else None)


@given(st.text(alphabet="0123456789,.-+eE\u2212 x", max_size=40))
@settings(max_examples=300)
def test_number_like_garbage_never_raises(text: str) -> None:
    for x in find_numbers(text):
        assert not math.isnan(x)


def test_a_long_broken_comma_chain_is_split_into_its_groups() -> None:
    # One chain whose last group breaks the thousands grouping: a list of 200,002 numbers. (A
    # regex validating the grouping itself would backtrack quadratically on it.)
    text = "1," + "234," * 200_000 + "5678"
    numbers = find_numbers(text)
    assert len(numbers) == 200_002
    assert (numbers[0], numbers[1], numbers[-1]) == (1.0, 234.0, 5678.0)
