"""The one reduction rule every loss follows, as ``F.cross_entropy`` does."""

from __future__ import annotations

import torch


def reduce_losses(
    per_position: torch.Tensor,
    shape: torch.Size,
    reduction: str,
    num_items: torch.Tensor | int | None,
    weight_total: torch.Tensor,
) -> torch.Tensor:
    """``"none"``: the (M,) losses in ``shape``; ``"sum"``: their sum; ``"mean"``: the sum over
    ``num_items`` when given (exact gradient accumulation), else over ``weight_total`` (the
    positions' total weight). A batch with nothing to count has a sum of exactly 0 and returns 0,
    still connected to the graph, instead of 0/0."""
    if reduction == "none":
        return per_position.reshape(shape)
    total = per_position.sum()
    if reduction == "sum":
        return total
    if num_items is not None:
        return total / torch.as_tensor(num_items, dtype=total.dtype, device=total.device)
    return total / weight_total.to(total.dtype).clamp_min(torch.finfo(total.dtype).tiny)
