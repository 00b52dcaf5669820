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
        return divided_by_count(total, num_items)
    return total / weight_total.to(total.dtype).clamp_min(torch.finfo(total.dtype).tiny)


def divided_by_count(value: torch.Tensor, num_items: torch.Tensor | int) -> torch.Tensor:
    """``value / num_items`` in ``value``'s dtype, without copying ``num_items`` to its device:
    an int is an operand of the division, and a one-element tensor takes part as a 0-dim one,
    which a CUDA kernel reads on the host when it is a CPU tensor (a host-to-device copy would
    synchronise, and cannot be captured in a CUDA graph)."""
    if not isinstance(num_items, torch.Tensor):
        return value / num_items
    count = num_items.reshape(()).to(value.dtype)
    if count.device != value.device and count.device.type != "cpu":
        count = count.to(value.device)  # a GPU count for values elsewhere: read back
    return value / count
