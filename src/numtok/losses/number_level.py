"""Number-level NTL: the expected value of each whole number in the labels, compared with the true
number.

For each number span ``s`` of the labels (see :func:`numtok.numbers.spans.find_number_spans`), with
``ŷ_t = Σ_j softmax(z_t[number tokens])_j · v_j`` the expected value of the number token at
position ``t`` (raw token values: ``"123"`` is worth 123):

    ŷ_s = ± Σ_{t ∈ s} ŷ_t · 10**place_t        y_s = the span's true value

where the places and the sign come from the label (``123|4`` puts the first token at 10**1,
``12.34`` puts ``34`` at 10**-2). The error is

* ``error="smape"`` (ntloss's choice, bounded in [0, 1]): ``|ŷ - y| / (|ŷ| + |y|)``, 0 where
  both are 0. Scale-free: ``1`` against ``9`` costs 0.8 at 10**-300 as at 10**300. (ntloss adds
  float32's machine epsilon, 1.19e-7, to the denominator, which fades the loss of numbers below
  about 10**-6: ``0.00000001`` against ``0.00000009`` costs 0.365 there, not 0.8.)
* ``error="log"``: ``|slog(ŷ) - slog(y)|`` with ``slog(x) = sign(x)·log1p(|x|)``.

On single-digit tokens and integer spans this is ntloss 0.3.2's ``NumberLevelLoss``; unlike it,
chunk tokenizers (``123|4``) get their true place values, decimals their true scale and negative
numbers their sign. The loss of a span sits at its first number token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from numtok._common.reduction import reduce_losses
from numtok._common.shift import shift_labels
from numtok._common.validation import (
    check_bool,
    check_int,
    check_logits_and_labels,
    check_loss_weights,
    check_num_items,
    check_reduction,
)
from numtok.numbers.spans import (
    NumberSpans,
    SpanTables,
    find_number_spans_from_tables,
    span_tables,
    span_values,
)
from numtok.numbers.vocab import NumberVocab, check_number_vocab
from numtok.ops.number_logits import compute_dtype, expected_token_values
from numtok.ops.sources import LogitsRows, NumberRows

__all__ = [
    "ERRORS",
    "NumberLevelLoss",
    "NumberLevelSpec",
    "number_level_loss",
    "number_level_loss_of_rows",
]

ERRORS = ("smape", "log")

# As in the token-level loss: mass outside the number tokens costs slightly more than the worst
# number (smape's bound, 1).
_REWEIGH_MARGIN = 1.01
# 10**308 is the largest power of ten float64 holds: longer numbers cannot be assembled.
_MAX_DIGITS = 308


@dataclass(frozen=True)
class NumberLevelSpec:
    """The validated settings of the number-level loss (:meth:`build` raises on bad ones)."""

    error: str
    reweigh: bool
    ignore_index: int
    reduction: str
    shift: bool
    vocab_size: int

    @classmethod
    def build(
        cls,
        vocab: NumberVocab,
        *,
        error: str,
        reweigh: bool,
        ignore_index: int,
        reduction: str,
        shift: bool,
    ) -> NumberLevelSpec:
        check_number_vocab(vocab)
        if error not in ERRORS:
            raise ValueError(f"error must be one of {ERRORS}, got {error!r}")
        if check_bool("reweigh", reweigh) and error != "smape":
            raise ValueError(
                f"reweigh=True needs a bounded error (error='smape'), got error={error!r}"
            )
        return cls(
            error=str(error),
            reweigh=reweigh,
            ignore_index=check_int("ignore_index", ignore_index),
            reduction=check_reduction(reduction),
            shift=check_bool("shift", shift),
            vocab_size=vocab.vocab_size,
        )


def _signed_log1p(x: torch.Tensor) -> torch.Tensor:
    return torch.sign(x) * torch.log1p(x.abs())


def span_errors(
    number_logits: torch.Tensor, spans: NumberSpans, values: torch.Tensor, error: str
) -> torch.Tensor:
    """The error of each span's expected value (module docstring), (S,) float64, from the number
    logits (K, N) at ``spans.number_positions`` and the raw number-token values (N,). A fused
    cross-entropy path that already holds the number logits of every row can call this with
    ``number_logits[spans.number_positions]``."""
    predicted = span_values(expected_token_values(number_logits, values), spans)  # (S,)
    target = spans.values  # (S,) float64
    if error == "smape":
        # |ŷ - y| <= |ŷ| + |y|, so the ratio is 0 where the denominator is (both 0) and no
        # constant is added: one of a fixed size would set a scale below which the loss fades.
        denominator = predicted.abs() + target.abs()
        positive = denominator > 0
        ratio = (predicted - target).abs() / torch.where(positive, denominator, 1.0)
        return torch.where(positive, ratio, 0.0)
    return (_signed_log1p(predicted) - _signed_log1p(target)).abs()


def _number_level_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    tables: SpanTables,
    spec: NumberLevelSpec,
    loss_weights: torch.Tensor | None,
    num_items_in_batch: torch.Tensor | int | None,
) -> torch.Tensor:
    logits, labels = check_logits_and_labels(
        logits, labels, vocab_size=spec.vocab_size, ignore_index=spec.ignore_index
    )
    loss_weights = check_loss_weights(loss_weights, labels)
    num_items = check_num_items(num_items_in_batch)
    if labels.dim() < 1:
        raise ValueError("labels must have a sequence dimension (..., T), got a scalar")
    if spec.shift:
        labels, loss_weights = shift_labels(labels, loss_weights, spec.ignore_index)
    source = LogitsRows(logits, tables.ids, compute_dtype(logits))
    return number_level_loss_of_rows(source, labels, loss_weights, tables, spec, num_items)


def number_level_loss_of_rows(
    source: NumberRows,
    labels: torch.Tensor,
    loss_weights: torch.Tensor | None,
    tables: SpanTables,
    spec: NumberLevelSpec,
    num_items: torch.Tensor | int | None,
) -> torch.Tensor:
    """The number-level loss of validated ``labels`` (..., T) and ``loss_weights`` (...) or None,
    both already shifted when ``spec.shift``, reading the number logits and the log-sum-exp of
    the flat positions from ``source`` (the logits, or the number head)."""
    spans = find_number_spans_from_tables(labels, tables, spec.ignore_index)
    too_long = spans.digits > _MAX_DIGITS
    if bool(too_long.any()):
        raise ValueError(
            f"labels hold a number of {int(spans.digits[too_long][0])} digits; number-level "
            f"losses assemble numbers in float64, which holds at most {_MAX_DIGITS} digits"
        )
    dtype = source.dtype
    number_logits = source.number_logits(spans.number_positions)  # (K, N)
    loss = span_errors(number_logits, spans, tables.values, spec.error)  # (S,) float64

    if spec.reweigh:
        # Full-vocabulary number mass at each span's first number token (ntloss's choice):
        # m = exp(logsumexp(number logits) - lse).
        first = torch.searchsorted(spans.number_positions, spans.first_number)  # (S,) into K
        first_logits = number_logits.index_select(0, first)  # (S, N)
        label = tables.position_of_id[labels.reshape(-1).index_select(0, spans.first_number)]
        label_logit = first_logits.gather(1, label[:, None]).squeeze(1)  # (S,)
        lse = source.lse(spans.first_number, label_logit)
        mass = torch.exp(torch.logsumexp(first_logits, dim=-1) - lse).to(loss.dtype)
        loss = loss * mass + _REWEIGH_MARGIN * (1 - mass)

    loss = loss.to(dtype)
    if loss_weights is None:
        weights = torch.ones_like(loss)
    else:
        weights = loss_weights.reshape(-1).index_select(0, spans.first_number).to(dtype)
    per_span = loss * weights  # (S,)

    # Each span's loss sits at its first number token.
    per_position = loss.new_zeros(labels.numel()).index_add(0, spans.first_number, per_span)
    return reduce_losses(per_position, labels.shape, spec.reduction, num_items, weights.sum())


def number_level_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    vocab: NumberVocab,
    *,
    error: str = "smape",
    reweigh: bool = False,
    loss_weights: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    num_items_in_batch: torch.Tensor | int | None = None,
    shift: bool = False,
) -> torch.Tensor:
    """Number-level NTL (see the module docstring); add it to cross-entropy like the token-level
    loss.

    Args:
        logits: (..., T, V) float32, bfloat16, float16 or float64; V must equal
            ``vocab.vocab_size``. Only the number-token columns at number positions are gathered
            and computed in float32 (float64 stays float64); numbers are assembled in float64.
        labels: (..., T) integer token ids in [0, V) or ``ignore_index``; spans never cross rows.
        vocab: the :class:`~numtok.NumberVocab` of the tokenizer, with its minus-sign,
            decimal-point and word-start ids (:meth:`~numtok.NumberVocab.from_tokenizer` reads
            them); its number tokens must be digit strings.
        error: ``"smape"`` or ``"log"``.
        reweigh: multiply by the full-vocabulary number mass ``m`` at the span's first number
            token and add ``1.01 · (1 - m)`` (ntloss's definition; smape only).
        loss_weights: (..., T) non-negative; a span takes the weight at its first number token.
        ignore_index: label value that is skipped (it also ends a number).
        reduction: ``"mean"`` (``Σ w ℓ / Σ w`` over spans), ``"sum"`` or ``"none"`` (``w · ℓ``
            at each span's first number token, 0 elsewhere, the labels' shape).
        num_items_in_batch: replaces the mean's denominator, for exact gradient accumulation.
        shift: compare ``logits[..., t, :]`` with ``labels[..., t + 1]`` (causal LMs).

    Returns:
        A scalar (labels' shape for ``"none"``), float32 (float64 for float64 logits). A batch
        without numbers gives 0, still connected to the graph.

    Raises:
        ValueError: besides the usual argument checks, for a label number of more than 308
            digits, which float64 cannot assemble, and for a vocabulary whose number tokens are
            not digit strings.

    Example:
        >>> import torch
        >>> from numtok import NumberVocab
        >>> vocab = NumberVocab.from_values({i: str(i) for i in range(10)}, vocab_size=12)
        >>> labels = torch.tensor([1, 2, 10])  # "12" then a word
        >>> logits = torch.full((3, 12), -30.0)
        >>> logits[0, 1] = logits[1, 3] = logits[2, 10] = 30.0  # predicts "13"
        >>> round(float(number_level_loss(logits, labels, vocab)), 4)  # |13-12| / (13+12)
        0.04
    """
    spec = NumberLevelSpec.build(
        vocab,
        error=error,
        reweigh=reweigh,
        ignore_index=ignore_index,
        reduction=reduction,
        shift=shift,
    )
    device = logits.device if isinstance(logits, torch.Tensor) else None
    return _number_level_loss(
        logits, labels, span_tables(vocab, device), spec, loss_weights, num_items_in_batch
    )


class NumberLevelLoss(nn.Module):
    """``nn.Module`` form of :func:`number_level_loss`: settings validated once, the span tables
    are buffers (``.to(device)``, ``state_dict``).

    ``forward(logits, labels, *, loss_weights=None, num_items_in_batch=None)``.
    """

    ids: torch.Tensor
    values: torch.Tensor
    digit_counts: torch.Tensor
    position_of_id: torch.Tensor
    token_class: torch.Tensor

    def __init__(
        self,
        vocab: NumberVocab,
        *,
        error: str = "smape",
        reweigh: bool = False,
        ignore_index: int = -100,
        reduction: str = "mean",
        shift: bool = False,
    ) -> None:
        super().__init__()
        self.spec = NumberLevelSpec.build(
            vocab,
            error=error,
            reweigh=reweigh,
            ignore_index=ignore_index,
            reduction=reduction,
            shift=shift,
        )
        for name, tensor in span_tables(vocab)._asdict().items():
            self.register_buffer(name, tensor.clone())

    def forward(
        self,
        logits: torch.Tensor,
        labels: torch.Tensor,
        *,
        loss_weights: torch.Tensor | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor:
        tables = SpanTables(
            self.ids, self.values, self.digit_counts, self.position_of_id, self.token_class
        )
        return _number_level_loss(
            logits, labels, tables, self.spec, loss_weights, num_items_in_batch
        )

    def extra_repr(self) -> str:
        spec = self.spec
        return (
            f"error={spec.error!r}, reweigh={spec.reweigh}, ignore_index={spec.ignore_index}, "
            f"reduction={spec.reduction!r}, shift={spec.shift}, vocab_size={spec.vocab_size}"
        )
