"""Whole numbers: in text (what a model generated) and in token sequences (label batches).

Text: :func:`parse_number`, :func:`last_number` and :func:`find_numbers` read decimal numbers out of
free text. Tokens: :func:`find_number_spans` finds the whole numbers in a batch of token ids,
vectorised, and gives each its true value with place value, decimals and sign.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from numtok._validation import check_token_ids
from numtok.vocab import WORD_BOUNDARY_MARKERS, NumberVocab

__all__ = [
    "DECIMAL_POINT_TOKENS",
    "MINUS_SIGNS",
    "NumberSpans",
    "SpanTables",
    "SpanVocab",
    "find_number_spans",
    "find_numbers",
    "last_number",
    "minus_token_kind",
    "parse_number",
    "span_values",
]

# ------------------------------------------------------------------ numbers in text

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


# ------------------------------------------------------------------ numbers in token sequences

#: Characters read as a minus sign, and the token read as a decimal point.
MINUS_SIGNS = ("-", "\u2212")
DECIMAL_POINT_TOKENS = (".",)
# As in text: a minus is no sign right after a digit, letter, underscore, point or closing
# bracket (see _NUMBER).
_NOT_BEFORE_SIGN = re.compile(r"[0-9A-Za-z_.)\]]")


def minus_token_kind(token: str) -> str | None:
    """``"minus"`` for a bare minus token (``-``, ``−``): a sign unless it follows a number;
    ``"sign"`` for a token that ends in a minus after a character that allows a sign (``Ġ-``,
    ``▁-``, ``(-``, ``=-``): always a sign; ``None`` otherwise (``a-``, ``3-``, ``->``)."""
    if not token or token[-1] not in MINUS_SIGNS:
        return None
    if len(token) == 1:
        return "minus"
    return None if _NOT_BEFORE_SIGN.fullmatch(token[-2]) else "sign"


# Token classes of the span grammar.
_OTHER, _DIGITS, _WORD_START_DIGITS, _MINUS, _WORD_START_MINUS, _POINT = range(6)

# A span whose digits, read as one integer, stay below 2**53 and whose decimal places are at most
# 22 (10**22 is the largest exact power of ten in float64) has a correctly rounded value.
_EXACT_INTEGER_LIMIT = 2.0**53
_EXACT_POWER_OF_TEN = 22
# Token values are kept as int64, which holds every integer of 18 digits.
_MAX_TOKEN_DIGITS = 18
# 10**308 is the largest power of ten below float64's maximum.
_LARGEST_POWER_OF_TEN = 308


class SpanTables(NamedTuple):
    """Device tensors the span finder reads; built once per device by :meth:`SpanVocab.tables`.

    ``ids`` (N,) number-token ids; ``values`` (N,) int64 raw values (``"123"`` is 123; integers,
    so that moving a module to a low-precision dtype cannot round them);
    ``digit_counts`` (N,) digits per number token; ``position_of_id`` (V,) index into the N
    number tokens or -1; ``token_class`` (V,) int64 class of every id in the span grammar.
    """

    ids: torch.Tensor
    values: torch.Tensor
    digit_counts: torch.Tensor
    position_of_id: torch.Tensor
    token_class: torch.Tensor


def _id_tuple(name: str, ids: Iterable[int], vocab_size: int) -> tuple[int, ...]:
    checked = []
    for token_id in ids:
        if isinstance(token_id, bool) or not isinstance(token_id, int):
            raise TypeError(f"{name} must hold int token ids, got {token_id!r}")
        if not 0 <= token_id < vocab_size:
            raise ValueError(
                f"{name} holds {token_id}, outside the vocabulary [0, {vocab_size}) "
                f"(vocab_size={vocab_size})"
            )
        checked.append(token_id)
    return tuple(sorted(set(checked)))


class SpanVocab:
    """What a tokenizer's whole numbers are made of: the number tokens of a
    :class:`~numtok.NumberVocab`, plus the minus-sign and decimal-point tokens and which number
    tokens start a new word (``Ġ12``, ``▁7``).

    Build it with :meth:`from_tokenizer`; the constructor takes the ids explicitly.

    Args:
        numbers: the number tokens; every one must be a digit string (``"7"``, ``"123"``).
        minus_ids: ids read as a minus sign in front of a number (``-``, ``Ġ-``, ``▁-``, ``(-``).
        decimal_point_ids: ids read as a decimal point between two digit runs (``.``).
        word_start_ids: number-token and minus ids that begin a new word. Such a number token
            can begin a number but never continue one (``12`` ``Ġ34`` is 12 and 34, not 1234);
            such a minus is a sign even right after a number (``12`` ``Ġ-`` ``7`` is 12 and -7),
            while a bare ``-`` there is an operator (``3-4``).
    """

    def __init__(
        self,
        numbers: NumberVocab,
        *,
        minus_ids: Iterable[int] = (),
        decimal_point_ids: Iterable[int] = (),
        word_start_ids: Iterable[int] = (),
    ) -> None:
        if not isinstance(numbers, NumberVocab):
            raise TypeError(f"numbers must be a NumberVocab, got {type(numbers).__name__}")
        for token_id, digits in zip(numbers.ids.tolist(), numbers.digits, strict=True):
            if not (digits.isascii() and digits.isdigit()):
                raise ValueError(
                    f"number spans need number tokens that are digit strings; token id "
                    f"{token_id} has the value {digits!r} (build the NumberVocab from a tokenizer "
                    "or from digit strings)"
                )
            if len(digits) > _MAX_TOKEN_DIGITS:
                raise ValueError(
                    f"number spans support number tokens of at most {_MAX_TOKEN_DIGITS} digits; "
                    f"token id {token_id} has {len(digits)}"
                )
        size = numbers.vocab_size
        self.numbers = numbers
        self.minus_ids = _id_tuple("minus_ids", minus_ids, size)
        self.decimal_point_ids = _id_tuple("decimal_point_ids", decimal_point_ids, size)
        self.word_start_ids = _id_tuple("word_start_ids", word_start_ids, size)
        number_ids = set(numbers.ids.tolist())
        for name, ids in (
            ("minus_ids", self.minus_ids),
            ("decimal_point_ids", self.decimal_point_ids),
        ):
            overlap = sorted(number_ids.intersection(ids))
            if overlap:
                raise ValueError(
                    f"{name} must not be number tokens, got the number token(s) {overlap}"
                )
        if set(self.minus_ids) & set(self.decimal_point_ids):
            raise ValueError(
                "minus_ids and decimal_point_ids must be disjoint, both hold "
                f"{sorted(set(self.minus_ids) & set(self.decimal_point_ids))}"
            )
        strays = sorted(set(self.word_start_ids) - number_ids - set(self.minus_ids))
        if strays:
            raise ValueError(
                f"word_start_ids must be number tokens or minus_ids, got {strays} (neither)"
            )
        #: (N,) int64, the raw value of each number token.
        self.values = torch.tensor([int(d) for d in numbers.digits], dtype=torch.long)
        #: (N,) int64, the digits of each number token (``"007"`` has 3).
        self.digit_counts = torch.tensor([len(d) for d in numbers.digits], dtype=torch.long)
        self._tables: dict[torch.device, SpanTables] = {}

    @classmethod
    def from_tokenizer(
        cls, tokenizer: Any, numbers: NumberVocab | None = None, **number_vocab_options: Any
    ) -> SpanVocab:
        """Read the span grammar from a Hugging Face tokenizer (``get_vocab()``), unchanged.

        Minus signs are the tokens ``-`` and ``−``, and tokens ending in one after a character
        that allows a sign, such as a word-boundary marker or an opening bracket (``Ġ-``, ``▁-``,
        ``(-``; see :func:`minus_token_kind`), which are word starts; the decimal point is the
        token ``.``; number tokens whose text starts with a marker are word starts.

        Args:
            tokenizer: the tokenizer.
            numbers: its :class:`~numtok.NumberVocab`; built with
                ``NumberVocab.from_tokenizer(tokenizer, **number_vocab_options)`` if omitted.
        """
        if numbers is None:
            numbers = NumberVocab.from_tokenizer(tokenizer, **number_vocab_options)
        elif number_vocab_options:
            raise TypeError(
                "pass either numbers or NumberVocab options, not both; got numbers and "
                f"{sorted(number_vocab_options)}"
            )
        get_vocab = getattr(tokenizer, "get_vocab", None)
        if not callable(get_vocab):
            raise TypeError(
                "tokenizer must have a get_vocab() method returning {token: id} "
                f"(a Hugging Face tokenizer), got {type(tokenizer).__name__}"
            )
        number_ids = set(numbers.ids.tolist())
        minus, points, word_starts = [], [], []
        for token, token_id in get_vocab().items():
            if token_id >= numbers.vocab_size:
                continue
            minus_kind = minus_token_kind(token)
            if token in DECIMAL_POINT_TOKENS:
                points.append(token_id)
            elif minus_kind is not None:
                minus.append(token_id)
                if minus_kind == "sign":
                    word_starts.append(token_id)
            elif token_id in number_ids and token[0] in WORD_BOUNDARY_MARKERS:
                word_starts.append(token_id)
        return cls(numbers, minus_ids=minus, decimal_point_ids=points, word_start_ids=word_starts)

    @property
    def vocab_size(self) -> int:
        return self.numbers.vocab_size

    def __repr__(self) -> str:
        return (
            f"SpanVocab({len(self.numbers)} number tokens ({len(self.word_start_ids)} word "
            f"starts), minus_ids={list(self.minus_ids)}, "
            f"decimal_point_ids={list(self.decimal_point_ids)}, vocab_size={self.vocab_size})"
        )

    def tables(self, device: torch.device | str | None = None) -> SpanTables:
        """The lookup tensors :func:`find_number_spans` reads, on ``device`` (built once)."""
        device = torch.device(device) if device is not None else torch.device("cpu")
        cached = self._tables.get(device)
        if cached is None:
            numbers = self.numbers.tables(device)
            token_class = torch.full((self.vocab_size,), _OTHER, dtype=torch.long)
            token_class[self.numbers.ids] = _DIGITS
            token_class[torch.tensor(self.minus_ids, dtype=torch.long)] = _MINUS
            token_class[torch.tensor(self.decimal_point_ids, dtype=torch.long)] = _POINT
            # A marked token is a number or minus token with a word-boundary marker.
            marked = torch.tensor(self.word_start_ids, dtype=torch.long)
            token_class[marked] = torch.where(
                token_class[marked] == _MINUS, _WORD_START_MINUS, _WORD_START_DIGITS
            )
            cached = SpanTables(
                ids=numbers.ids,
                values=self.values.to(device),
                digit_counts=self.digit_counts.to(device),
                position_of_id=numbers.position_of_id,
                token_class=token_class.to(device),
            )
            self._tables[device] = cached
        return cached


@dataclass(frozen=True)
class NumberSpans:
    """The whole numbers in a batch of token ids (..., T), as found by :func:`find_number_spans`.

    Positions are flat indices into ``token_ids.reshape(-1)``. With S spans and K number tokens:

    Attributes:
        span_of_token: (..., T) long, the span each position belongs to (minus sign, digits and
            decimal point alike), -1 outside numbers.
        start: (S,) flat position of each span's first token (its minus sign, if any).
        end: (S,) flat position one past each span's last token.
        first_number: (S,) flat position of each span's first number token.
        negative: (S,) bool, the span has a minus sign.
        digits: (S,) long, digits in the span (integer and decimal part; ``007`` counts 3).
        fraction_digits: (S,) long, digits after the decimal point.
        values: (S,) float64, the number each span writes.
        exact: (S,) bool, ``values`` is the correctly rounded float64 of the decimal number:
            true when its digits read as one integer stay below 2**53 and it has at most 22
            decimal places. Otherwise the value is within a few units in the last place, and
            ``±inf`` beyond float64's range (a span of more than 308 integer digits).
        number_positions: (K,) flat position of each number token in a span.
        number_span: (K,) the span of each of those number tokens.
        number_place: (K,) its power of ten: a span's value is
            ``±Σ value(token) · 10**place`` over its number tokens (negative in the decimals).
    """

    span_of_token: torch.Tensor
    start: torch.Tensor
    end: torch.Tensor
    first_number: torch.Tensor
    negative: torch.Tensor
    digits: torch.Tensor
    fraction_digits: torch.Tensor
    values: torch.Tensor
    exact: torch.Tensor
    number_positions: torch.Tensor
    number_span: torch.Tensor
    number_place: torch.Tensor

    def __len__(self) -> int:
        return int(self.start.numel())


def _check_token_ids(token_ids: object, *, vocab_size: int, ignore_index: int) -> torch.Tensor:
    """Integer ids (..., T) in [0, vocab_size) or ``ignore_index``, at least one dimension."""
    token_ids = check_token_ids(
        "token_ids", token_ids, vocab_size=vocab_size, ignore_index=ignore_index
    )
    if token_ids.dim() < 1:
        raise ValueError("token_ids must have a sequence dimension (..., T), got a scalar")
    return token_ids


def _before(mask: torch.Tensor) -> torch.Tensor:
    """(R, T): the value at t - 1 (False at t = 0)."""
    return F.pad(mask[:, :-1], (1, 0))


def _after(mask: torch.Tensor) -> torch.Tensor:
    """(R, T): the value at t + 1 (False at the last position)."""
    return F.pad(mask[:, 1:], (0, 1))


def find_number_spans(
    token_ids: torch.Tensor, vocab: SpanVocab, *, ignore_index: int = -100
) -> NumberSpans:
    """Find the whole numbers in a batch of token ids, vectorised over the batch.

    A span is ``[minus] digits+ [point digits+]``, within one row (the last dimension):

    * ``digits+``: consecutive number tokens; only the first may be a word start (``Ġ12``);
    * ``minus``: a minus token right before an unmarked number token, unless it follows a number
      token or a decimal point without a word-boundary marker of its own (``3-4`` is 3 and 4,
      ``3`` ``Ġ-`` ``4`` is 3 and -4);
    * ``point digits+``: a decimal-point token between number tokens, the second unmarked. A
      chain ``1.2.3`` reads like text: ``1.2``, then ``3``; ``1.2.3.4`` is ``1.2`` and ``3.4``.

    ``ignore_index`` and every other token end a span. Thousands separators in tokens (``1,234``)
    are not joined: that is two spans.

    Values combine the tokens with place value (``123|456|7`` is 1234567, ``007`` counts three
    digits), scale the decimals (``12.34`` is 12.34) and apply the sign; see
    :class:`NumberSpans` for exactness.
    """
    if not isinstance(vocab, SpanVocab):
        raise TypeError(
            "vocab must be a SpanVocab (SpanVocab.from_tokenizer(tokenizer)), "
            f"got {type(vocab).__name__}"
        )
    token_ids = _check_token_ids(token_ids, vocab_size=vocab.vocab_size, ignore_index=ignore_index)
    return _find_spans(token_ids, vocab.tables(token_ids.device), ignore_index)


def _find_spans(token_ids: torch.Tensor, tables: SpanTables, ignore_index: int) -> NumberSpans:
    shape = token_ids.shape
    ids = token_ids.reshape(-1, shape[-1])  # (R, T)
    device = ids.device
    known = ids != ignore_index
    safe_ids = torch.where(known, ids, 0)
    token_class = torch.where(known, tables.token_class[safe_ids], _OTHER)  # (R, T)
    number = (token_class == _DIGITS) | (token_class == _WORD_START_DIGITS)
    unmarked = token_class == _DIGITS  # may continue a span
    point = token_class == _POINT
    columns = torch.arange(ids.shape[1], device=device).expand_as(ids)

    # Runs of number tokens: a run starts at a number token that cannot continue the previous one.
    run_start = number & ~(unmarked & _before(number))
    run_start_column = torch.cummax(torch.where(run_start, columns, -1), dim=1).values

    # Decimal points: candidates sit between a number and an unmarked number. In a chain
    # d.d.d.d (each run's start preceded by a candidate), every other candidate is joined,
    # counting from the chain's first: 1.2.3.4 -> 1.2 and 3.4, as a reader of text would.
    candidate = point & _before(number) & _after(unmarked)
    before_run = _before_long(run_start_column) - 1  # column before the run that ends at t - 1
    linked = candidate & (before_run >= 0) & candidate.gather(1, before_run.clamp_min(0))
    count = torch.cumsum(candidate.long(), dim=1)
    chain_base = torch.cummax(torch.where(candidate & ~linked, count, 0), dim=1).values
    joined = candidate & ((count - chain_base) % 2 == 0)
    fraction_start = _before(joined)
    in_fraction = number & fraction_start.gather(1, run_start_column.clamp_min(0))

    sign = _after(unmarked) & (
        (token_class == _WORD_START_MINUS) | ((token_class == _MINUS) & ~_before(number | point))
    )
    span_start = sign | (run_start & ~fraction_start & ~_before(sign))
    in_span = sign | number | joined

    flat_start = span_start.reshape(-1)
    span_index = torch.cumsum(flat_start.long(), dim=0) - 1  # (M,)
    span_of_token = torch.where(in_span.reshape(-1), span_index, -1)
    start = flat_start.nonzero().squeeze(1)  # (S,); reads the span count back from the device
    num_spans = start.numel()

    flat_number = number.reshape(-1)
    number_positions = flat_number.nonzero().squeeze(1)  # (K,)
    number_span = span_index[number_positions]
    token_digits = tables.digit_counts[
        tables.position_of_id[safe_ids.reshape(-1)[number_positions]]
    ]
    fraction_token = in_fraction.reshape(-1)[number_positions]

    # Place values. Integer digits count down from the span's integer width, decimal digits
    # count down from -1: place = (integer digits after t) or -(decimal digits up to t).
    integer_digits = torch.where(fraction_token, 0, token_digits)  # (K,)
    decimal_digits = token_digits - integer_digits
    zeros = torch.zeros(num_spans, dtype=torch.long, device=device)
    span_integer_digits = zeros.index_add(0, number_span, integer_digits)
    span_fraction_digits = zeros.index_add(0, number_span, decimal_digits)
    integer_through = _cumsum_within(integer_digits, number_span, num_spans)
    decimal_through = _cumsum_within(decimal_digits, number_span, num_spans)
    number_place = torch.where(
        fraction_token, -decimal_through, span_integer_digits[number_span] - integer_through
    )

    # Every span ends with a number token (a sign or point is always followed by digits).
    unset = torch.full((num_spans,), -1, dtype=torch.long, device=device)
    end = unset.scatter_reduce(0, number_span, number_positions, "amax") + 1
    first_number = unset.scatter_reduce(
        0, number_span, number_positions, "amin", include_self=False
    )
    negative = sign.reshape(-1)[start]
    spans = NumberSpans(
        span_of_token=span_of_token.reshape(shape),
        start=start,
        end=end,
        first_number=first_number,
        negative=negative,
        digits=span_integer_digits + span_fraction_digits,
        fraction_digits=span_fraction_digits,
        values=torch.empty(0),
        exact=torch.empty(0, dtype=torch.bool),
        number_positions=number_positions,
        number_span=number_span,
        number_place=number_place,
    )
    token_values = tables.values[tables.position_of_id[safe_ids.reshape(-1)[number_positions]]]
    values, integer = _place_value_sums(token_values, spans)
    exact = (integer < _EXACT_INTEGER_LIMIT) & (span_fraction_digits <= _EXACT_POWER_OF_TEN)
    return replace(spans, values=values, exact=exact)


def _before_long(values: torch.Tensor) -> torch.Tensor:
    """(R, T) long: the value at t - 1 (-1 at t = 0)."""
    return F.pad(values[:, :-1], (1, 0), value=-1)


def _cumsum_within(values: torch.Tensor, segment: torch.Tensor, num_segments: int) -> torch.Tensor:
    """Inclusive cumulative sum of ``values`` (K,) that restarts with each segment; ``segment``
    (K,) is sorted and every segment has at least one element."""
    total = torch.cumsum(values, dim=0)
    is_first = torch.ones_like(segment, dtype=torch.bool)
    is_first[1:] = segment[1:] != segment[:-1]
    # The running total just before each segment; only a segment's first element contributes.
    offset = torch.zeros(num_segments, dtype=values.dtype, device=values.device).index_add(
        0, segment, torch.where(is_first, total - values, 0)
    )
    return total - offset[segment]


def _place_value_sums(
    token_values: torch.Tensor, spans: NumberSpans
) -> tuple[torch.Tensor, torch.Tensor]:
    """``±Σ x_t · 10**place_t`` per span for per-number-token values ``x`` (K,), in float64.

    Computed as ``integer / 10**f`` with ``integer = Σ x_t · 10**(place_t + f)`` (``f`` the
    span's decimal places), which is the correctly rounded decimal when ``integer`` and ``10**f``
    are exact. Spans of more than 308 digits fall back to the direct sum, which stays finite
    wherever the number does. Returns (signed values (S,), unsigned integers (S,)).
    """
    values = token_values.to(torch.float64)
    fraction = spans.fraction_digits[spans.number_span]  # (K,)
    # A zero token contributes 0 even where its power of ten overflows (0 * inf is nan).
    integer_terms = _times_power_of_ten(values, spans.number_place + fraction)
    direct_terms = _times_power_of_ten(values, spans.number_place)
    zeros = values.new_zeros(len(spans))
    integer = zeros.index_add(0, spans.number_span, integer_terms)
    direct = zeros.index_add(0, spans.number_span, direct_terms)
    scaled = integer / torch.pow(10.0, spans.fraction_digits.to(torch.float64))
    unsigned = torch.where(spans.digits <= _LARGEST_POWER_OF_TEN, scaled, direct)
    return torch.where(spans.negative, -unsigned, unsigned), integer


def _times_power_of_ten(values: torch.Tensor, exponents: torch.Tensor) -> torch.Tensor:
    powers = torch.pow(10.0, exponents.clamp_max(_LARGEST_POWER_OF_TEN + 1).to(values.dtype))
    return torch.where(values == 0, torch.zeros_like(values), values * powers)


def span_values(token_values: torch.Tensor, spans: NumberSpans) -> torch.Tensor:
    """Assemble whole numbers from values per number token: ``±Σ x_t · 10**place_t`` (S,).

    ``token_values`` (K,) holds one value per entry of ``spans.number_positions`` (for example
    the expected value of each token); the places and signs are the spans'. With the tokens' own
    values this gives ``spans.values``. Computed in float64; differentiable.
    """
    if token_values.shape != spans.number_positions.shape:
        raise ValueError(
            f"token_values must hold one value per number token of the spans, shape "
            f"{tuple(spans.number_positions.shape)}, got {tuple(token_values.shape)}"
        )
    return _place_value_sums(token_values, spans)[0]
