"""Cross-entropy plus the Number Token Loss in one pass over the logits.

``cross_entropy_with_ntl(logits, labels, vocab, ntl_weight=w, ...)`` computes exactly

    F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=..., reduction=...)
    + w * number_token_loss(logits, labels, vocab, ...)

(labels shifted first when ``shift=True``) at less than the cost of ``F.cross_entropy`` alone.
Both terms read a logits row only through its log-sum-exp, the label's logit and the N number-token
logits (see :mod:`numtok.kernels.torch_rows`), and the logits' gradient is ``softmax · (per-row
coefficient)`` plus sparse fix-ups at the label and the number columns. At a number-labelled
position the number-token mass that ``reweigh`` needs comes free from the same log-sum-exp:
``log m = logsumexp(z) - lse``.

Two backends compute it (``impl=``, :mod:`numtok.kernels.dispatch`): the torch row passes
(:mod:`numtok.kernels.torch_rows`, the default on CPU) and Triton kernels
(:mod:`numtok.kernels.triton_loss`, ``impl="triton"``: not yet run on a GPU, so opt-in). Off the
CPU, ``impl="auto"`` computes ``F.cross_entropy`` with NTL read from the logits' number columns
beside it (:mod:`numtok._number_rows`), PyTorch's own kernels. On the torch path, when the
logits need a gradient, the forward pass computes it too
(:mod:`numtok.kernels.gradient_in_forward`): the per-row coefficients come from
:func:`loss_and_row_gradients`'s formulas, the NTL part from the number logits before the pass,
and one pass over the logits turns each chunk into its rows of the gradient as soon as its
log-sum-exp is known; backward scales it (float16, ``reduction="none"`` and float16 autocast:
backward writes it, the upstream gradient known). Without a gradient one pass computes the
statistics and :func:`combine_terms` the values; under ``torch.compile`` (and for differentiable
``loss_weights``) autograd runs through :func:`combine_terms` and the statistics' custom op, whose
backward writes the gradient.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from numtok._ntl_maths import (
    Kind,
    LossSpec,
    number_positions,
    place_weights,
    position_losses,
    refuse_number_level,
    reweighed,
    reweighed_derivatives,
)
from numtok._number_logits import compute_dtype
from numtok._number_rows import token_level_loss
from numtok._number_sources import LogitsRows
from numtok._reduction import divided_by_count, reduce_losses
from numtok._shift import shift_labels
from numtok._validation import (
    check_bool,
    check_logits_and_labels,
    check_loss_weights,
    check_ntl_weight,
    check_num_items,
)
from numtok.kernels.dispatch import (
    check_impl,
    resolve_impl,
    triton_unsupported,
    unfused_by_default,
)
from numtok.kernels.gradient_in_forward import (
    WriteGradient,
    gradient_in_backward,
    loss_with_gradient_in_backward,
    loss_with_gradient_in_forward,
)
from numtok.kernels.torch_rows import (
    compute_row_statistics,
    gather_rows,
    row_statistics,
    scale_rows_in_place,
    statistics_and_gradient,
    write_row_gradient,
)
from numtok.vocab import NumberTables, NumberVocab

__all__ = [
    "CEWithNTLOutput",
    "ReductionScales",
    "RowGradients",
    "combine_terms",
    "cross_entropy_with_ntl",
    "cross_entropy_with_ntl_from_tables",
    "loss_and_row_gradients",
    "prepare_rows",
    "reduce_terms",
    "reduction_scales",
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


class _Rows(NamedTuple):
    """What the loss needs to know about each (flattened, shifted) label position, all (M,)."""

    target_ids: torch.Tensor  # the label id, 0 where ignored (any valid column to gather)
    is_target: torch.Tensor  # the label is not ignore_index: counted by cross-entropy
    is_number: torch.Tensor  # the label is a number token: counted by NTL
    position: torch.Tensor  # the label's index among the N number tokens, 0 where not a number
    ntl_weights: torch.Tensor  # loss_weights at number positions, 0 elsewhere (compute dtype)
    place: torch.Tensor  # the place weights of DEL and DIST2 (compute dtype), 1 for other kinds

    def take(self, index: slice | torch.Tensor) -> _Rows:
        """The same facts for the positions ``index`` (a chunk of rows)."""
        return _Rows(*(fact[index] for fact in self))


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
    place = place_weights(labels, tables, spec, dtype)
    rows = _Rows(
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


def _row_losses(
    lse: torch.Tensor,
    target_logit: torch.Tensor,
    base: torch.Tensor,
    number_lse: torch.Tensor | None,
    rows: _Rows,
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


def _log_number_mass(lse: torch.Tensor, number_lse: torch.Tensor, rows: _Rows) -> torch.Tensor:
    """``log m = logsumexp(z) - lse`` at number positions, 0 elsewhere (m), as reweighing needs."""
    return number_lse - torch.where(rows.is_number, lse, number_lse)


def reduce_terms(
    ce: torch.Tensor,
    ntl: torch.Tensor,
    rows: _Rows,
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
    rows: _Rows,
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
    ce, ntl = _row_losses(lse, target_logit, base, number_lse, rows, spec)
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
    rows: _Rows, spec: LossSpec, num_items: torch.Tensor | int | None
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


class _NumberTerms(NamedTuple):
    """The NTL side of each row, computed from its number logits ``z`` alone, before the full
    log-sum-exp is known; all (m,) or (m, N), in the compute dtype."""

    base: torch.Tensor  # ℓ(z): the NTL before reweighing and loss weights
    coefficient: torch.Tensor  # c = w · scales.ntl · loss weight, 0 where the label is no number
    grad_base: torch.Tensor  # (m, N) c · ∂ℓ/∂z
    number_lse: torch.Tensor | None  # logsumexp(z), reweigh only
    number_probs: torch.Tensor | None  # (m, N) softmax(z) = ∂ logsumexp(z)/∂z, reweigh only

    def take(self, index: slice | torch.Tensor) -> _NumberTerms:
        number_lse, number_probs = self.number_lse, self.number_probs
        return _NumberTerms(
            self.base[index],
            self.coefficient[index],
            self.grad_base[index],
            None if number_lse is None else number_lse[index],
            None if number_probs is None else number_probs[index],
        )


def _number_terms(
    number_logits: torch.Tensor,
    rows: _Rows,
    tables: NumberTables,
    spec: LossSpec,
    ntl_weight: float,
    scales: ReductionScales,
) -> _NumberTerms:
    """:class:`_NumberTerms` of the rows ``rows`` (m) from their finite number logits (m, N).

    ``∂ℓ/∂z`` (any kind, also a callable one) is a vector-Jacobian product through
    :func:`~numtok._ntl_maths.position_losses` on (m, N) tensors: with ``torch.autograd.grad``
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
    return _NumberTerms(base, coefficient, grad_base, number_lse, number_probs)


def _row_gradients(
    lse: torch.Tensor | None,
    terms: _NumberTerms,
    rows: _Rows,
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
    rows: _Rows,
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
    :func:`~numtok.kernels.torch_rows.compute_row_statistics` gives them); ``rows`` =
    ``all_rows.take(chunk)`` from :func:`prepare_rows`; ``scales`` = :func:`reduction_scales` of
    *all* rows (the "mean" denominators count every row, not the chunk's).

    With ``s_ce``, ``s_ntl`` the scales, ``a`` the row's loss weight (0 unless the label is a
    number token), ``t`` = 1 unless the label is ignored, ``ℓ(z)`` the NTL before reweighing
    (:func:`~numtok._ntl_maths.position_losses`), the row adds to the loss

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

    which :func:`~numtok.kernels.torch_rows.write_row_gradient` writes. Scaling by the upstream
    gradient (a scalar, or per row for ``"none"``) is left to the caller's backward. ``∂ℓ/∂z``
    is computed with ``torch.func.vjp`` on (m, N) tensors (any kind, also a callable one; works
    with autograd off and inside an ``autograd.Function``'s forward). The values and gradients
    equal autograd through :func:`combine_terms` (tested against the float64 reference).
    """
    terms = _number_terms(number_logits, rows, tables, spec, ntl_weight, scales)
    ce, ntl = _row_losses(lse, target_logit, terms.base, terms.number_lse, rows, spec)
    return RowGradients(ce, ntl, *_row_gradients(lse, terms, rows, spec, scales))


def _check_inplace(logits: torch.Tensor, vocab_size: int, weights_need_grad: bool) -> None:
    """``inplace_backward=True`` writes the gradient into the logits' memory through the view
    ``logits.view(-1, V)``: its rows must be distinct, contiguous memory, and nothing of ours may
    need the logits' values in backward."""
    if weights_need_grad:
        raise ValueError(
            "inplace_backward=True needs loss_weights that do not require grad: their gradient "
            "is computed in backward from the logits, which the in-place gradient overwrites; "
            "pass loss_weights.detach() or inplace_backward=False"
        )
    try:
        flat = logits.view(-1, vocab_size)
    except RuntimeError:
        flat = None
    if flat is None or flat.stride(1) != 1 or (flat.shape[0] > 1 and flat.stride(0) < vocab_size):
        raise ValueError(
            "inplace_backward=True writes the gradient into the logits' own memory, which needs "
            "rows of contiguous, non-overlapping memory (logits.view(-1, V) with strides "
            f"(>= V, 1)); got logits of shape {tuple(logits.shape)} and strides "
            f"{tuple(logits.stride())}. A slice such as logits[:, :-1] is not: pass the full "
            "logits with shift=True, or inplace_backward=False"
        )


def _loss_and_gradient_into(
    rows: _Rows,
    tables: NumberTables,
    spec: LossSpec,
    ntl_weight: float,
    num_items: torch.Tensor | int | None,
    shape: torch.Size,
    flat: torch.Tensor,
    gradient: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The torch backend's pass for :func:`~numtok.kernels.gradient_in_forward.
    loss_with_gradient_in_forward`: ``(loss, ce, ntl)`` of the logits ``flat`` (M, V), with their
    gradient for a unit upstream gradient written into ``gradient`` (M, V), which may be ``flat``.
    The NTL side of every row comes from its number logits, gathered before the pass; the pass
    turns each chunk into its rows of the gradient as soon as its log-sum-exp is known."""
    dtype = compute_dtype(flat)
    softcap = spec.logit_softcap
    target_logit, number_logits = gather_rows(flat, rows.target_ids, tables.ids, dtype, softcap)
    scales = reduction_scales(rows, spec, num_items)
    terms = _number_terms(number_logits, rows, tables, spec, ntl_weight, scales)

    # Without reweigh the pieces do not depend on the log-sum-exp: computed once, sliced.
    pieces = None if spec.reweigh else _row_gradients(None, terms, rows, spec, scales)

    def chunk_gradients(
        index: slice, lse: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if pieces is None:
            return _row_gradients(lse, terms.take(index), rows.take(index), spec, scales)
        return pieces[0][index], pieces[1][index], pieces[2][index]

    lse = statistics_and_gradient(
        flat, gradient, rows.target_ids, tables.ids, dtype, chunk_gradients, softcap
    )
    ce, ntl = _row_losses(lse, target_logit, terms.base, terms.number_lse, rows, spec)
    ce, ntl = reduce_terms(ce, ntl, rows, spec, num_items, shape)
    return ce + ntl_weight * ntl, ce, ntl


def _loss_then_gradient(
    rows: _Rows,
    tables: NumberTables,
    spec: LossSpec,
    ntl_weight: float,
    num_items: torch.Tensor | int | None,
    shape: torch.Size,
    flat: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, WriteGradient]:
    """The torch backend's pass for :func:`~numtok.kernels.gradient_in_forward.
    loss_with_gradient_in_backward` (where :func:`~numtok.kernels.gradient_in_forward.
    gradient_in_backward` chooses it: float16 logits, ``reduction="none"``, float16 autocast):
    ``(loss, ce, ntl)`` of the logits ``flat`` (M, V) in one read, and the function that writes
    their gradient in backward, where the upstream gradient ``u`` (one value, or one per row)
    multiplies the pieces ``∂L/∂lse``, ``∂L/∂x[y]`` and ``∂L/∂z`` before
    :func:`~numtok.kernels.torch_rows.write_row_gradient` rounds the gradient once. The pieces
    come again from the label's and the number logits (a gather of N + 1 columns), not kept
    from forward (an (M, N) buffer)."""
    dtype = compute_dtype(flat)
    softcap = spec.logit_softcap
    lse, target_logit, number_logits = compute_row_statistics(
        flat, rows.target_ids, tables.ids, dtype, softcap
    )
    scales = reduction_scales(rows, spec, num_items)
    terms = _number_terms(number_logits, rows, tables, spec, ntl_weight, scales)
    ce, ntl = _row_losses(lse, target_logit, terms.base, terms.number_lse, rows, spec)
    ce, ntl = reduce_terms(ce, ntl, rows, spec, num_items, shape)

    def write(logits: torch.Tensor, gradient: torch.Tensor, upstream: torch.Tensor) -> None:
        _, number_logits = gather_rows(logits, rows.target_ids, tables.ids, dtype, softcap)
        terms = _number_terms(number_logits, rows, tables, spec, ntl_weight, scales)
        grad_lse, grad_target, grad_numbers = _row_gradients(lse, terms, rows, spec, scales)
        per_row = upstream.reshape(-1).to(dtype)  # (1,) or (M,)
        write_row_gradient(
            gradient, logits, lse, rows.target_ids, tables.ids, grad_lse * per_row,
            grad_target * per_row, grad_numbers * per_row[:, None], softcap=softcap,
        )  # fmt: skip

    return ce + ntl_weight * ntl, ce, ntl, write


def cross_entropy_with_ntl_from_tables(
    logits: torch.Tensor,
    labels: torch.Tensor,
    tables: NumberTables,
    spec: LossSpec,
    ntl_weight: float,
    loss_weights: torch.Tensor | None,
    num_items_in_batch: torch.Tensor | int | None,
    inplace_backward: bool = False,
    impl: str = "auto",
) -> CEWithNTLOutput:
    """:func:`cross_entropy_with_ntl` with its settings already validated (``spec``,
    ``ntl_weight``, ``inplace_backward``, ``impl``) and the vocabulary's lookup tables already on
    the logits' device: what the module (:class:`~numtok.NumberTokenLoss`) and the Trainer
    adapter call. Checks the tensors and chooses the backend."""
    if unfused_by_default(impl, _device_of(logits)):
        return _cross_entropy_beside_the_number_head(
            logits, labels, tables, spec, ntl_weight, loss_weights, num_items_in_batch
        )
    weights_need_grad = isinstance(loss_weights, torch.Tensor) and loss_weights.requires_grad
    backend = resolve_impl(
        impl, _device_of(logits), triton_unsupported(spec, weights_need_grad=weights_need_grad)
    )
    # The Triton path checks label ids and weights on the GPU (no read-back to the host).
    check_values = backend == "torch" or logits.device.type != "cuda"
    capturable = spec.capturable
    logits, labels = check_logits_and_labels(
        logits,
        labels,
        vocab_size=spec.vocab_size,
        ignore_index=spec.ignore_index,
        check_values=check_values,
        on_device=capturable,
    )
    loss_weights = check_loss_weights(
        loss_weights, labels, check_values=check_values, on_device=capturable
    )
    num_items = check_num_items(num_items_in_batch, labels.device if capturable else None)
    needs_grad = torch.is_grad_enabled() and logits.requires_grad
    if inplace_backward and needs_grad:
        _check_inplace(logits, spec.vocab_size, weights_need_grad)
    if backend == "triton":
        from numtok.kernels import triton_loss

        loss, ce, ntl = triton_loss.cross_entropy_with_ntl(
            logits, labels, loss_weights, tables, spec, ntl_weight, num_items,
            needs_grad=needs_grad, inplace=inplace_backward,
        )  # fmt: skip
        return CEWithNTLOutput(loss=loss, ce=ce, ntl=ntl)
    dtype = compute_dtype(logits)
    rows, shape = prepare_rows(labels, loss_weights, tables, spec, dtype)
    # Under torch.compile, and for loss weights that take a gradient themselves, autograd goes
    # through the row statistics: two opaque custom ops, the statistics in forward and the
    # logits' gradient in backward (one more read of the logits, into a fresh buffer).
    recompute = torch.compiler.is_compiling() or weights_need_grad
    if needs_grad and not recompute and gradient_in_backward(logits, spec.reduction):
        then_write = functools.partial(
            _loss_then_gradient, rows, tables, spec, ntl_weight, num_items, shape
        )
        loss, ce, ntl = loss_with_gradient_in_backward(
            logits, spec.vocab_size, inplace_backward, then_write
        )
        return CEWithNTLOutput(loss=loss, ce=ce, ntl=ntl)
    if needs_grad and not recompute:
        compute = functools.partial(
            _loss_and_gradient_into, rows, tables, spec, ntl_weight, num_items, shape
        )
        loss, ce, ntl = loss_with_gradient_in_forward(
            logits, spec.vocab_size, inplace_backward, compute, scale_rows_in_place
        )
        return CEWithNTLOutput(loss=loss, ce=ce, ntl=ntl)
    statistics = row_statistics if needs_grad else compute_row_statistics
    lse, target_logit, number_logits = statistics(
        logits.reshape(-1, spec.vocab_size), rows.target_ids, tables.ids, dtype, spec.logit_softcap
    )
    return combine_terms(
        lse, target_logit, number_logits, rows, tables, spec, ntl_weight, num_items, shape
    )


def _cross_entropy_beside_the_number_head(
    logits: torch.Tensor,
    labels: torch.Tensor,
    tables: NumberTables,
    spec: LossSpec,
    ntl_weight: float,
    loss_weights: torch.Tensor | None,
    num_items_in_batch: torch.Tensor | int | None,
) -> CEWithNTLOutput:
    """``F.cross_entropy`` of the (soft-capped) logits plus ``ntl_weight`` times NTL read from
    their number columns at the number-labelled positions (:mod:`numtok._number_rows`): PyTorch's
    own kernels where numtok's fused passes have not been measured to be faster
    (:func:`~numtok.kernels.dispatch.unfused_by_default`). The same values as the fused passes;
    autograd's memory (the cross-entropy's (M, V) gradient buffers, and a capped copy of the
    logits with a soft cap)."""
    capturable = spec.capturable
    logits, labels = check_logits_and_labels(
        logits, labels, vocab_size=spec.vocab_size, ignore_index=spec.ignore_index,
        on_device=capturable,
    )  # fmt: skip
    loss_weights = check_loss_weights(loss_weights, labels, on_device=capturable)
    num_items = check_num_items(num_items_in_batch, labels.device if capturable else None)
    if spec.shift:
        labels, loss_weights = shift_labels(labels, loss_weights, spec.ignore_index)
    dtype = compute_dtype(logits)
    cap = spec.logit_softcap
    capped = logits if cap is None else cap * torch.tanh(logits / cap)
    flat_labels = labels.reshape(-1)  # (M,)
    # Per position, summed in the compute dtype: a bfloat16 sum would round the reported value.
    ce_rows = F.cross_entropy(
        capped.reshape(-1, spec.vocab_size), flat_labels, ignore_index=spec.ignore_index,
        reduction="none",
    ).to(dtype)  # fmt: skip
    is_target = flat_labels != spec.ignore_index
    ce = reduce_losses(ce_rows, labels.shape, spec.reduction, num_items, is_target.sum())
    source = LogitsRows(capped, tables.ids, dtype)
    ntl = token_level_loss(source, labels, loss_weights, tables, spec, num_items)
    return CEWithNTLOutput(loss=ce + ntl_weight * ntl, ce=ce.detach(), ntl=ntl.detach())


def _device_of(tensor: object) -> torch.device:
    """The tensor's device (the CPU for what is not a tensor: the checks then reject it)."""
    return tensor.device if isinstance(tensor, torch.Tensor) else torch.device("cpu")


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
    inplace_backward: bool = False,
    logit_softcap: float | None = None,
    impl: str = "auto",
    capturable: bool = False,
) -> CEWithNTLOutput:
    """Cross-entropy plus ``ntl_weight`` times the Number Token Loss, fused.

    Exactly ``F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=...,
    reduction=...) + ntl_weight * number_token_loss(logits, labels, vocab, ...)`` with every
    setting shared, except that a ``"mean"`` over a batch with no target at all is 0 (PyTorch
    gives NaN). Each term keeps its own ``"mean"`` denominator: the non-ignored positions for
    cross-entropy, ``Σ loss_weights`` over number positions for NTL; ``num_items_in_batch``
    replaces both. ``loss_weights`` weigh the NTL term only, as in ``number_token_loss``.

    Cost: when the logits need a gradient, forward reads them once, in cache-sized row chunks,
    and while a chunk is in cache turns it into its rows of the logits' gradient for a unit
    upstream gradient (the scheme of Liger-Kernel's cross-entropy): one read and one write of
    (M, V) in all, and the only (M, V) buffer is that gradient, in the logits' dtype. Backward
    only multiplies it by the upstream gradient (nothing to do for ``loss.backward()`` on CPU)
    and hands it out, so it can run once per call (``retain_graph=True`` and a second backward
    raise). Without a gradient (evaluation, ``torch.no_grad()``), forward reads the logits once
    and writes nothing of their size. bfloat16/float16 logits are upcast one chunk at a time into
    a reused float32 buffer, never as a whole, and the gradient is rounded to their dtype once
    (bfloat16: once more when a scalar loss's upstream gradient is not 1). Where forward knows
    that the upstream gradient will not be 1 (:func:`~numtok.kernels.gradient_in_forward.
    gradient_in_backward`: ``reduction="none"``, float16 autocast's loss scale) and for float16
    logits, whose range ends where a unit-upstream gradient's small entries lie (2^-24), the
    logits are read once more instead: the gradient is written in backward, with the upstream
    gradient known, rounded once, into a fresh buffer or with ``inplace_backward`` into the
    logits. Under ``torch.compile``, and when
    ``loss_weights`` require grad, the loss runs as two opaque custom ops instead, the statistics
    in forward and the gradient in backward (one more read of the logits). The row passes
    never synchronise with the host; the argument checks do, once each: the label range check
    (and, when given, the check that ``loss_weights >= 0``) reads one boolean back from the
    device, and NTL beside ``F.cross_entropy`` (the default off the CPU) reads the count of
    number positions back; with ``capturable=True`` none of them does.

    Backends (``impl``): ``"auto"`` (default) runs the torch row passes described above on CPU,
    and on every other device ``F.cross_entropy`` of the logits with NTL read from their number
    columns at the number-labelled positions beside it (PyTorch's kernels and autograd's
    memory: ``inplace_backward`` has no effect there); ``$NUMTOK_IMPL`` says what ``"auto"``
    means. ``"torch"`` takes the row passes on any device; ``"triton"`` the Triton kernels (one
    program per row: one read and one write of the logits in a training step, nothing at all in
    backward for ``loss.backward()``; the label and weight checks become device-side asserts),
    which have not run on a GPU yet; on CPU tensors they need ``TRITON_INTERPRET=1`` (Triton's
    interpreter, for tests). A callable ``kind`` and ``loss_weights`` that require grad are
    refused by ``"triton"``. Every path gives the same values and gradients (tested against
    the float64 reference).

    ``inplace_backward=True`` writes that gradient into the logits' own memory: no (M, V)
    buffer at all. The logits' values are gone after the call, so it is for logits that nothing
    reads afterwards: compute metrics, argmax or other losses that need their values *before*
    the call. What the function can detect, it refuses: logits whose rows are not distinct
    contiguous memory (a slice such as ``logits[:, :-1]``: use ``shift=True`` on the full logits;
    an ``expand``) and ``loss_weights`` that require grad (their gradient needs the logits in
    backward) raise a ``ValueError``; an autograd node that saved the logits (or a view
    of their memory) for its own backward raises PyTorch's "modified by an inplace operation"
    error in backward, because the call bumps the logits' version counter. Other terms
    differentiable in the logits that do not save them (``logits.sum()``, a soft cap
    ``c·tanh(x/c)`` before the call) still get exact gradients. A plain read of the logits after
    the call cannot be detected: it sees the gradient. Without a gradient to compute, and where
    ``torch.compile`` traces the call (see above), the logits are left untouched. A leaf tensor's
    ``.grad`` shares its memory afterwards.

    Args:
        logits: (..., V) float32, bfloat16, float16 or float64; V must equal ``vocab.vocab_size``.
        labels: (...) integer token ids in [0, V) or ``ignore_index``.
        vocab: the :class:`~numtok.NumberVocab` of the tokenizer.
        ntl_weight: the factor ``w >= 0`` of the NTL term (the paper uses 0.3).
        kind: as in :func:`~numtok.number_token_loss`, but for ``"number"``, which has no fused
            pass (a ``ValueError`` names what computes it).
        reweigh: as in :func:`~numtok.number_token_loss`.
        squash_factor: as in :func:`~numtok.number_token_loss`.
        loss_weights: as in :func:`~numtok.number_token_loss`.
        ignore_index: as in :func:`~numtok.number_token_loss`, for both terms.
        reduction: as in :func:`~numtok.number_token_loss`, for both terms.
        num_items_in_batch: as in :func:`~numtok.number_token_loss`, for both terms.
        shift: as in :func:`~numtok.number_token_loss`, for both terms.
        inplace_backward: write the logits' gradient into the logits' memory (see above).
        logit_softcap: ``c > 0`` to compute both terms of ``c·tanh(logits/c)`` instead of the
            logits (Gemma 2's ``final_logit_softcapping``), with the cap's slope in the
            gradient, without building the capped logits; None (default) for the logits as they
            are.
        impl: ``"auto"``, ``"torch"`` or ``"triton"``: the backend (see above).
        capturable: compute without reading anything back from the device, in shapes that do
            not depend on the labels' values: for CUDA graphs (``torch.cuda.graph``,
            ``torch.compile(mode="reduce-overhead")``) and ``torch.compile(fullgraph=True)``.
            The label and weight checks become device-side asserts (on a GPU an error surfaces
            at a later synchronisation, as a device-side assert), NTL beside ``F.cross_entropy``
            (the default off the CPU) reads every position's number-token logits and masks the
            others instead of gathering the number positions (whose count is read back), and
            a tensor ``num_items_in_batch`` must be on the labels' device (an int is fine). The
            same values. Off by default: it has not run on a GPU yet (``benchmarks/gpu.sh``
            counts each path's synchronisations). ``impl="triton"`` on CUDA reads nothing back
            either way.

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
    refuse_number_level(
        kind,
        "cross_entropy_with_ntl",
        "Add it to a cross-entropy instead: F.cross_entropy(...) + ntl_weight * "
        "number_token_loss(logits, labels, vocab, kind='number', shift=...)",
    )
    spec = LossSpec.build(
        vocab,
        kind=kind,
        reweigh=reweigh,
        squash_factor=squash_factor,
        ignore_index=ignore_index,
        reduction=reduction,
        shift=shift,
        logit_softcap=logit_softcap,
        capturable=capturable,
    )
    weight = check_ntl_weight(ntl_weight)
    inplace = check_bool("inplace_backward", inplace_backward)
    backend = check_impl(impl)
    device = logits.device if isinstance(logits, torch.Tensor) else None
    tables = vocab.tables(device)
    return cross_entropy_with_ntl_from_tables(
        logits, labels, tables, spec, weight, loss_weights, num_items_in_batch, inplace, backend
    )
