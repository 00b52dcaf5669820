"""Whole numbers in token ids: :func:`find_number_spans` finds the numbers in a batch of token ids
(labels or generations), vectorised, and gives each its true value with place value, decimals and
sign; :func:`span_values` assembles whole numbers from any per-token values (such as a model's
expected values). The tokens a number is made of come from the :class:`~numtok.NumberVocab`.

For numbers in text, see :mod:`numtok.numbers.text`.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch

from numtok._common.shift import shift_left, shift_right
from numtok._common.validation import check_token_ids
from numtok.numbers.vocab import NumberVocab, check_number_vocab

__all__ = [
    "NumberSpans",
    "SpanTables",
    "find_number_spans",
    "find_number_spans_from_tables",
    "span_tables",
    "span_values",
]

# Token classes of the span grammar.
_OTHER, _DIGITS, _WORD_START_DIGITS, _MINUS, _WORD_START_MINUS, _POINT = range(6)

# int64 holds every integer of 18 digits: token values, and the digits of a span of at most 18
# digits read as one integer, which is summed exactly.
_INT64_DIGITS = 18
_MAX_TOKEN_DIGITS = _INT64_DIGITS
# Longer spans are summed in float64. One whose digits, read as one integer, stay below 2**53 and
# whose decimal places are at most 22 (10**22 is the largest exact power of ten in float64) is
# still exact.
_EXACT_INTEGER_LIMIT = 2.0**53
_EXACT_POWER_OF_TEN = 22
# 10**308 is the largest power of ten below float64's maximum.
_LARGEST_POWER_OF_TEN = 308


class SpanTables(NamedTuple):
    """Device tensors the span finder reads; built once per vocabulary and device by
    :func:`span_tables`.

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


_SPAN_TABLES: weakref.WeakKeyDictionary[NumberVocab, dict[torch.device, SpanTables]] = (
    weakref.WeakKeyDictionary()
)


def span_tables(vocab: NumberVocab, device: torch.device | str | None = None) -> SpanTables:
    """The lookup tensors :func:`find_number_spans` reads for ``vocab``, on ``device`` (built once
    per vocabulary and device).

    Raises:
        ValueError: a number token is not a digit string (a value such as ``2.5`` given to
            :meth:`NumberVocab.from_values`) or has more than 18 digits.
    """
    check_number_vocab(vocab)
    device = torch.device(device) if device is not None else torch.device("cpu")
    per_device = _SPAN_TABLES.setdefault(vocab, {})
    cached = per_device.get(device)
    if cached is None:
        cached = per_device[device] = _build_span_tables(vocab, device)
    return cached


def _build_span_tables(vocab: NumberVocab, device: torch.device) -> SpanTables:
    for token_id, digits in zip(vocab.ids.tolist(), vocab.digits, strict=True):
        if not (digits.isascii() and digits.isdigit()):
            raise ValueError(
                f"number spans need number tokens that are digit strings; token id {token_id} "
                f"has the value {digits!r} (build the NumberVocab from a tokenizer or from digit "
                "strings)"
            )
        if len(digits) > _MAX_TOKEN_DIGITS:
            raise ValueError(
                f"number spans support number tokens of at most {_MAX_TOKEN_DIGITS} digits; "
                f"token id {token_id} has {len(digits)}"
            )
    numbers = vocab.tables(device)
    token_class = torch.full((vocab.vocab_size,), _OTHER, dtype=torch.long)
    token_class[vocab.ids] = _DIGITS
    token_class[torch.tensor(vocab.minus_ids, dtype=torch.long)] = _MINUS
    token_class[torch.tensor(vocab.decimal_point_ids, dtype=torch.long)] = _POINT
    # A word start is a number or minus token with a word-boundary marker.
    marked = torch.tensor(vocab.word_start_ids, dtype=torch.long)
    token_class[marked] = torch.where(
        token_class[marked] == _MINUS, _WORD_START_MINUS, _WORD_START_DIGITS
    )
    return SpanTables(
        ids=numbers.ids,
        values=torch.tensor([int(d) for d in vocab.digits], dtype=torch.long, device=device),
        digit_counts=torch.tensor([len(d) for d in vocab.digits], dtype=torch.long, device=device),
        position_of_id=numbers.position_of_id,
        token_class=token_class.to(device),
    )


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
        values: (S,) float64, the number each span writes. A span of at most 18 digits is read as
            one integer ``n`` in int64, exactly, and becomes ``±n / 10**fraction_digits`` with
            one rounding for an integer (two for a decimal). A longer span is summed in float64:
            its relative error is at most ``(K + 5) · 2**-53`` for a span of K number tokens
            (about one unit in the last place in practice), and the value is ``±inf`` (or 0)
            beyond float64's range (more than 308 integer digits).
        exact: (S,) bool, ``values`` is the correctly rounded float64 of the decimal number:
            true for every integer of at most 18 digits, and for any span whose digits, read as
            one integer, stay below 2**53 and that has at most 22 decimal places.
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


def find_number_spans(
    token_ids: torch.Tensor, vocab: NumberVocab, *, ignore_index: int = -100
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
    check_number_vocab(vocab)
    token_ids = _check_token_ids(token_ids, vocab_size=vocab.vocab_size, ignore_index=ignore_index)
    return find_number_spans_from_tables(
        token_ids, span_tables(vocab, token_ids.device), ignore_index
    )


def find_number_spans_from_tables(
    token_ids: torch.Tensor, tables: SpanTables, ignore_index: int
) -> NumberSpans:
    """:func:`find_number_spans` on checked token ids (int64, (..., T)) and the vocabulary's
    :class:`SpanTables` on their device: what a module that holds the tables as buffers calls
    (:class:`~numtok.NumberLevelLoss`)."""
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
    run_start = number & ~(unmarked & shift_right(number, False))
    run_start_column = torch.cummax(torch.where(run_start, columns, -1), dim=1).values

    # Decimal points: candidates sit between a number and an unmarked number. In a chain
    # d.d.d.d (each run's start preceded by a candidate), every other candidate is joined,
    # counting from the chain's first: 1.2.3.4 -> 1.2 and 3.4, as a reader of text would.
    candidate = point & shift_right(number, False) & shift_left(unmarked, False)
    before_run = shift_right(run_start_column, -1) - 1  # column before the run that ends at t - 1
    linked = candidate & (before_run >= 0) & candidate.gather(1, before_run.clamp_min(0))
    count = torch.cumsum(candidate.long(), dim=1)
    chain_base = torch.cummax(torch.where(candidate & ~linked, count, 0), dim=1).values
    joined = candidate & ((count - chain_base) % 2 == 0)
    fraction_start = shift_right(joined, False)
    in_fraction = number & fraction_start.gather(1, run_start_column.clamp_min(0))

    sign = shift_left(unmarked, False) & (
        (token_class == _WORD_START_MINUS)
        | ((token_class == _MINUS) & ~shift_right(number | point, False))
    )
    span_start = sign | (run_start & ~fraction_start & ~shift_right(sign, False))
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
    values, exact = _exact_values(token_values, spans)
    return replace(spans, values=values, exact=exact)


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


def _exact_values(
    token_values: torch.Tensor, spans: NumberSpans
) -> tuple[torch.Tensor, torch.Tensor]:
    """The value each span writes (S,) float64 and whether it is correctly rounded (S,) bool,
    from the number tokens' raw values ``x`` (K,) int64 (see :class:`NumberSpans`).

    A span of at most 18 digits with ``f`` decimal places is the integer
    ``n = Σ x_t · 10**(place_t + f) < 10**18``, summed in int64 without rounding, then
    ``float(n) / 10**f``: correctly rounded when ``f = 0`` (one rounding) or when ``n < 2**53``
    (``float(n)`` and ``10**f`` are exact, the division rounds once). Longer spans take the
    float64 sum of :func:`_place_value_sums`.
    """
    short = spans.digits <= _INT64_DIGITS  # (S,)
    exponent = spans.number_place + spans.fraction_digits[spans.number_span]  # (K,) >= 0
    powers = torch.tensor([10**k for k in range(_INT64_DIGITS + 1)], device=exponent.device)
    # Tokens of longer spans contribute 0 here (their exponent may exceed int64's powers).
    power = torch.where(short[spans.number_span], powers[exponent.clamp_max(_INT64_DIGITS)], 0)
    integer = torch.zeros_like(spans.digits).index_add(0, spans.number_span, token_values * power)
    exact_integer = integer.to(torch.float64)  # (S,) the one rounding of an integer span
    scaled = exact_integer / torch.pow(10.0, spans.fraction_digits.to(torch.float64))
    signed = torch.where(spans.negative, -scaled, scaled)

    long_values, long_integer = _place_value_sums(token_values, spans)
    values = torch.where(short, signed, long_values)
    integer_value = torch.where(short, exact_integer, long_integer)
    exact = (short & (spans.fraction_digits == 0)) | (
        (integer_value < _EXACT_INTEGER_LIMIT) & (spans.fraction_digits <= _EXACT_POWER_OF_TEN)
    )
    return values, exact


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
    the expected value of each token); the places and signs are the spans'. Computed in float64,
    term by term; differentiable. With the tokens' own values this gives ``spans.values`` wherever
    a span's digits, read as one integer, stay below 2**53 (longer integers may differ from the
    exact int64 sum of ``spans.values`` in the last place).
    """
    if token_values.shape != spans.number_positions.shape:
        raise ValueError(
            f"token_values must hold one value per number token of the spans, shape "
            f"{tuple(spans.number_positions.shape)}, got {tuple(token_values.shape)}"
        )
    return _place_value_sums(token_values, spans)[0]
