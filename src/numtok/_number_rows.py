"""The token-level Number Token Loss at the number-labelled positions of a source of number logits
(:mod:`numtok._number_sources`): the one computation behind :func:`numtok.number_token_loss` (the
logits) and :func:`numtok.linear_number_token_loss` (the number head).

With ``P`` the flat positions whose label is a number token, ``z_P`` their number logits (P, N)
and ``w`` the loss weights (1 without):

    ℓ_r = position_losses(z_r)                         (:mod:`numtok._ntl_maths`)
    ℓ_r ← ℓ_r · m_r + 1.01 · D · (1 - m_r)              reweigh, log m_r = logsumexp(z_r) - lse_r
    "none": w_r ℓ_r at r ∈ P, 0 elsewhere;  "sum": Σ_P w ℓ;  "mean": Σ_P w ℓ / Σ_P w

(or ``/ num_items_in_batch``). Only the rows in ``P`` are read, so only they get a gradient.
"""

from __future__ import annotations

import torch

from numtok._ntl_maths import LossSpec, number_positions, place_weights, position_losses, reweighed
from numtok._number_sources import NumberRows
from numtok._reduction import reduce_losses
from numtok.vocab import NumberTables

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
    labels. Finding the number positions reads their count back from the device."""
    dtype = source.dtype
    flat_labels = labels.reshape(-1)  # (M,)
    is_number, position = number_positions(flat_labels, tables, spec)
    rows = is_number.nonzero().squeeze(1)  # (P,)
    position = position.index_select(0, rows)  # (P,) into the N number tokens
    number_logits = source.number_logits(rows)  # (P, N)
    place = place_weights(labels, tables, spec, dtype)  # DEL, DIST2: (...); None otherwise
    loss = position_losses(
        number_logits,
        position,
        tables,
        spec,
        None if place is None else place.reshape(-1).index_select(0, rows),
    )  # (P,)
    if spec.reweigh:
        label_logit = number_logits.gather(1, position[:, None]).squeeze(1)  # (P,)
        log_mass = torch.logsumexp(number_logits, dim=-1) - source.lse(rows, label_logit)
        loss = reweighed(loss, log_mass, spec)
    if loss_weights is None:
        total_weight = is_number.sum()
    else:
        weights = loss_weights.reshape(-1).index_select(0, rows).to(dtype)  # (P,)
        loss, total_weight = loss * weights, weights.sum()
    per_position = loss.new_zeros(flat_labels.numel()).index_copy(0, rows, loss)  # (M,)
    return reduce_losses(per_position, labels.shape, spec.reduction, num_items, total_weight)
