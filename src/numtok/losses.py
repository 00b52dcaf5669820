"""Number Token Loss (NTL): the functional reference and its ``nn.Module`` wrapper.

Definitions (Zausinger et al., "Regress, Don't Guess", ICML 2025), at a position whose label ``y``
is a number token, with ``p = softmax(logits[number_token_ids])`` over the N number tokens only:

* ``kind="was"`` (NTL-WAS, the paper's default): the Wasserstein-1 distance between ``p`` and the
  one-hot label, ``Σ_j p_j · d(v_j, y)``.
* ``kind="mse" | "mae" | "huber"`` or a callable ``f(prediction, target)`` (NTL-Lp): the loss
  between the expected value ``ŷ = Σ_j p_j · v_j`` and ``y``.

Multi-digit tokens (``12``, ``Ġ123``: Llama-3, GPT-2, DeepSeek) are compared by *digit length*:
a label of length L is compared only with candidates of length L, on that length's scale
``v / 10**(L-1)`` (a 3-digit chunk's distances run 0-9.99, like a digit's), and mass on a number
token of another length costs the maximum distance ``D`` (the largest same-length distance). For
NTL-Lp the expected value is taken within the label's length, ``ŷ_L = Σ_{j∈L} q_j ṽ_j`` with ``q``
the softmax over those tokens, and the loss is ``P_L · f(ŷ_L, ỹ) + (1 - P_L) · D_f`` where
``P_L = Σ_{j∈L} p_j`` and ``D_f = max(|f(lo, hi)|, |f(hi, lo)|)`` over the scaled value range.
With single-digit number tokens only, ``P_L = 1`` and both flavours are exactly the plain
definitions above.

``kind="number"`` is the number-level loss of :mod:`numtok.number_level` (whole numbers assembled
with their place values, sign and decimals, compared by smape), read with the same
:class:`NumberVocab`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from numtok._logsumexp import selected_rows_logsumexp
from numtok._number_logits import compute_dtype, number_logits_at
from numtok._reduction import reduce_losses
from numtok._validation import (
    check_bool,
    check_elementwise_callable,
    check_int,
    check_logits_and_labels,
    check_loss_weights,
    check_num_items,
    check_number_vocab,
    check_reduction,
    check_squash_factor,
    shift_left,
)
from numtok.number_level import number_level_loss
from numtok.vocab import NumberTables, NumberVocab

__all__ = ["Kind", "number_token_loss"]

PointwiseLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
#: ``"was"``, ``"mse"``, ``"mae"``, ``"huber"``, ``"number"`` (number level) or a
#: callable ``f(prediction, target)`` returning an elementwise loss.
Kind = str | PointwiseLoss

_POINTWISE: dict[str, PointwiseLoss] = {
    "mse": lambda prediction, target: (prediction - target).square(),
    "mae": lambda prediction, target: (prediction - target).abs(),
    "huber": lambda prediction, target: F.huber_loss(prediction, target, reduction="none"),
}
_KINDS = ("was", *_POINTWISE)
#: The number-level kind, served by numtok.number_level.
NUMBER_LEVEL = "number"


def check_number_level_squash(squash_factor: float | None) -> None:
    if squash_factor is not None:
        raise ValueError(
            f"squash_factor applies to kind='was' only, got squash_factor={squash_factor!r} "
            "with kind='number'"
        )


# Reweighing charges mass outside the number tokens slightly more than the worst number token
# (ntloss's constant), so that any number token beats any text token.
_REWEIGH_MARGIN = 1.01


@dataclass(frozen=True)
class _LossSpec:
    """Validated settings plus the scalars derived from the vocabulary (no tensors)."""

    kind: str
    pointwise: PointwiseLoss | None
    reweigh: bool
    squash_factor: float | None
    ignore_index: int
    reduction: str
    shift: bool
    vocab_size: int
    single_group: bool
    max_distance: float
    min_nonzero_distance: float
    max_cost: float

    @classmethod
    def build(
        cls,
        vocab: NumberVocab,
        *,
        kind: Kind,
        reweigh: bool,
        squash_factor: float | None,
        ignore_index: int,
        reduction: str,
        shift: bool,
    ) -> _LossSpec:
        check_number_vocab(vocab)
        pointwise: PointwiseLoss | None
        if callable(kind):
            check_elementwise_callable("kind", kind)
            pointwise, kind_name = kind, getattr(kind, "__name__", "callable")
        elif kind in _KINDS:
            pointwise, kind_name = _POINTWISE.get(str(kind)), str(kind)
        else:
            raise ValueError(
                f"kind must be one of {(*_KINDS, NUMBER_LEVEL)} or a callable, got {kind!r}"
            )
        squash = check_squash_factor(squash_factor)
        if squash is not None and pointwise is not None:
            raise ValueError(
                f"squash_factor applies to kind='was' only, got squash_factor={squash_factor!r} "
                f"with kind={kind_name!r}"
            )
        if pointwise is None:
            farthest = torch.tensor(vocab.max_distance, dtype=torch.float64)
            max_cost = float(
                _squashed(farthest, squash, vocab.min_nonzero_distance, vocab.max_distance)
            )
        else:
            lo = vocab.scaled_values.min().reshape(1)
            hi = vocab.scaled_values.max().reshape(1)
            max_cost = max(float(pointwise(lo, hi).abs()), float(pointwise(hi, lo).abs()))
        return cls(
            kind=kind_name,
            pointwise=pointwise,
            reweigh=check_bool("reweigh", reweigh),
            squash_factor=squash,
            ignore_index=check_int("ignore_index", ignore_index),
            reduction=check_reduction(reduction),
            shift=check_bool("shift", shift),
            vocab_size=vocab.vocab_size,
            single_group=len(vocab.group_lengths) == 1,
            max_distance=vocab.max_distance,
            min_nonzero_distance=vocab.min_nonzero_distance,
            max_cost=max_cost,
        )

    def squash(self, distance: torch.Tensor) -> torch.Tensor:
        return _squashed(distance, self.squash_factor, self.min_nonzero_distance, self.max_distance)


def _squashed(
    distance: torch.Tensor, squash_factor: float | None, nearest: float, farthest: float
) -> torch.Tensor:
    """ntloss's squashing: 0 stays 0; the nearest wrong value costs 1 and the farthest costs
    ``squash_factor``, affinely in between: ``1 + (d - d_min)·(s - 1)/(D - d_min)``. The result
    does not change when all values are multiplied by a constant."""
    if squash_factor is None:
        return distance
    spread = farthest - nearest
    slope = (squash_factor - 1.0) / spread if spread > 0 else 0.0
    squashed = 1.0 + (distance - nearest) * slope
    return torch.where(distance == 0, torch.zeros_like(distance), squashed)


def _wasserstein(
    probs: torch.Tensor,
    target: torch.Tensor,
    values: torch.Tensor,
    same_group: torch.Tensor | None,
    spec: _LossSpec,
) -> torch.Tensor:
    """``Σ_j p_j · d(v_j, y)`` per position: probs (M, N), target (M,), values (N,) -> (M,)."""
    distance = (target[:, None] - values[None, :]).abs()  # (M, N)
    if same_group is not None:
        distance = torch.where(same_group, distance, torch.full_like(distance, spec.max_distance))
    return (probs * spec.squash(distance)).sum(dim=-1)


def _expected_value_loss(
    number_logits: torch.Tensor,
    probs: torch.Tensor,
    target: torch.Tensor,
    values: torch.Tensor,
    same_group: torch.Tensor | None,
    spec: _LossSpec,
) -> torch.Tensor:
    """``f(ŷ, y)`` with ``ŷ = Σ_j p_j v_j``; per length group as in the module docstring."""
    assert spec.pointwise is not None
    if same_group is None:
        return spec.pointwise(probs @ values, target)  # (M,)
    # Conditional distribution within the label's length, q = softmax(z restricted to L), and
    # the share of number mass it holds, P_L = exp(lse_L - lse_all_numbers).
    group_logits = torch.where(
        same_group, number_logits, torch.full_like(number_logits, -torch.inf)
    )
    group_lse = torch.logsumexp(group_logits, dim=-1)  # (M,)
    prediction = (torch.exp(group_logits - group_lse[:, None]) * values).sum(dim=-1)
    share = torch.exp(group_lse - torch.logsumexp(number_logits, dim=-1))
    return share * spec.pointwise(prediction, target) + (1.0 - share) * spec.max_cost


def _number_positions(
    flat_labels: torch.Tensor, tables: NumberTables, spec: _LossSpec
) -> tuple[torch.Tensor, torch.Tensor]:
    """Whether each label (M,) is a number token, and its index among the N number tokens (0
    where it is not)."""
    is_target = flat_labels != spec.ignore_index
    position = tables.position_of_id[torch.where(is_target, flat_labels, 0)]  # (M,) in [-1, N)
    return is_target & (position >= 0), position.clamp_min(0)


def _position_losses(
    number_logits: torch.Tensor, position: torch.Tensor, tables: NumberTables, spec: _LossSpec
) -> torch.Tensor:
    """NTL per position before reweighing and weights, (M,), from the finite number logits
    (M, N) in the compute dtype and each label's index among the number tokens (M,)."""
    values = tables.scaled_values.to(number_logits.dtype)  # (N,)
    target = values[position]  # (M,)
    same_group = (
        None
        if spec.single_group
        else tables.groups[position][:, None] == tables.groups[None, :]  # (M, N)
    )
    # p = exp(z - logsumexp(z)), the softmax written out: torch.softmax's CPU kernel is ~4x
    # slower for the 10 columns of a digit vocabulary (torch 2.13; 3072 x 10, forward + backward:
    # 841 us vs 354 us), and every digit tokenizer has exactly those 10 columns.
    probs = torch.exp(number_logits - torch.logsumexp(number_logits, dim=-1, keepdim=True))
    if spec.pointwise is None:
        return _wasserstein(probs, target, values, same_group, spec)
    return _expected_value_loss(number_logits, probs, target, values, same_group, spec)


def _reweighed(loss: torch.Tensor, log_number_mass: torch.Tensor, spec: _LossSpec) -> torch.Tensor:
    """``loss·m + 1.01·D·(1 - m)`` with ``m = exp(log_number_mass)`` the full-vocabulary mass on
    number tokens; ``m <= 1``, also where rounding (or a row of -inf logits) says otherwise."""
    mass = torch.exp(log_number_mass.clamp_max(0.0))
    return loss * mass + _REWEIGH_MARGIN * spec.max_cost * (1 - mass)


def _number_token_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    tables: NumberTables,
    spec: _LossSpec,
    loss_weights: torch.Tensor | None,
    num_items_in_batch: torch.Tensor | int | None,
) -> torch.Tensor:
    logits, labels = check_logits_and_labels(
        logits, labels, vocab_size=spec.vocab_size, ignore_index=spec.ignore_index
    )
    loss_weights = check_loss_weights(loss_weights, labels.shape)
    num_items = check_num_items(num_items_in_batch)
    if spec.shift:
        labels = shift_left(labels, spec.ignore_index)
        loss_weights = None if loss_weights is None else shift_left(loss_weights, 0)
    dtype = compute_dtype(logits)
    vocab_size = logits.shape[-1]

    flat_labels = labels.reshape(-1)  # (M,)
    is_number, position = _number_positions(flat_labels, tables, spec)

    number_logits = number_logits_at(logits, None, tables.ids, dtype)  # (M, N), finite
    loss = _position_losses(number_logits, position, tables, spec)

    if spec.reweigh:
        # The full-vocabulary number mass m = exp(lse(number logits) - lse(all logits)) at the
        # number-labelled rows; finding the rows reads their count back from the device.
        rows = is_number.nonzero().squeeze(1)  # (K,)
        lse_all = selected_rows_logsumexp(logits.reshape(-1, vocab_size), rows, dtype)  # (K,)
        lse_numbers = torch.logsumexp(number_logits.index_select(0, rows), dim=-1)  # (K,)
        reweighed = _reweighed(loss.index_select(0, rows), lse_numbers - lse_all, spec)
        loss = loss.index_copy(0, rows, reweighed)

    weights = is_number.to(dtype)
    if loss_weights is not None:
        weights = weights * loss_weights.reshape(-1).to(dtype)
    per_position = torch.where(is_number, loss * weights, torch.zeros_like(loss))  # (M,)

    return reduce_losses(per_position, labels.shape, spec.reduction, num_items, weights.sum())


def number_token_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    vocab: NumberVocab,
    *,
    kind: Kind = "was",
    reweigh: bool = False,
    squash_factor: float | None = None,
    loss_weights: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    num_items_in_batch: torch.Tensor | int | None = None,
    shift: bool = False,
) -> torch.Tensor:
    """Number Token Loss; add it to cross-entropy: ``loss = ce + 0.3 * ntl``.

    At a position whose label ``y`` is a number token, with ``p`` the softmax over the number-token
    logits only (see the module docstring for tokens of several digits):

    * ``kind="was"``: ``ℓ = Σ_j p_j · d(v_j, y)``, ``d = |v_j - y|`` (or its squashed form);
    * ``kind="mse"|"mae"|"huber"|callable``: ``ℓ = f(Σ_j p_j v_j, y)``;
    * ``kind="number"``: :func:`numtok.number_level.number_level_loss` (smape) on whole numbers.

    Every other position (text labels, ``ignore_index``) contributes exactly 0.

    Args:
        logits: (..., V) float32, bfloat16, float16 or float64; V must equal ``vocab.vocab_size``.
            Only the N number-token columns are gathered and computed in float32 (float64 stays
            float64); the logits are never upcast or copied as a whole.
        labels: (...) integer token ids in [0, V) or ``ignore_index``.
        vocab: the :class:`NumberVocab` of the tokenizer.
        kind: ``"was"`` (NTL-WAS), ``"mse"``, ``"mae"``, ``"huber"`` (delta 1), ``"number"``
            (number level) or a callable ``f(prediction, target) -> elementwise loss`` (NTL-Lp).
        reweigh: multiply by the full-vocabulary number mass ``m`` at the position and add
            ``1.01 · D · (1 - m)`` (ntloss's definition; ``D`` the largest cost), which penalises
            putting mass on text where a number is due. Off by default, as in the paper.
        squash_factor: ``s > 1`` rescales WAS distances so that the farthest wrong number costs
            ``s`` times the nearest wrong one: ``d' = 1 + (d - d_min)(s - 1)/(D - d_min)``.
        loss_weights: (...) non-negative weights, the labels' shape.
        ignore_index: label value that is skipped.
        reduction: ``"mean"`` (``Σ w ℓ / Σ w`` over number positions), ``"sum"`` or ``"none"``
            (``w · ℓ`` per position, the labels' shape, 0 at non-number positions).
        num_items_in_batch: replaces the mean's denominator, for exact gradient accumulation.
        shift: compare ``logits[..., t, :]`` with ``labels[..., t + 1]`` (causal LMs). The labels
            are shifted, not the logits: with ``"none"`` the result keeps the labels' shape and
            its last position is 0.

    Returns:
        A float32 scalar (float64 for float64 logits), or the labels' shape for ``"none"``. A batch
        without number positions gives 0, still connected to the graph.

    Example:
        >>> import torch
        >>> from numtok import NumberVocab, number_token_loss
        >>> vocab = NumberVocab.from_values({i: str(i) for i in range(10)}, vocab_size=12)
        >>> logits = torch.full((1, 12), -30.0); logits[0, 4] = 30.0  # predicts "4"
        >>> float(number_token_loss(logits, torch.tensor([5]), vocab))  # label "5"
        1.0
    """
    if isinstance(kind, str) and kind == NUMBER_LEVEL:
        check_number_level_squash(squash_factor)
        return number_level_loss(
            logits,
            labels,
            vocab,
            reweigh=reweigh,
            loss_weights=loss_weights,
            ignore_index=ignore_index,
            reduction=reduction,
            num_items_in_batch=num_items_in_batch,
            shift=shift,
        )
    spec = _LossSpec.build(
        vocab,
        kind=kind,
        reweigh=reweigh,
        squash_factor=squash_factor,
        ignore_index=ignore_index,
        reduction=reduction,
        shift=shift,
    )
    device = logits.device if isinstance(logits, torch.Tensor) else None
    return _number_token_loss(
        logits, labels, vocab.tables(device), spec, loss_weights, num_items_in_batch
    )
