"""Cross-entropy plus the Number Token Loss in one pass over the logits.

``cross_entropy_with_ntl(logits, labels, vocab, ntl_weight=w, ...)`` computes exactly

    F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=..., reduction=...)
    + w * number_token_loss(logits, labels, vocab, ...)

(labels shifted first when ``shift=True``) at less than the cost of ``F.cross_entropy`` alone.
Both terms read a logits row only through its log-sum-exp, the label's logit and the N number-token
logits (see :mod:`numtok._fused_rows`): one pass computes those, the loss is assembled from them on
(M,) and (M, N) tensors with ordinary autograd, and backward writes the logits' gradient once,
``softmax · (per-row coefficient)`` plus sparse fix-ups at the label and the number columns. At a
number-labelled position the number-token mass that ``reweigh`` needs comes free from the same
log-sum-exp: ``log m = logsumexp(z) - lse``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from numtok._fused_rows import row_statistics
from numtok._ntl_maths import Kind, LossSpec, number_positions, position_losses, reweighed
from numtok._number_logits import compute_dtype
from numtok._reduction import reduce_losses
from numtok._shift import shift_labels
from numtok._validation import (
    check_logits_and_labels,
    check_loss_weights,
    check_ntl_weight,
    check_num_items,
)
from numtok.vocab import NumberTables, NumberVocab

__all__ = ["CEWithNTLOutput", "cross_entropy_with_ntl", "cross_entropy_with_ntl_from_tables"]


@dataclass(frozen=True)
class CEWithNTLOutput:
    """Result of :func:`cross_entropy_with_ntl` and :func:`linear_cross_entropy_with_ntl`.

    Attributes:
        loss: ``ce + ntl_weight * ntl``, differentiable; a scalar, or the labels' shape for
            ``reduction="none"``.
        ce: the cross-entropy term, detached (for logging).
        ntl: the Number Token Loss term before ``ntl_weight``, detached (for logging).
    """

    loss: torch.Tensor
    ce: torch.Tensor
    ntl: torch.Tensor


class _Rows(NamedTuple):
    """What the loss needs to know about each (flattened, shifted) label position, all (M,)."""

    target_ids: torch.Tensor  # the label id, 0 where ignored (any valid column to gather)
    is_target: torch.Tensor  # the label is not ignore_index: counted by cross-entropy
    is_number: torch.Tensor  # the label is a number token: counted by NTL
    position: torch.Tensor  # the label's index among the N number tokens, 0 where not a number
    ntl_weights: torch.Tensor  # loss_weights at number positions, 0 elsewhere (compute dtype)


def prepare_rows(
    labels: torch.Tensor,
    loss_weights: torch.Tensor | None,
    tables: NumberTables,
    spec: LossSpec,
    dtype: torch.dtype,
) -> tuple[_Rows, torch.Size]:
    """Per-position facts for validated ``labels`` (...) and ``loss_weights`` (...), shifted
    left when ``spec.shift``; also returns the labels' shape (the shape of a ``"none"`` result)."""
    if spec.shift:
        labels, loss_weights = shift_labels(labels, loss_weights, spec.ignore_index)
    flat_labels = labels.reshape(-1)  # (M,)
    is_target = flat_labels != spec.ignore_index
    is_number, position = number_positions(flat_labels, tables, spec)
    ntl_weights = is_number.to(dtype)
    if loss_weights is not None:
        ntl_weights = ntl_weights * loss_weights.reshape(-1).to(dtype)
    rows = _Rows(
        target_ids=torch.where(is_target, flat_labels, 0),
        is_target=is_target,
        is_number=is_number,
        position=position,
        ntl_weights=ntl_weights,
    )
    return rows, labels.shape


def combine_terms(
    lse: torch.Tensor,
    target_logit: torch.Tensor,
    number_logits: torch.Tensor,
    rows: _Rows,
    tables: NumberTables,
    spec: LossSpec,
    ntl_weight: float,
    num_items: torch.Tensor | int | None,
    shape: torch.Size,
) -> CEWithNTLOutput:
    """CE + w·NTL from the row statistics ``lse`` (M,), ``target_logit`` (M,) and
    ``number_logits`` (M, N), with the reductions of ``F.cross_entropy`` and
    :func:`~numtok.number_token_loss`. Autograd through this function yields exactly the
    per-row coefficients that :func:`~numtok._fused_rows.write_row_gradient` expands."""
    ce = torch.where(rows.is_target, lse - target_logit, torch.zeros_like(lse))  # (M,)
    ntl = position_losses(number_logits, rows.position, tables, spec)  # (M,)
    if spec.reweigh:
        # log m = logsumexp(z) - lse; rows that are not numbers get m = 1 so that nothing
        # non-finite from them reaches the gradient.
        lse_numbers = torch.logsumexp(number_logits, dim=-1)
        ntl = reweighed(ntl, lse_numbers - torch.where(rows.is_number, lse, lse_numbers), spec)
    ntl = torch.where(rows.is_number, ntl * rows.ntl_weights, torch.zeros_like(ntl))  # (M,)

    ce = reduce_losses(ce, shape, spec.reduction, num_items, rows.is_target.sum())
    ntl = reduce_losses(ntl, shape, spec.reduction, num_items, rows.ntl_weights.sum())
    return CEWithNTLOutput(loss=ce + ntl_weight * ntl, ce=ce.detach(), ntl=ntl.detach())


def cross_entropy_with_ntl_from_tables(
    logits: torch.Tensor,
    labels: torch.Tensor,
    tables: NumberTables,
    spec: LossSpec,
    ntl_weight: float,
    loss_weights: torch.Tensor | None,
    num_items_in_batch: torch.Tensor | int | None,
) -> CEWithNTLOutput:
    """:func:`cross_entropy_with_ntl` with its settings already validated (``spec``,
    ``ntl_weight``) and the vocabulary's lookup tables already on the logits' device: what the
    module (:class:`~numtok.NumberTokenLoss`) and the Trainer adapter call. Checks the tensors."""
    logits, labels = check_logits_and_labels(
        logits, labels, vocab_size=spec.vocab_size, ignore_index=spec.ignore_index
    )
    loss_weights = check_loss_weights(loss_weights, labels.shape)
    num_items = check_num_items(num_items_in_batch)
    dtype = compute_dtype(logits)
    rows, shape = prepare_rows(labels, loss_weights, tables, spec, dtype)
    lse, target_logit, number_logits = row_statistics(
        logits.reshape(-1, spec.vocab_size), rows.target_ids, tables.ids, dtype
    )
    return combine_terms(
        lse, target_logit, number_logits, rows, tables, spec, ntl_weight, num_items, shape
    )


def cross_entropy_with_ntl(
    logits: torch.Tensor,
    labels: torch.Tensor,
    vocab: NumberVocab,
    *,
    ntl_weight: float = 0.3,
    kind: Kind = "was",
    reweigh: bool = False,
    squash_factor: float | None = None,
    loss_weights: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    num_items_in_batch: torch.Tensor | int | None = None,
    shift: bool = False,
) -> CEWithNTLOutput:
    """Cross-entropy plus ``ntl_weight`` times the Number Token Loss, fused.

    Exactly ``F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=...,
    reduction=...) + ntl_weight * number_token_loss(logits, labels, vocab, ...)`` with every
    setting shared, except that a ``"mean"`` over a batch with no target at all is 0 (PyTorch
    gives NaN). Each term keeps its own ``"mean"`` denominator: the non-ignored positions for
    cross-entropy, ``Σ loss_weights`` over number positions for NTL; ``num_items_in_batch``
    replaces both. ``loss_weights`` weigh the NTL term only, as in ``number_token_loss``.

    Cost: one read of the logits in forward (log-sum-exp in cache-sized row chunks, plus a gather
    of the label's and the number tokens' columns), one read and one write in backward (the only
    (M, V) buffer allocated is the gradient itself). bfloat16/float16 logits are processed in
    float32 chunks, never upcast as a whole. The computation itself never synchronises with the
    host; the argument checks do, once each: the label range check (and, when given, the check
    that ``loss_weights >= 0``) reads one boolean back from the device.

    Args:
        logits: (..., V) float32, bfloat16, float16 or float64; V must equal ``vocab.vocab_size``.
        labels: (...) integer token ids in [0, V) or ``ignore_index``.
        vocab: the :class:`~numtok.NumberVocab` of the tokenizer.
        ntl_weight: the factor ``w >= 0`` of the NTL term (the paper uses 0.3).
        kind, reweigh, squash_factor, loss_weights, ignore_index, reduction,
        num_items_in_batch, shift: as in :func:`~numtok.number_token_loss`; ``ignore_index``,
            ``reduction``, ``num_items_in_batch`` and ``shift`` apply to both terms.

    Returns:
        :class:`CEWithNTLOutput` with ``loss`` (differentiable) and the detached ``ce`` and
        ``ntl``: float32 scalars (float64 for float64 logits), or the labels' shape for
        ``reduction="none"``.

    Example:
        >>> import torch
        >>> import torch.nn.functional as F
        >>> from numtok import NumberVocab, number_token_loss
        >>> from numtok.fused import cross_entropy_with_ntl
        >>> vocab = NumberVocab.from_values({i: str(i) for i in range(10)}, vocab_size=12)
        >>> logits, labels = torch.randn(2, 5, 12), torch.tensor([[4, 11, 7, -100, 5]] * 2)
        >>> out = cross_entropy_with_ntl(logits, labels, vocab, ntl_weight=0.3)
        >>> reference = F.cross_entropy(logits.reshape(-1, 12), labels.reshape(-1))
        >>> reference = reference + 0.3 * number_token_loss(logits, labels, vocab)
        >>> bool(torch.isclose(out.loss, reference))
        True
    """
    spec = LossSpec.build(
        vocab,
        kind=kind,
        reweigh=reweigh,
        squash_factor=squash_factor,
        ignore_index=ignore_index,
        reduction=reduction,
        shift=shift,
    )
    weight = check_ntl_weight(ntl_weight)
    device = logits.device if isinstance(logits, torch.Tensor) else None
    return cross_entropy_with_ntl_from_tables(
        logits, labels, vocab.tables(device), spec, weight, loss_weights, num_items_in_batch
    )
