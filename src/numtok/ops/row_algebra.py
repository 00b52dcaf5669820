"""The row algebra of cross-entropy + NTL: every loss path (the logits given, the linear form in
the forward pass or recomputed) reads a row of logits only through its log-sum-exp ``lse``, the
label's logit ``x[y]`` and the N number-token logits ``z``, and this module turns those statistics
into the per-row loss terms, their reduction, and the per-row gradient coefficients

    ∂L/∂x = ∂L/∂lse · softmax(x) + ∂L/∂x[y] · onehot(y) + scatter(∂L/∂z -> number ids)

(see :func:`loss_and_row_gradients` for the formulas). At a number-labelled position the
number-token mass that ``reweigh`` needs comes free from the same statistics:
``log m = logsumexp(z) - lse``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from numtok._common.reduction import divided_by_count, reduce_losses
from numtok._common.shift import shift_labels
from numtok.maths.ntl import (
    LossSpec,
    number_positions,
    place_weights,
    position_losses,
    reweighed,
    reweighed_derivatives,
)
from numtok.numbers.vocab import NumberTables

__all__ = [
    "CEWithNTLOutput",
    "NumberTerms",
    "ReductionScales",
    "RowGradients",
    "Rows",
    "combine_terms",
    "loss_and_row_gradients",
    "number_terms",
    "prepare_rows",
    "reduce_terms",
    "reduction_scales",
    "row_gradients",
    "row_losses",
]


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


class Rows(NamedTuple):
    """What the loss needs to know about each (flattened, shifted) label position, all (M,)."""

    target_ids: torch.Tensor  # the label id, 0 where ignored (any valid column to gather)
    is_target: torch.Tensor  # the label is not ignore_index: counted by cross-entropy
    is_number: torch.Tensor  # the label is a number token: counted by NTL
    position: torch.Tensor  # the label's index among the N number tokens, 0 where not a number
    ntl_weights: torch.Tensor  # loss_weights at number positions, 0 elsewhere (compute dtype)
    place: torch.Tensor  # the place weights of DEL and DIST2 (compute dtype), 1 for other kinds

    def take(self, index: slice | torch.Tensor) -> Rows:
        """The same facts for the positions ``index`` (a chunk of rows)."""
        return Rows(*(fact[index] for fact in self))


def prepare_rows(
    labels: torch.Tensor,
    loss_weights: torch.Tensor | None,
    tables: NumberTables,
    spec: LossSpec,
    dtype: torch.dtype,
) -> tuple[Rows, torch.Size]:
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
    place = place_weights(labels, tables, spec, dtype)
    rows = Rows(
        target_ids=torch.where(is_target, flat_labels, 0),
        is_target=is_target,
        is_number=is_number,
        position=position,
        ntl_weights=ntl_weights,
        place=ntl_weights.new_ones(()).expand_as(ntl_weights)
        if place is None
        else place.reshape(-1),
    )
    return rows, labels.shape


def row_losses(
    lse: torch.Tensor,
    target_logit: torch.Tensor,
    base: torch.Tensor,
    number_lse: torch.Tensor | None,
    rows: Rows,
    spec: LossSpec,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy (m,) and NTL (m,) of each row, before the reduction: ``lse - x[y]`` where
    the label counts, else 0; the NTL ``base`` (m,), reweighed with ``log m = number_lse - lse``
    when ``spec.reweigh``, times the row's loss weight at number positions, else 0."""
    ce = torch.where(rows.is_target, lse - target_logit, torch.zeros_like(lse))  # (m,)
    ntl = base
    if number_lse is not None:
        # Rows that are not numbers get m = 1, so that nothing non-finite from them reaches the
        # gradient.
        ntl = reweighed(ntl, _log_number_mass(lse, number_lse, rows), spec)
    ntl = torch.where(rows.is_number, ntl * rows.ntl_weights, torch.zeros_like(ntl))  # (m,)
    return ce, ntl


def _log_number_mass(lse: torch.Tensor, number_lse: torch.Tensor, rows: Rows) -> torch.Tensor:
    """``log m = logsumexp(z) - lse`` at number positions, 0 elsewhere (m), as reweighing needs."""
    return number_lse - torch.where(rows.is_number, lse, number_lse)


def reduce_terms(
    ce: torch.Tensor,
    ntl: torch.Tensor,
    rows: Rows,
    spec: LossSpec,
    num_items: torch.Tensor | int | None,
    shape: torch.Size,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reduced cross-entropy and NTL terms from their values per row (M,) (as
    :func:`loss_and_row_gradients` gives them), with the reductions of ``F.cross_entropy`` and
    :func:`~numtok.number_token_loss`; the loss is ``ce + ntl_weight * ntl``."""
    ce = reduce_losses(ce, shape, spec.reduction, num_items, rows.is_target.sum())
    ntl = reduce_losses(ntl, shape, spec.reduction, num_items, rows.ntl_weights.sum())
    return ce, ntl


def combine_terms(
    lse: torch.Tensor,
    target_logit: torch.Tensor,
    number_logits: torch.Tensor,
    rows: Rows,
    tables: NumberTables,
    spec: LossSpec,
    ntl_weight: float,
    num_items: torch.Tensor | int | None,
    shape: torch.Size,
) -> CEWithNTLOutput:
    """CE + w·NTL from the row statistics ``lse`` (M,), ``target_logit`` (M,) and
    ``number_logits`` (M, N), with the reductions of ``F.cross_entropy`` and
    :func:`~numtok.number_token_loss`; differentiable with ordinary autograd. Autograd through
    this function yields exactly the per-row coefficients that :func:`loss_and_row_gradients`
    computes directly."""
    base = position_losses(number_logits, rows.position, tables, spec, rows.place)  # (M,)
    number_lse = torch.logsumexp(number_logits, dim=-1) if spec.reweigh else None
    ce, ntl = row_losses(lse, target_logit, base, number_lse, rows, spec)
    ce, ntl = reduce_terms(ce, ntl, rows, spec, num_items, shape)
    return CEWithNTLOutput(loss=ce + ntl_weight * ntl, ce=ce.detach(), ntl=ntl.detach())


# ------------------------------------------------------------------ gradient in the forward pass


class ReductionScales(NamedTuple):
    """How much one unit of a row's cross-entropy (``ce``) and of its weighted NTL (``ntl``)
    adds to the reduced loss: 0-dim tensors in the compute dtype. ``"sum"`` and ``"none"``: 1;
    ``"mean"``: ``1 / num_items_in_batch`` when given, else ``1 / (number of non-ignored
    labels)`` and ``1 / Σ loss_weights over number positions`` (``1 / tiny`` when that is 0: every
    row's term is 0 then)."""

    ce: torch.Tensor
    ntl: torch.Tensor


def reduction_scales(
    rows: Rows, spec: LossSpec, num_items: torch.Tensor | int | None
) -> ReductionScales:
    """The :class:`ReductionScales` of all M rows (not of a chunk: the "mean" counts them all)."""
    one = torch.ones((), dtype=rows.ntl_weights.dtype, device=rows.ntl_weights.device)
    if spec.reduction != "mean":
        return ReductionScales(ce=one, ntl=one)
    if num_items is not None:
        scale = divided_by_count(one, num_items)
        return ReductionScales(ce=scale, ntl=scale)
    tiny = torch.finfo(one.dtype).tiny
    return ReductionScales(
        ce=one / rows.is_target.sum().to(one.dtype).clamp_min(tiny),
        ntl=one / rows.ntl_weights.sum().clamp_min(tiny),
    )


class NumberTerms(NamedTuple):
    """The NTL side of each row, computed from its number logits ``z`` alone, before the full
    log-sum-exp is known; all (m,) or (m, N), in the compute dtype."""

    base: torch.Tensor  # ℓ(z): the NTL before reweighing and loss weights
    coefficient: torch.Tensor  # c = w · scales.ntl · loss weight, 0 where the label is no number
    grad_base: torch.Tensor  # (m, N) c · ∂ℓ/∂z
    number_lse: torch.Tensor | None  # logsumexp(z), reweigh only
    number_probs: torch.Tensor | None  # (m, N) softmax(z) = ∂ logsumexp(z)/∂z, reweigh only

    def take(self, index: slice | torch.Tensor) -> NumberTerms:
        number_lse, number_probs = self.number_lse, self.number_probs
        return NumberTerms(
            self.base[index],
            self.coefficient[index],
            self.grad_base[index],
            None if number_lse is None else number_lse[index],
            None if number_probs is None else number_probs[index],
        )


def number_terms(
    number_logits: torch.Tensor,
    rows: Rows,
    tables: NumberTables,
    spec: LossSpec,
    ntl_weight: float,
    scales: ReductionScales,
) -> NumberTerms:
    """:class:`NumberTerms` of the rows ``rows`` (m) from their finite number logits (m, N).

    ``∂ℓ/∂z`` (any kind, also a callable one) is a vector-Jacobian product through
    :func:`~numtok.maths.ntl.position_losses` on (m, N) tensors: with ``torch.autograd.grad``
    where autograd records (also in an ``autograd.Function``'s forward and under saved-tensor
    hooks), with ``torch.func.vjp`` below autograd (inside a ``torch.library`` custom op)."""
    coefficient = ntl_weight * scales.ntl * rows.ntl_weights  # (m,), 0 off number positions

    def base_of(z: torch.Tensor) -> torch.Tensor:
        return position_losses(z, rows.position, tables, spec, rows.place)

    with torch.enable_grad():
        leaf = number_logits.detach().requires_grad_()
        base = base_of(leaf)  # (m,)
    if base.requires_grad:
        (grad_base,) = torch.autograd.grad(base, leaf, coefficient)
        base = base.detach()
    else:
        base, pullback = torch.func.vjp(base_of, number_logits)[:2]
        (grad_base,) = pullback(coefficient)
    number_lse = number_probs = None
    if spec.reweigh:
        number_lse = torch.logsumexp(number_logits, dim=-1)  # (m,)
        number_probs = torch.exp(number_logits - number_lse[:, None])  # (m, N)
    return NumberTerms(base, coefficient, grad_base, number_lse, number_probs)


def row_gradients(
    lse: torch.Tensor | None,
    terms: NumberTerms,
    rows: Rows,
    spec: LossSpec,
    scales: ReductionScales,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(∂L/∂lse (m,), ∂L/∂x[y] (m,), ∂L/∂z (m, N))`` of the rows, given their full log-sum-exp
    ``lse`` (m,), which only reweighing needs; see :func:`loss_and_row_gradients` for the
    formulas."""
    grad_target = -scales.ce * rows.is_target  # (m,)
    if terms.number_lse is None:
        return -grad_target, grad_target, terms.grad_base
    assert terms.number_probs is not None and lse is not None
    log_mass = _log_number_mass(lse, terms.number_lse, rows)  # (m,)
    mass, slope = reweighed_derivatives(terms.base, log_mass, spec)
    slope = terms.coefficient * slope  # c · ∂ reweighed/∂ log m
    grad_numbers = mass[:, None] * terms.grad_base + slope[:, None] * terms.number_probs
    return -grad_target - slope, grad_target, grad_numbers


class RowGradients(NamedTuple):
    """What :func:`loss_and_row_gradients` returns for m rows, in the compute dtype.

    Attributes:
        ce: (m,) each row's cross-entropy, 0 where the label is ignored.
        ntl: (m,) each row's NTL (reweighed when asked, times its loss weight), 0 where the
            label is not a number token. :func:`reduce_terms` turns all M rows of both into the
            reported terms.
        grad_lse: (m,) ∂L/∂lse, the coefficient of the row's softmax in its logits' gradient.
        grad_target: (m,) ∂L/∂x[y], added at the label's column.
        grad_numbers: (m, N) ∂L/∂z, added at the number-token columns.
    """

    ce: torch.Tensor
    ntl: torch.Tensor
    grad_lse: torch.Tensor
    grad_target: torch.Tensor
    grad_numbers: torch.Tensor


def loss_and_row_gradients(
    lse: torch.Tensor,
    target_logit: torch.Tensor,
    number_logits: torch.Tensor,
    rows: Rows,
    tables: NumberTables,
    spec: LossSpec,
    ntl_weight: float,
    scales: ReductionScales,
) -> RowGradients:
    """The loss terms of m rows and the gradient pieces of their logits for a unit upstream
    gradient, from the row statistics alone: the building block of computing the logits'
    gradient in the forward pass, one chunk of rows at a time.

    Inputs, for the m rows of a chunk, in the compute dtype: ``lse`` (m,) the full-vocabulary
    log-sum-exp, ``target_logit`` (m,) the label's logit ``x[y]`` (anything where ignored),
    ``number_logits`` (m, N) the finite number-token logits ``z`` (as
    :func:`~numtok.ops.kernels.torch_rows.compute_row_statistics` gives them); ``rows`` =
    ``all_rows.take(chunk)`` from :func:`prepare_rows`; ``scales`` = :func:`reduction_scales` of
    *all* rows (the "mean" denominators count every row, not the chunk's).

    With ``s_ce``, ``s_ntl`` the scales, ``a`` the row's loss weight (0 unless the label is a
    number token), ``t`` = 1 unless the label is ignored, ``ℓ(z)`` the NTL before reweighing
    (:func:`~numtok.maths.ntl.position_losses`), the row adds to the loss

        L_r = s_ce·t·(lse - x[y]) + w·s_ntl·a·R(ℓ(z), log m),   log m = logsumexp(z) - lse,

    with ``R(ℓ, log m) = ℓ·m + 1.01·D·(1 - m)`` when ``reweigh`` (m clamped to ≤ 1), else ``ℓ``.
    The reduced loss is ``Σ_r L_r`` (``"mean"``, ``"sum"``); for ``"none"`` the scales are 1 and
    ``L_r`` is position r's loss itself. With ``c = w·s_ntl·a``:

        ∂L_r/∂x[y] = -s_ce·t
        ∂L_r/∂lse  =  s_ce·t - c·∂R/∂log m
        ∂L_r/∂z    =  c·(∂R/∂ℓ · ∂ℓ/∂z + ∂R/∂log m · softmax(z))

    (``∂R/∂ℓ = m``, ``∂R/∂log m = (ℓ - 1.01·D)·m``; without reweighing 1 and 0), and the gradient
    of the row's logits x (V,) is

        ∂L_r/∂x = ∂L_r/∂lse · softmax(x) + ∂L_r/∂x[y] · onehot(y) + scatter(∂L_r/∂z -> number ids)

    which :func:`~numtok.ops.kernels.torch_rows.write_row_gradient` writes. Scaling by the upstream
    gradient (a scalar, or per row for ``"none"``) is left to the caller's backward. ``∂ℓ/∂z``
    is computed with ``torch.func.vjp`` on (m, N) tensors (any kind, also a callable one; works
    with autograd off and inside an ``autograd.Function``'s forward). The values and gradients
    equal autograd through :func:`combine_terms` (tested against the float64 reference).
    """
    terms = number_terms(number_logits, rows, tables, spec, ntl_weight, scales)
    ce, ntl = row_losses(lse, target_logit, terms.base, terms.number_lse, rows, spec)
    return RowGradients(ce, ntl, *row_gradients(lse, terms, rows, spec, scales))
