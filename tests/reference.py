"""Plain float64 references for the number-token losses, written from the definitions with Python
loops over positions, independent of the library's vectorised code."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F

Pointwise = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

POINTWISE: dict[str, Pointwise] = {
    "mse": lambda a, b: (a - b) ** 2,
    "mae": lambda a, b: (a - b).abs(),
    "huber": lambda a, b: F.huber_loss(a, b, reduction="none", delta=1.0),
}


def scaled_entries(number_tokens: Mapping[int, str | float]) -> dict[int, tuple[float, int]]:
    """id -> (value on its length's scale, length). Digit strings have their length's scale
    ``int(s) / 10**(len(s) - 1)``; plain numbers share the unit scale (length 1)."""
    entries = {}
    for token_id, value in number_tokens.items():
        if isinstance(value, str):
            entries[token_id] = (int(value) / 10 ** (len(value) - 1), len(value))
        else:
            entries[token_id] = (float(value), 1)
    return entries


def _distances(entries: dict[int, tuple[float, int]]) -> tuple[float, float]:
    """(largest, smallest non-zero) distance between two tokens of the same length."""
    same_length = [
        abs(a[0] - b[0]) for a, b in itertools.combinations(entries.values(), 2) if a[1] == b[1]
    ]
    nonzero = [d for d in same_length if d > 0]
    return max(same_length, default=0.0), min(nonzero, default=float("inf"))


def reference_number_token_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    number_tokens: Mapping[int, str | float],
    *,
    kind: str | Pointwise = "was",
    reweigh: bool = False,
    squash_factor: float | None = None,
    loss_weights: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    num_items_in_batch: int | None = None,
    shift: bool = False,
) -> torch.Tensor:
    logits = logits.double()
    entries = scaled_entries(number_tokens)
    ids = sorted(entries)
    farthest, nearest = _distances(entries)
    pointwise = POINTWISE.get(kind, kind) if isinstance(kind, str) else kind

    def squash(d: float) -> float:
        if squash_factor is None or d == 0:
            return d
        slope = (squash_factor - 1) / (farthest - nearest) if farthest > nearest else 0.0
        return 1 + (d - nearest) * slope

    if kind == "was":
        max_cost = squash(farthest)
    else:
        lo = torch.tensor(min(v for v, _ in entries.values()), dtype=torch.float64)
        hi = torch.tensor(max(v for v, _ in entries.values()), dtype=torch.float64)
        max_cost = max(float(pointwise(lo, hi).abs()), float(pointwise(hi, lo).abs()))

    if shift:
        labels, loss_weights = shifted(labels, loss_weights, ignore_index)
    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_labels = labels.reshape(-1).tolist()
    flat_weights = (
        [1.0] * len(flat_labels)
        if loss_weights is None
        else loss_weights.reshape(-1).double().tolist()
    )
    per_position = []
    weight_total = 0.0
    for row, label, weight in zip(flat_logits, flat_labels, flat_weights, strict=True):
        if label == ignore_index or label not in entries:
            per_position.append(row.sum() * 0.0)
            continue
        target, length = entries[label]
        probs = torch.softmax(row[ids], dim=0)
        if kind == "was":
            loss = sum(
                p * squash(abs(entries[j][0] - target) if entries[j][1] == length else farthest)
                for p, j in zip(probs, ids, strict=True)
            )
        else:
            in_group = [k for k, j in enumerate(ids) if entries[j][1] == length]
            share = probs[in_group].sum()
            expected = sum(probs[k] * entries[ids[k]][0] for k in in_group) / share
            loss = (
                share * pointwise(expected, torch.tensor(target, dtype=torch.float64))
                + (1 - share) * max_cost
            )
        if reweigh:
            mass = torch.softmax(row, dim=0)[ids].sum()
            loss = loss * mass + 1.01 * max_cost * (1 - mass)
        per_position.append(loss * weight)
        weight_total += weight
    return reduced(per_position, labels.shape, reduction, num_items_in_batch, weight_total)


def shifted(
    labels: torch.Tensor, loss_weights: torch.Tensor | None, ignore_index: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``shift=True``: position t takes the label (and weight) of t + 1; the last gets
    ``ignore_index`` (weight 0)."""
    labels = torch.cat([labels[..., 1:], torch.full_like(labels[..., :1], ignore_index)], -1)
    if loss_weights is not None:
        loss_weights = torch.cat(
            [loss_weights[..., 1:], torch.zeros_like(loss_weights[..., :1])], -1
        )
    return labels, loss_weights


def reduced(
    per_position: list[torch.Tensor],
    shape: torch.Size,
    reduction: str,
    num_items_in_batch: int | None,
    weight_total: float,
) -> torch.Tensor:
    """The weighted per-position losses reduced like number_token_loss: ``"none"`` (the labels'
    shape), ``"sum"``, or the sum over ``num_items_in_batch`` or the weights' total."""
    stacked = torch.stack(per_position)
    if reduction == "none":
        return stacked.reshape(shape)
    if reduction == "sum":
        return stacked.sum()
    denominator = num_items_in_batch if num_items_in_batch is not None else weight_total
    return stacked.sum() / denominator if denominator > 0 else stacked.sum()
