"""Which token ids of a vocabulary are numbers, what they are worth, and which other tokens make
up whole numbers (minus signs, decimal points, word starts).

A :class:`NumberVocab` is built once from a tokenizer (read by duck typing: ``get_vocab()`` and
``len()``) or from an explicit ``{token_id: value}`` map. It never modifies the tokenizer. Every
entry point of numtok takes it: the token-level losses read the number tokens, the whole-number
tools (:func:`numtok.find_number_spans`, :func:`numtok.number_level_loss`) also read
``minus_ids``, ``decimal_point_ids`` and ``word_start_ids``.

Every number token carries a *digit string* (``"7"``, ``"123"``, ``"007"``) and a *scale group*:
the number of digits in the token. Losses compare a label only with tokens of its own group and
measure distances on that group's scale, ``value / 10**(length - 1)``, so that a 3-digit chunk's
distances run 0-9.99 like a single digit's. See :func:`numtok.number_token_loss`.
"""

from __future__ import annotations

import math
import re
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from numtok._common.validation import check_bool

__all__ = [
    "DECIMAL_POINT_TOKENS",
    "MINUS_SIGNS",
    "WORD_BOUNDARY_MARKERS",
    "NumberTables",
    "NumberVocab",
    "check_number_vocab",
    "minus_token_kind",
]

#: Characters that tokenizers glue to the start of a word: SentencePiece's ``▁``, byte-level
#: BPE's ``Ġ`` (GPT-2, Llama-3, Qwen) and a plain space.
WORD_BOUNDARY_MARKERS = ("\u2581", "\u0120", " ")
#: Characters read as a minus sign, and the token read as a decimal point.
MINUS_SIGNS = ("-", "\u2212")
DECIMAL_POINT_TOKENS = (".",)
# As in text (numtok.numbers.text): a minus is no sign right after a digit, letter, underscore,
# point or closing bracket. Unlike text, a token that holds a run of dashes (``--``) is no sign.
_NOT_BEFORE_SIGN = re.compile(r"[0-9A-Za-z_.)\]]")

_MAX_EXAMPLES = 5
_BYTE_FALLBACK = re.compile(r"<0x[0-9A-Fa-f]{2}>")
_NON_FINITE = ("inf", "infinity", "nan")


class NumberTables(NamedTuple):
    """Device tensors the losses read; built once per device by :meth:`NumberVocab.tables`.

    ``ids`` (N,) number-token ids; ``scaled_values`` (N,) float64 ``value / 10**(length-1)``;
    ``groups`` (N,) scale-group index of each token; ``position_of_id`` (V,) int64, the index into
    the N number tokens of each vocabulary id, or -1 for tokens that are not numbers.
    """

    ids: torch.Tensor
    scaled_values: torch.Tensor
    groups: torch.Tensor
    position_of_id: torch.Tensor


@dataclass(frozen=True)
class _Skipped:
    token: str
    token_id: int
    reason: str


def _strip_marker(token: str) -> tuple[str, bool]:
    """Split one leading word-boundary marker off ``token``: ``"Ġ12"`` -> ``("12", True)``."""
    if len(token) > 1 and token[0] in WORD_BOUNDARY_MARKERS:
        return token[1:], True
    return token, False


def _is_ascii_digits(text: str) -> bool:
    return text != "" and text.isascii() and text.isdigit()


def minus_token_kind(token: str) -> str | None:
    """``"minus"`` for a bare minus token (``-``, ``−``): a sign unless it follows a number;
    ``"sign"`` for a token that ends in its only minus, after a character that allows a sign
    (``Ġ-``, ``▁-``, ``(-``, ``=-``): always a sign; ``None`` otherwise (``a-``, ``3-``, ``->``,
    and runs of dashes: ``--``, ``----``, ``Ġ--``, ``=-=-``)."""
    if not token or token[-1] not in MINUS_SIGNS:
        return None
    if len(token) == 1:
        return "minus"
    if any(ch in MINUS_SIGNS for ch in token[:-1]):
        return None  # a run of dashes (a rule, an em dash, ``<!--``), not a sign
    return None if _NOT_BEFORE_SIGN.fullmatch(token[-2]) else "sign"


def _classify(token: str, *, multi_digit: bool, prefixed: bool) -> tuple[str | None, str | None]:
    """Return ``(digit_string, None)`` for a number token, ``(None, reason)`` for a digit-like
    token that is skipped, and ``(None, None)`` for a token with no digit in it at all."""
    if _BYTE_FALLBACK.fullmatch(token):
        is_digit_byte = 0x30 <= int(token[3:5], 16) <= 0x39
        return None, "byte-fallback token" if is_digit_byte else None
    body, has_marker = _strip_marker(token)
    if not _is_ascii_digits(body):
        # Digit-like: all numerals (``١٢``, ``½``), or ASCII digits mixed with other characters
        # (``1.5``, ``-3``, ``1e3``, ``1_000``). Byte-level BPE spells UTF-8 bytes with
        # characters such as ``²`` inside other text; those are not digit-like.
        if body and all(ch.isnumeric() for ch in body):
            return None, "non-ASCII digit or numeral"
        if any(ch.isascii() and ch.isdigit() for ch in body) or body.lower() in _NON_FINITE:
            return None, "not only digits (sign, decimal point, exponent, separator or letters)"
        return None, None
    if has_marker and not prefixed:
        return None, "word-boundary prefix (prefixed=False)"
    if len(body) > 1 and not multi_digit:
        return None, "several digits (multi_digit=False)"
    return body, None


class NumberVocab:
    """The number tokens of a vocabulary (ids, values, digit strings, scale groups) and the tokens
    that join them into whole numbers (minus signs, decimal points, word starts).

    Build it with :meth:`from_tokenizer` or :meth:`from_values`; the constructor is private.

    Attributes:
        ids: LongTensor (N,), the number-token ids in increasing order.
        values: FloatTensor (N,), float64, what each token is worth (``"007"`` is worth 7).
        digits: list of N strings, the digit string of each token (``"007"``); for a value given
            as a number to :meth:`from_values`, its ``str``.
        lengths: LongTensor (N,), the scale group of each token: its number of digits (1 for values
            given as numbers to :meth:`from_values`, which share the unit scale).
        vocab_size: the number of logits the losses expect (columns of the output layer).
        minus_ids: sorted tuple of the ids read as a minus sign in front of a number (``-``,
            ``Ġ-``, ``▁-``, ``(-``).
        decimal_point_ids: sorted tuple of the ids read as a decimal point between two digit runs
            (``.``).
        word_start_ids: sorted tuple of the number-token and minus ids that begin a new word
            (``Ġ12``, ``▁7``, ``Ġ-``). Such a number token can begin a whole number but never
            continue one (``12`` ``Ġ34`` is 12 and 34, not 1234); such a minus is a sign even right
            after a number (``12`` ``Ġ-`` ``7`` is 12 and -7), while a bare ``-`` there is an
            operator (``3-4``).

    Without minus, decimal-point and word-start ids, whole numbers are runs of number tokens.
    """

    def __init__(
        self,
        entries: Mapping[int, tuple[float, str, int]],
        *,
        vocab_size: int,
        tokens: Mapping[int, str] | None = None,
        skipped: Iterable[_Skipped] = (),
        minus_ids: Iterable[int] = (),
        decimal_point_ids: Iterable[int] = (),
        word_start_ids: Iterable[int] = (),
    ) -> None:
        if not entries:
            raise ValueError("NumberVocab needs at least one number token, got none")
        order = sorted(entries)
        self.ids = torch.tensor(order, dtype=torch.long)
        self.values = torch.tensor([entries[i][0] for i in order], dtype=torch.float64)
        self.digits = [entries[i][1] for i in order]
        self.lengths = torch.tensor([entries[i][2] for i in order], dtype=torch.long)
        self.vocab_size = int(vocab_size)
        self._tokens = dict(tokens) if tokens is not None else {}
        self._skipped = list(skipped)
        self._tables: dict[torch.device, NumberTables] = {}
        self.minus_ids, self.decimal_point_ids, self.word_start_ids = _whole_number_ids(
            set(order),
            vocab_size=self.vocab_size,
            minus_ids=minus_ids,
            decimal_point_ids=decimal_point_ids,
            word_start_ids=word_start_ids,
        )

        # Distances are measured on each group's own scale, value / 10**(length - 1).
        self.scaled_values = self.values / torch.pow(10.0, (self.lengths - 1).to(torch.float64))
        group_keys, self.groups = torch.unique(self.lengths, return_inverse=True)
        self.group_lengths = [int(k) for k in group_keys]
        spans = []
        nearest = []
        for g in range(len(self.group_lengths)):
            distinct = torch.unique(self.scaled_values[self.groups == g])  # sorted
            spans.append(float(distinct[-1] - distinct[0]))
            if distinct.numel() > 1:
                nearest.append(float(torch.diff(distinct).min()))
        #: The largest distance between two tokens of one scale group: what mass on a token of
        #: another group costs (before squashing).
        self.max_distance = max(spans)
        #: The smallest non-zero distance between two tokens of one scale group (``inf`` if none).
        self.min_nonzero_distance = min(nearest) if nearest else math.inf

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_tokenizer(
        cls,
        tokenizer: Any,
        *,
        vocab_size: int | None = None,
        multi_digit: bool = True,
        prefixed: bool = True,
    ) -> NumberVocab:
        """Find the number tokens of a Hugging Face tokenizer (slow or fast) without changing it.

        Number tokens are single ASCII digits ``0``-``9``; with ``prefixed=True`` also a digit
        string glued to one word-boundary marker (``▁7``, ``Ġ7``, `` 7``); with
        ``multi_digit=True`` also strings of several ASCII digits (``12``, ``007``, ``Ġ123``).
        Nothing else: not ``١٢``, ``½``, ``1_000``, ``1e3``, ``inf``, ``-3``, ``1.5``, nor
        byte-fallback tokens ``<0x37>``.

        It also reads what whole numbers are made of: minus signs are the tokens ``-`` and ``−``,
        and tokens ending in one after a character that allows a sign, such as a word-boundary
        marker or an opening bracket (``Ġ-``, ``▁-``, ``(-``; see :func:`minus_token_kind`),
        which are word starts; the decimal point is the token ``.``; number tokens whose text
        starts with a word-boundary marker are word starts.

        Args:
            tokenizer: any object with ``get_vocab() -> {token: id}``; ``len(tokenizer)`` if
                available gives the default ``vocab_size``.
            vocab_size: the number of logits the model produces. Defaults to ``len(tokenizer)``.
                Pass the model's ``config.vocab_size`` when its output layer is padded beyond the
                tokenizer (Qwen: 151,936 logits for 151,665 tokens).
            multi_digit: count tokens of several digits as number tokens.
            prefixed: count digit tokens with a word-boundary marker as number tokens.
        """
        check_bool("multi_digit", multi_digit)
        check_bool("prefixed", prefixed)
        get_vocab = getattr(tokenizer, "get_vocab", None)
        if not callable(get_vocab):
            raise TypeError(
                "tokenizer must have a get_vocab() method returning {token: id} "
                f"(a Hugging Face tokenizer), got {type(tokenizer).__name__}"
            )
        token_to_id: Mapping[str, int] = get_vocab()
        largest_id = max(token_to_id.values(), default=-1)
        try:
            tokenizer_size = max(len(tokenizer), largest_id + 1)
        except TypeError:
            tokenizer_size = largest_id + 1
        if vocab_size is None:
            vocab_size = tokenizer_size
        _check_vocab_size(vocab_size)
        if vocab_size < tokenizer_size:
            raise ValueError(
                f"vocab_size={vocab_size} is smaller than the tokenizer, which has "
                f"{tokenizer_size} tokens; pass the number of logits your model produces "
                f"(at least {tokenizer_size}), e.g. vocab_size=model.config.vocab_size"
            )
        entries: dict[int, tuple[float, str, int]] = {}
        tokens: dict[int, str] = {}
        skipped: list[_Skipped] = []
        minus, points, word_starts = [], [], []
        for token, token_id in token_to_id.items():
            token_id = int(token_id)
            digits, reason = _classify(token, multi_digit=multi_digit, prefixed=prefixed)
            minus_kind = minus_token_kind(token)
            if digits is not None:
                entries[token_id] = (float(int(digits)), digits, len(digits))
                if token[0] in WORD_BOUNDARY_MARKERS:
                    word_starts.append(token_id)
            elif token in DECIMAL_POINT_TOKENS:
                points.append(token_id)
            elif minus_kind is not None:
                minus.append(token_id)
                if minus_kind == "sign":
                    word_starts.append(token_id)
            else:
                if reason is not None:
                    skipped.append(_Skipped(token, token_id, reason))
                continue
            tokens[token_id] = token
        if not entries:
            raise ValueError(
                f"the tokenizer ({type(tokenizer).__name__}, {len(token_to_id)} tokens) has no "
                "number tokens: none of its tokens is a string of ASCII digits "
                f"(multi_digit={multi_digit}, prefixed={prefixed}); NTL needs digit tokens"
            )
        vocab = cls(
            entries,
            vocab_size=vocab_size,
            tokens=tokens,
            skipped=skipped,
            minus_ids=minus,
            decimal_point_ids=points,
            word_start_ids=word_starts,
        )
        missing = vocab.missing_digits()
        if missing:
            warnings.warn(
                f"the tokenizer has no number token for the digit(s) {', '.join(missing)}; "
                "NTL cannot reward or penalise those digits (see NumberVocab.describe())",
                stacklevel=2,
            )
        return vocab

    @classmethod
    def from_values(
        cls,
        values: Mapping[int, float | int | str],
        *,
        vocab_size: int,
        minus_ids: Iterable[int] = (),
        decimal_point_ids: Iterable[int] = (),
        word_start_ids: Iterable[int] = (),
    ) -> NumberVocab:
        """Build a vocabulary from an explicit ``{token_id: value_or_digit_string}`` map.

        A digit string (``"007"``) behaves like a tokenizer's number token: it is worth
        ``int(string)`` and belongs to the scale group of its length. A number (``7``, ``2.5``) is
        worth itself and all numbers share the unit scale, so distances between them are
        ``|a - b|``. Whole numbers (:func:`numtok.find_number_spans`) need digit strings or
        non-negative integers.

        Args:
            values: ``{token_id: value_or_digit_string}``, at least one entry.
            vocab_size: the number of logits the model produces.
            minus_ids: the minus-sign tokens that may begin a whole number (see the class
                docstring); not number tokens, nor decimal points. Without them, whole numbers are
                runs of number tokens.
            decimal_point_ids: the decimal-point tokens between the digit runs of a number; not
                number tokens, nor minus signs.
            word_start_ids: the number or minus tokens that begin a word (``Ġ12``, ``▁7``), so
                begin a new number after another.
        """
        if not isinstance(values, Mapping):
            raise TypeError(
                f"values must be a mapping {{token_id: value}}, got {type(values).__name__}"
            )
        if not values:
            raise ValueError("values must map at least one token id to a value, got an empty map")
        _check_vocab_size(vocab_size)
        entries: dict[int, tuple[float, str, int]] = {}
        for token_id, value in values.items():
            if isinstance(token_id, bool) or not isinstance(token_id, int):
                raise TypeError(f"token ids must be int, got {token_id!r}")
            if not 0 <= token_id < vocab_size:
                raise ValueError(
                    f"token id {token_id} is outside the vocabulary [0, {vocab_size}) "
                    f"(vocab_size={vocab_size})"
                )
            if isinstance(value, str):
                if not _is_ascii_digits(value):
                    raise ValueError(
                        f"value for token id {token_id} must be a string of ASCII digits or a "
                        f"finite number, got {value!r}"
                    )
                entries[token_id] = (float(int(value)), value, len(value))
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                if not math.isfinite(value):
                    raise ValueError(f"value for token id {token_id} must be finite, got {value!r}")
                entries[token_id] = (float(value), str(value), 1)
            else:
                raise TypeError(
                    f"value for token id {token_id} must be a number or a digit string, "
                    f"got {type(value).__name__}"
                )
        return cls(
            entries,
            vocab_size=vocab_size,
            minus_ids=minus_ids,
            decimal_point_ids=decimal_point_ids,
            word_start_ids=word_start_ids,
        )

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return int(self.ids.numel())

    def __repr__(self) -> str:
        whole_numbers = ""
        if self.minus_ids or self.decimal_point_ids or self.word_start_ids:
            whole_numbers = (
                f", minus_ids={list(self.minus_ids)}, "
                f"decimal_point_ids={list(self.decimal_point_ids)}, "
                f"{len(self.word_start_ids)} word starts"
            )
        return (
            f"NumberVocab({len(self)} number tokens, vocab_size={self.vocab_size}, "
            f"digit lengths {self.group_lengths}{whole_numbers})"
        )

    def missing_digits(self) -> list[str]:
        """The digits ``0``-``9`` that no single-digit number token carries."""
        present = {d for d in self.digits if len(d) == 1}
        return [d for d in "0123456789" if d not in present]

    def tables(self, device: torch.device | str | None = None) -> NumberTables:
        """The lookup tensors the losses read, on ``device`` (built once per device)."""
        device = torch.device(device) if device is not None else torch.device("cpu")
        cached = self._tables.get(device)
        if cached is None:
            position_of_id = torch.full((self.vocab_size,), -1, dtype=torch.long)
            position_of_id[self.ids] = torch.arange(len(self))
            cached = NumberTables(
                ids=self.ids.to(device),
                scaled_values=self.scaled_values.to(device),
                groups=self.groups.to(device),
                position_of_id=position_of_id.to(device),
            )
            self._tables[device] = cached
        return cached

    def describe(self) -> str:
        """A short human-readable audit of what was found and what was skipped."""
        by_length = Counter(len(d) for d in self.digits)
        lines = [
            f"NumberVocab: {len(self)} number tokens in a vocabulary of {self.vocab_size}",
            "  by digit length: "
            + ", ".join(f"{length}: {count}" for length, count in sorted(by_length.items())),
        ]
        first_of_length: dict[int, str] = {}
        for token_id, digits in zip(self.ids.tolist(), self.digits, strict=True):
            shown = self._tokens.get(token_id, digits)
            first_of_length.setdefault(len(digits), f"{shown!r} (id {token_id})")
        lines.append("  examples: " + ", ".join(list(first_of_length.values())[:_MAX_EXAMPLES]))
        lines.append(
            f"  whole numbers: minus signs {self._shown(self.minus_ids)}, decimal points "
            f"{self._shown(self.decimal_point_ids)}, {len(self.word_start_ids)} word starts"
        )
        if self._skipped:
            # By id, not in get_vocab()'s order (a fast tokenizer's changes between processes).
            skipped = sorted(self._skipped, key=lambda s: s.token_id)
            reasons = Counter(s.reason for s in skipped)
            lines.append(f"  skipped {len(skipped)} digit-like tokens:")
            for reason, count in sorted(reasons.items(), key=lambda rc: (-rc[1], rc[0])):
                shown_tokens = [s.token for s in skipped if s.reason == reason][:_MAX_EXAMPLES]
                lines.append(f"    {reason}: {count} (e.g. {', '.join(map(repr, shown_tokens))})")
        missing = self.missing_digits()
        if missing:
            lines.append(
                f"  WARNING: no single-digit token for {', '.join(missing)}: NTL cannot reward or "
                "penalise those digits"
            )
        return "\n".join(lines)

    def _shown(self, ids: tuple[int, ...]) -> str:
        """A few of ``ids`` as their tokens (``'-', 'Ġ-' (+3 more)``), or ``none``."""
        if not ids:
            return "none"
        shown = ", ".join(repr(self._tokens.get(i, i)) for i in ids[:_MAX_EXAMPLES])
        more = len(ids) - _MAX_EXAMPLES
        return shown + (f" (+{more} more)" if more > 0 else "")


def check_number_vocab(vocab: object) -> NumberVocab:
    """``vocab`` itself if it is a :class:`NumberVocab`; a ``TypeError`` otherwise."""
    if not isinstance(vocab, NumberVocab):
        raise TypeError(
            f"vocab must be a NumberVocab (NumberVocab.from_tokenizer(tokenizer)), "
            f"got {type(vocab).__name__}"
        )
    return vocab


def _check_vocab_size(vocab_size: object) -> None:
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")


def _id_tuple(name: str, ids: Iterable[int], vocab_size: int) -> tuple[int, ...]:
    """``ids`` as a sorted tuple of distinct ints in [0, vocab_size)."""
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise TypeError(f"{name} must be an iterable of int token ids, got {ids!r}")
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


def _whole_number_ids(
    number_ids: set[int],
    *,
    vocab_size: int,
    minus_ids: Iterable[int],
    decimal_point_ids: Iterable[int],
    word_start_ids: Iterable[int],
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """The checked ``(minus_ids, decimal_point_ids, word_start_ids)``: in range, minus signs and
    decimal points neither number tokens nor each other, word starts number tokens or minus
    signs."""
    minus = _id_tuple("minus_ids", minus_ids, vocab_size)
    points = _id_tuple("decimal_point_ids", decimal_point_ids, vocab_size)
    word_starts = _id_tuple("word_start_ids", word_start_ids, vocab_size)
    for name, ids in (("minus_ids", minus), ("decimal_point_ids", points)):
        overlap = sorted(number_ids.intersection(ids))
        if overlap:
            raise ValueError(f"{name} must not be number tokens, got the number token(s) {overlap}")
    both = sorted(set(minus) & set(points))
    if both:
        raise ValueError(f"minus_ids and decimal_point_ids must be disjoint, both hold {both}")
    strays = sorted(set(word_starts) - number_ids - set(minus))
    if strays:
        raise ValueError(
            f"word_start_ids must be number tokens or minus_ids, got {strays} (neither)"
        )
    return minus, points, word_starts
