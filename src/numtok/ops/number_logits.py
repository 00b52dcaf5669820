"""Reading the number-token columns out of a logits tensor: the one gather every loss and decoding
helper shares, and the dtype it computes in."""

from __future__ import annotations

import torch


def compute_dtype(logits: torch.Tensor) -> torch.dtype:
    """float64 for float64 logits, float32 for every other floating dtype."""
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


def number_logits_at(
    logits: torch.Tensor, rows: torch.Tensor | None, ids: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """The number-token columns of ``logits`` (..., V) at the flat positions ``rows`` (K,) of its
    leading dimensions (all positions for None), as (K, N) in ``dtype``. Only this slice is
    upcast. ``-inf`` (masked) logits become the most negative finite value, so no softmax over
    them produces NaN.

    The logits are indexed in their own shape, not through a reshaped view: the gradient then
    arrives as a plain tensor, which autograd adds in place to the cross-entropy's gradient
    instead of allocating another (..., V) buffer for the sum."""
    if rows is None:
        selected = logits.index_select(-1, ids).reshape(-1, ids.numel())
    else:
        leading = [index[:, None] for index in torch.unravel_index(rows, logits.shape[:-1])]
        position_and_column = (*leading, ids[None, :])
        selected = logits[position_and_column]  # (K, N)
    return selected.to(dtype).clamp_min(torch.finfo(dtype).min)


def expected_token_values(number_logits: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``Σ_j softmax(z)_j v_j`` per row: number logits (K, N), raw values (N,) -> (K,)."""
    return torch.softmax(number_logits, dim=-1) @ values.to(number_logits.dtype)
