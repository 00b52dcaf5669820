"""The token-level Number Token Loss at the number-labelled positions of a source of number logits
(:mod:`numtok.ops.sources`): the one computation behind :func:`numtok.number_token_loss` (the
logits) and :func:`numtok.linear_number_token_loss` (the number head).

With ``P`` the flat positions whose label is a number token, ``z_P`` their number logits (P, N)
and ``w`` the loss weights (1 without):

    ℓ_r = position_losses(z_r)                         (:mod:`numtok.maths.ntl`)
    ℓ_r ← ℓ_r · m_r + 1.01 · D · (1 - m_r)              reweigh, log m_r = logsumexp(z_r) - lse_r
    "none": w_r ℓ_r at r ∈ P, 0 elsewhere;  "sum": Σ_P w ℓ;  "mean": Σ_P w ℓ / Σ_P w

(or ``/ num_items_in_batch``). Only the rows in ``P`` are read, so only they get a gradient.

Finding ``P`` (``nonzero``) reads its size back from the device. A capturable loss
(``spec.capturable``: CUDA graphs, ``torch.compile(fullgraph=True)``) has no shape that depends
on the data: it reads every position's number logits (M, N), computes ``ℓ_r`` for all of them
and keeps it where ``r ∈ P`` (``torch.where``, so the other rows get an exact zero gradient);
the same values, at ``M / P`` times the (small) cost of the number columns, and for ``reweigh``
the log-sum-exp of every row instead of P.
"""

from __future__ import annotations

import torch

from numtok._common.reduction import reduce_losses
from numtok.maths.ntl import LossSpec, number_positions, place_weights, position_losses, reweighed
from numtok.numbers.vocab import NumberTables
from numtok.ops.sources import NumberRows

__all__ = ["token_level_loss"]


def token_level_loss(
    source: NumberRows,
    labels: torch.Tensor,
    loss_weights: torch.Tensor | None,
    tables: NumberTables,
    spec: LossSpec,
    num_items: torch.Tensor | int | None,
) -> torch.Tensor:
    """NTL (see the module docstring) of validated ``labels`` (...) and ``loss_weights`` (...) or
    None, both already shifted when ``spec.shift``; ``source`` reads the flat positions of the
    labels. Finding the number positions reads their count back from the device, unless
    ``spec.capturable`` (every position, masked: see the module docstring)."""
    dtype = source.dtype
    flat_labels = labels.reshape(-1)  # (M,)
    is_number, position = number_positions(flat_labels, tables, spec)
    # R rows are scored: the P number positions, or all M for a capturable loss (rows None).
    rows = None if spec.capturable else is_number.nonzero().squeeze(1)  # (P,)

    def at_rows(values: torch.Tensor) -> torch.Tensor:
        flat = values.reshape(-1)
        return flat if rows is None else flat.index_select(0, rows)  # (R,)

    position = at_rows(position)  # (R,) into the N number tokens (0 off number positions)
    number_logits = source.number_logits(rows)  # (R, N)
    place = place_weights(labels, tables, spec, dtype)  # DEL, DIST2: (...); None otherwise
    loss = position_losses(
        number_logits, position, tables, spec, None if place is None else at_rows(place)
    )  # (R,)
    if spec.reweigh:
        label_logit = number_logits.gather(1, position[:, None]).squeeze(1)  # (R,)
        log_mass = torch.logsumexp(number_logits, dim=-1) - source.lse(rows, label_logit)
        if rows is None:  # text rows: log m = 0, so that nothing non-finite reaches a gradient
            log_mass = torch.where(is_number, log_mass, 0.0)
        loss = reweighed(loss, log_mass, spec)
    weights = None if loss_weights is None else at_rows(loss_weights).to(dtype)  # (R,)
    if weights is not None:
        loss = loss * weights
    if rows is None:  # capturable: number positions keep their loss, the others 0 (no gradient)
        loss = torch.where(is_number, loss, 0.0)  # (M,)
        weights = None if weights is None else torch.where(is_number, weights, 0.0)
        per_position = loss
    else:
        per_position = loss.new_zeros(flat_labels.numel()).index_copy(0, rows, loss)  # (M,)
    total_weight = is_number.sum() if weights is None else weights.sum()
    return reduce_losses(per_position, labels.shape, spec.reduction, num_items, total_weight)
