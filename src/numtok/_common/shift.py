"""The causal shift: a causal language model's logits at position t predict the token at t + 1,
so with ``shift=True`` every loss compares ``logits[..., t, :]`` with ``labels[..., t + 1]``.

The labels are shifted, never the logits (no copy of the (..., V) tensor): position t takes what
t + 1 held, and the last position gets ``ignore_index`` (its loss weight 0).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def shift_left(tensor: torch.Tensor, fill: float | int) -> torch.Tensor:
    """``tensor[..., 1:]`` padded with ``fill`` at the end: position t holds what t+1 held."""
    if tensor.dim() < 1:
        raise ValueError("shift=True needs labels with a sequence dimension, got a scalar")
    return F.pad(tensor[..., 1:], (0, 1), value=fill)


def shift_right(tensor: torch.Tensor, fill: float | int) -> torch.Tensor:
    """``tensor[..., :-1]`` padded with ``fill`` at the start: position t holds what t-1 held."""
    return F.pad(tensor[..., :-1], (1, 0), value=fill)


def shift_labels(
    labels: torch.Tensor, loss_weights: torch.Tensor | None, ignore_index: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Labels (...) and their loss weights (...) or None, both shifted left: the labels padded
    with ``ignore_index``, the weights with 0."""
    weights = None if loss_weights is None else shift_left(loss_weights, 0)
    return shift_left(labels, ignore_index), weights
