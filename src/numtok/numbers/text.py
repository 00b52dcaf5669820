"""Numbers in text: :func:`parse_number`, :func:`last_number` and :func:`find_numbers` read the
decimal numbers a model wrote (signs, thousands separators, decimals, exponents) out of free text,
and never raise on a string. :func:`numtok.readout.metrics.numeric_metrics` scores generations with
them.

For the numbers in a batch of token ids, see :mod:`numtok.numbers.spans`.
"""

from __future__ import annotations

import re

__all__ = ["find_numbers", "last_number", "parse_number"]

# A sign counts only where it cannot be a binary operator or a hyphen: not right after a digit,
# a letter, an underscore, a decimal point or a closing bracket ("3-4", "x-1", "(2)-1").
# Digits joined by commas are matched as one chain and split afterwards (see _values): a regex
# that validated the grouping itself would backtrack quadratically on long comma chains.
_NUMBER = re.compile(
    r"(?:(?<![0-9A-Za-z_.)\]])(?P<sign>[-+\u2212]))?"
    r"(?:(?P<chain>[0-9]+(?:,[0-9]+)*)(?P<fraction>\.[0-9]+)?|(?<![0-9])(?P<bare>\.[0-9]+))"
    r"(?:[eE](?P<exponent>[-+\u2212]?[0-9]+))?"
)


def _is_thousands_grouping(groups: list[str]) -> bool:
    """``["1", "234", "567"]``: a head of 1-3 digits, then groups of exactly three."""
    return len(groups[0]) <= 3 and all(len(g) == 3 for g in groups[1:])


def _values(match: re.Match[str]) -> list[float]:
    """The numbers one match stands for: one, unless its comma chain is not a thousands grouping
    (``"1,23"`` is the list 1, 23); the sign belongs to the first, the decimal part and exponent
    to the last."""
    sign = "-" if match.group("sign") in ("-", "\u2212") else ""
    exponent = match.group("exponent")
    tail = (match.group("fraction") or "") + (
        "" if exponent is None else "e" + exponent.replace("\u2212", "-")
    )
    chain = match.group("chain")
    if chain is None:
        parts = [match.group("bare")]
    else:
        groups = chain.split(",")
        parts = ["".join(groups)] if _is_thousands_grouping(groups) else groups
    parts[0] = sign + parts[0]
    parts[-1] += tail
    # Only ASCII digits, '.', 'e' and signs reach float(): it cannot raise. A literal beyond
    # float64 ("1e999", 400 digits) becomes ±inf, one below its range ±0.
    return [float(part) for part in parts]


def _check_text(text: object) -> str:
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return text


def find_numbers(text: str) -> list[float]:
    """All numbers in ``text``, left to right, as floats (see :func:`parse_number` for the
    grammar)."""
    return [value for match in _NUMBER.finditer(_check_text(text)) for value in _values(match)]


def parse_number(text: str) -> float | None:
    """The one number that ``text`` states, or ``None`` when it holds no number or several.

    The grammar: an optional sign (``-``, ``+`` or the unicode minus ``−``) that is not preceded
    by a digit, letter, ``_``, ``.`` or closing bracket (``"3-4"`` is 3 and 4); ASCII digits,
    optionally grouped in threes by commas (``1,234,567``); an optional decimal part (``12.5``,
    ``.5``; a trailing ``"5."`` is 5 followed by a full stop); an optional exponent (``1e-3``,
    ``2.5E+10``). Surrounding words and punctuation are ignored (``"The answer is 42."``). Other
    scripts' digits, ``inf``/``nan``, fractions (``2/3`` is two numbers) and spaces as thousands
    separators are not read. A literal beyond float64's range gives ``±inf``.

    Never raises for a ``str`` (a ``TypeError`` for anything else).

    >>> parse_number("The answer is -1,234.5.")
    -1234.5
    >>> parse_number("3 apples and 4 pears") is None
    True
    """
    numbers = find_numbers(text)
    return numbers[0] if len(numbers) == 1 else None


def last_number(text: str) -> float | None:
    """The last number in ``text`` (the paper's reading of a generation), ``None`` if there is
    none. Same grammar as :func:`parse_number`.

    >>> last_number("3 + 4 = 7")
    7.0
    >>> last_number("1e5 or \u22122.5e-1")
    -0.25
    """
    numbers = find_numbers(text)
    return numbers[-1] if numbers else None
