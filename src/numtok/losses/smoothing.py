"""Gaussian label smoothing over number values: the paper's strongest non-NTL baseline.

Cross-entropy with a soft target at number positions. At a position whose label ``y`` is a number
token of digit length ``L``, the target spreads over the number tokens of the same length,

    q_j ∝ exp(-(ṽ_j - ỹ)² / 2σ²)  for j of length L,   q_j = 0 otherwise,

with ``ṽ = v / 10**(L-1)`` the token values on their length's scale (as in
:func:`numtok.number_token_loss`: a 3-digit chunk's values run 0-9.99 like a digit's, so ``σ`` is
in units of the leading digit whatever the length). The loss is
``-Σ_j q_j log softmax(z)_j = logsumexp(z) - Σ_j q_j z_j`` over the full vocabulary. Every other
position (text labels) gets plain cross-entropy ``logsumexp(z) - z_y``. As ``σ → 0`` the target
becomes one-hot and the loss is exactly cross-entropy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from numtok._common.reduction import reduce_losses
from numtok._common.shift import shift_left
from numtok._common.validation import (
    check_bool,
    check_int,
    check_logits_and_labels,
    check_num_items,
    check_number,
    check_reduction,
)
from numtok.numbers.buffers import VocabBuffers
from numtok.numbers.vocab import NumberTables, NumberVocab, check_number_vocab
from numtok.ops.kernels.torch_rows import row_statistics
from numtok.ops.number_logits import compute_dtype

__all__ = ["GaussianLabelSmoothingLoss", "gaussian_label_smoothing_ce"]


@dataclass(frozen=True)
class _SmoothingSpec:
    sigma: float
    ignore_index: int
    reduction: str
    shift: bool
    vocab_size: int

    @classmethod
    def build(
        cls, vocab: NumberVocab, *, sigma: float, ignore_index: int, reduction: str, shift: bool
    ) -> _SmoothingSpec:
        check_number_vocab(vocab)
        why = " (the width of the target over number values)"
        return cls(
            sigma=check_number("sigma", sigma, minimum=0, inclusive=False, why=why),
            ignore_index=check_int("ignore_index", ignore_index),
            reduction=check_reduction(reduction),
            shift=check_bool("shift", shift),
            vocab_size=vocab.vocab_size,
        )


def _gaussian_label_smoothing_ce(
    logits: torch.Tensor,
    labels: torch.Tensor,
    tables: NumberTables,
    spec: _SmoothingSpec,
    num_items_in_batch: torch.Tensor | int | None,
) -> torch.Tensor:
    logits, labels = check_logits_and_labels(
        logits, labels, vocab_size=spec.vocab_size, ignore_index=spec.ignore_index
    )
    num_items = check_num_items(num_items_in_batch)
    if spec.shift:
        labels = shift_left(labels, spec.ignore_index)
    dtype = compute_dtype(logits)
    logits_2d = logits.reshape(-1, logits.shape[-1])  # (M, V)
    flat_labels = labels.reshape(-1)  # (M,)
    scored = flat_labels != spec.ignore_index
    safe_labels = torch.where(scored, flat_labels, 0)
    # One pass over the logits; the backward writes a single (M, V) gradient buffer.
    lse, label_logit, number_logits = row_statistics(logits_2d, safe_labels, tables.ids, dtype)

    # Σ_v q_v z_v: the label's own logit where q is one-hot (text labels), the Gaussian-weighted
    # number logits at number labels.
    position = tables.position_of_id[safe_labels]  # (M,) index into N, -1 for text
    number_rows = (scored & (position >= 0)).nonzero().squeeze(1)  # (K,)
    label_position = position.index_select(0, number_rows)
    values = tables.scaled_values.to(dtype)  # (N,)
    distance = values[None, :] - values[label_position][:, None]  # (K, N)
    same_length = tables.groups[label_position][:, None] == tables.groups[None, :]
    log_target = torch.where(
        same_length, -distance.square() / (2 * spec.sigma**2), -torch.inf
    )  # (K, N); the label's own token has 0, so no row is all -inf
    soft_logit = (torch.softmax(log_target, dim=-1) * number_logits[number_rows]).sum(dim=-1)
    target_logit = label_logit.index_copy(0, number_rows, soft_logit)  # (M,)
    per_row = torch.where(scored, lse - target_logit, torch.zeros_like(lse))  # (M,)

    return reduce_losses(per_row, labels.shape, spec.reduction, num_items, scored.sum())


def gaussian_label_smoothing_ce(
    logits: torch.Tensor,
    labels: torch.Tensor,
    vocab: NumberVocab,
    *,
    sigma: float = 1.0,
    ignore_index: int = -100,
    reduction: str = "mean",
    num_items_in_batch: torch.Tensor | int | None = None,
    shift: bool = False,
) -> torch.Tensor:
    """Cross-entropy with Gaussian-smoothed targets at number labels (module docstring). Use it
    *instead of* cross-entropy.

    Args:
        logits: (..., V) float32, bfloat16, float16 or float64; V must equal ``vocab.vocab_size``.
            One pass over row chunks in float32 reads the log-sum-exp, the label's logit and the
            number-token logits; the logits are never upcast as a whole, and the backward writes
            one gradient buffer of the logits' size (as ``F.cross_entropy``).
        labels: (...) integer token ids in [0, V) or ``ignore_index``.
        vocab: the :class:`~numtok.NumberVocab` of the tokenizer.
        sigma: width of the target on the length's value scale; > 0. ``sigma=1`` gives the
            neighbouring digit ``e**-0.5 ≈ 0.61`` times the label's weight.
        ignore_index: label value that is skipped.
        reduction: ``"mean"`` over the positions that are not ignored (as ``F.cross_entropy``),
            ``"sum"`` or ``"none"`` (the labels' shape, 0 at ignored positions).
        num_items_in_batch: replaces the mean's denominator, for exact gradient accumulation.
        shift: compare ``logits[..., t, :]`` with ``labels[..., t + 1]`` (causal LMs).

    Returns:
        A scalar (labels' shape for ``"none"``), float32 (float64 for float64 logits). With every
        label ignored the mean is 0, still connected to the graph.

    Example:
        >>> import torch
        >>> import torch.nn.functional as F
        >>> vocab = NumberVocab.from_values({i: str(i) for i in range(10)}, vocab_size=12)
        >>> logits, labels = torch.randn(4, 12), torch.tensor([3, 11, 7, -100])
        >>> smoothed = gaussian_label_smoothing_ce(logits, labels, vocab, sigma=1e-3)
        >>> torch.allclose(smoothed, F.cross_entropy(logits, labels))
        True
    """
    spec = _SmoothingSpec.build(
        vocab, sigma=sigma, ignore_index=ignore_index, reduction=reduction, shift=shift
    )
    device = logits.device if isinstance(logits, torch.Tensor) else None
    return _gaussian_label_smoothing_ce(
        logits, labels, vocab.tables(device), spec, num_items_in_batch
    )


class GaussianLabelSmoothingLoss(VocabBuffers):
    """``nn.Module`` form of :func:`gaussian_label_smoothing_ce`: settings validated once, the
    vocabulary's tables are buffers.

    ``forward(logits, labels, *, num_items_in_batch=None)``.
    """

    def __init__(
        self,
        vocab: NumberVocab,
        *,
        sigma: float = 1.0,
        ignore_index: int = -100,
        reduction: str = "mean",
        shift: bool = False,
    ) -> None:
        super().__init__()
        self.spec = _SmoothingSpec.build(
            vocab, sigma=sigma, ignore_index=ignore_index, reduction=reduction, shift=shift
        )
        self.register_tables(vocab)

    def forward(
        self,
        logits: torch.Tensor,
        labels: torch.Tensor,
        *,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor:
        tables = self.tables()
        return _gaussian_label_smoothing_ce(logits, labels, tables, self.spec, num_items_in_batch)

    def extra_repr(self) -> str:
        spec = self.spec
        return (
            f"sigma={spec.sigma}, ignore_index={spec.ignore_index}, "
            f"reduction={spec.reduction!r}, shift={spec.shift}, vocab_size={spec.vocab_size}"
        )
