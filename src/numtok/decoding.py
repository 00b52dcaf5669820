"""What a model's logits say about numbers: the expected value of the number token at each
position, and the expected value of each whole number in a sequence.

Values are the number tokens' own values (``"7"`` is 7, ``"123"`` is 123), as in ntloss's
``predict_numbers``. Only the N number-token columns are gathered and computed in float32 (float64
logits stay float64); the logits are never upcast as a whole.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from numtok._logsumexp import selected_rows_logsumexp
from numtok._number_logits import compute_dtype, number_logits_at
from numtok._validation import check_logits
from numtok.spans import NumberSpans, span_tables, span_values
from numtok.vocab import NumberVocab, check_number_vocab

__all__ = ["ExpectedNumbers", "expected_numbers", "expected_span_values"]


class ExpectedNumbers(NamedTuple):
    """``value`` (...): ``Σ_j p_j v_j`` with ``p`` the softmax over the number-token logits only;
    ``mass`` (...): the full-vocabulary probability of all number tokens together."""

    value: torch.Tensor
    mass: torch.Tensor


def expected_token_values(number_logits: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``Σ_j softmax(z)_j v_j`` per row: number logits (K, N), raw values (N,) -> (K,)."""
    return torch.softmax(number_logits, dim=-1) @ values.to(number_logits.dtype)


def expected_numbers(logits: torch.Tensor, vocab: NumberVocab) -> ExpectedNumbers:
    """The expected number-token value and the number-token mass at every position.

    With ``z`` the logits (..., V) and ``N`` the number tokens (values ``v``):

    * ``value = Σ_{j∈N} softmax(z_N)_j · v_j`` — the model's guess *given* that a number token
      comes (what ntloss calls ``predict_numbers``);
    * ``mass = Σ_{j∈N} softmax(z)_j = exp(logsumexp(z_N) - logsumexp(z))`` — how likely a
      number token comes at all.

    With tokens of several digits, ``value`` mixes lengths (a 1-digit and a 3-digit token both
    count their own value); :func:`expected_span_values` places them in whole numbers.

    Returns:
        :class:`ExpectedNumbers` of two (...) tensors, float32 (float64 for float64 logits).

    >>> vocab = NumberVocab.from_values({i: str(i) for i in range(10)}, vocab_size=11)
    >>> logits = torch.full((1, 11), -torch.inf); logits[0, 3] = logits[0, 5] = 0.0
    >>> expected_numbers(logits, vocab)
    ExpectedNumbers(value=tensor([4.]), mass=tensor([1.]))
    """
    numbers = check_number_vocab(vocab)
    logits = check_logits(logits, vocab_size=numbers.vocab_size)
    dtype = compute_dtype(logits)
    tables = numbers.tables(logits.device)
    logits_2d = logits.reshape(-1, logits.shape[-1])  # (M, V)
    number_logits = number_logits_at(logits, None, tables.ids, dtype)  # (M, N)
    value = expected_token_values(number_logits, numbers.values.to(logits.device))
    all_rows = torch.arange(logits_2d.shape[0], device=logits.device)
    log_mass = torch.logsumexp(number_logits, dim=-1) - selected_rows_logsumexp(
        logits_2d, all_rows, dtype
    )
    shape = logits.shape[:-1]
    return ExpectedNumbers(value.reshape(shape), torch.exp(log_mass).reshape(shape))


def expected_span_values(
    logits: torch.Tensor, spans: NumberSpans, vocab: NumberVocab
) -> torch.Tensor:
    """The expected value of each whole number, given the logits that produced its tokens.

    For spans found with :func:`~numtok.spans.find_number_spans` in token ids (..., T) and the
    logits (..., T, V) scored at the same positions (``logits[..., t, :]`` is the distribution
    the token at t was drawn from, e.g. ``torch.stack(generate(...).scores, dim=1)`` with the
    generated ids), each span's expected value is ``±Σ_t ŷ_t · 10**place_t`` over its number
    tokens, with ``ŷ_t`` the :func:`expected_numbers` value at t and the places and sign of the
    span. With ``logits`` from a training step (``logits[t]`` predicts token ``t + 1``), pass
    ``logits[..., :-1, :]`` and spans of ``ids[..., 1:]``.

    Returns:
        (S,) float64, differentiable with respect to ``logits``.
    """
    check_number_vocab(vocab)
    if not isinstance(spans, NumberSpans):
        raise TypeError(f"spans must be NumberSpans, got {type(spans).__name__}")
    logits = check_logits(logits, vocab_size=vocab.vocab_size)
    if logits.shape[:-1] != spans.span_of_token.shape:
        raise ValueError(
            f"logits must have shape (*token_ids.shape, V) for the token ids the spans were "
            f"found in, {tuple(spans.span_of_token.shape)}; got {tuple(logits.shape)}"
        )
    tables = span_tables(vocab, logits.device)
    number_logits = number_logits_at(
        logits, spans.number_positions, tables.ids, compute_dtype(logits)
    )
    return span_values(expected_token_values(number_logits, tables.values), spans)
