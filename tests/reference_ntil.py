"""A plain float64 reference for NTIL (numtok.losses.ntil), written from the formulas of its
docstring with Python loops over rows, numbers, tokens and digits, independent of the library's
vectorised code. Only the softmax over one position's candidates is a tensor operation (for the
gradient)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from reference import shifted


def _digit(token: str, i: int) -> int:
    """The i-th digit of a digit string, counted from its last digit."""
    return int(token[len(token) - 1 - i])


def _cost(label: str, candidate: str, place_base: float) -> float:
    """``Σ_{i < L} b^i · c_i``: the label's digits against the candidate's, 9 per digit for a
    candidate of another length."""
    total = 0.0
    for i in range(len(label)):
        apart = abs(_digit(label, i) - _digit(candidate, i)) if len(candidate) == len(label) else 9
        total += place_base**i * apart
    return total


def _runs(row: Sequence[int], digits_of: dict[int, str], word_starts: set[int]) -> list[list[int]]:
    """The numbers of one row of labels: runs of number tokens, a word start beginning one."""
    runs: list[list[int]] = []
    previous_number = False
    for t, token in enumerate(row):
        if token in digits_of:
            if not previous_number or token in word_starts:
                runs.append([])
            runs[-1].append(t)
            previous_number = True
        else:
            previous_number = False
    return runs


def ntil(
    logits: torch.Tensor,
    labels: torch.Tensor,
    ids: Sequence[int],
    digits: Sequence[str],
    *,
    word_start_ids: set[int] = frozenset(),  # type: ignore[assignment]
    digit_weight: float = 1.0,
    value_weight: float = 0.2,
    magnitude_weight: float = 0.2,
    place_base: float = 1.2,
    temperature: float = 0.1,
    gumbel_noise: float = 0.0,
    noise: torch.Tensor | None = None,
    loss_weights: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    num_items_in_batch: int | None = None,
    shift: bool = False,
) -> torch.Tensor:
    """NTIL of float64 ``logits`` (..., T, V) against ``labels`` (..., T); the N number tokens
    ``ids`` with their digit strings ``digits``; ``noise`` (K, N) the standard Gumbel draws of the
    K number labels in flat order (None: no noise)."""
    if shift:
        labels, loss_weights = shifted(labels, loss_weights, ignore_index)
    digits_of = {i: d for i, d in zip(ids, digits, strict=True)}
    columns = {i: j for j, i in enumerate(ids)}
    size = labels.shape[-1]
    flat_logits = logits.reshape(-1, size, logits.shape[-1])
    rows = labels.reshape(-1, size).tolist()
    weights = None if loss_weights is None else loss_weights.reshape(-1, size)
    per_position = [logits.new_zeros(()) for _ in range(labels.numel())]
    digit_sum, run_sum = logits.new_zeros(()), logits.new_zeros(())
    digit_count, run_count = 0.0, 0.0
    drawn = 0
    for r, row in enumerate(rows):
        row = [t if t != ignore_index else -1 for t in row]
        for run in _runs(row, digits_of, word_start_ids):
            predicted, target = logits.new_zeros(()), 0.0
            for t in run:
                token = digits_of[row[t]]
                place = sum(len(digits_of[row[u]]) for u in run if u > t)
                z = flat_logits[r, t, list(ids)]  # (N,)
                probs = torch.softmax(z, dim=-1)
                costs = torch.tensor([_cost(token, d, place_base) for d in digits], dtype=z.dtype)
                term = place_base**place * (probs * costs).sum()
                weight = 1.0 if weights is None else float(weights[r, t])
                per_position[r * size + t] = per_position[r * size + t] + (
                    digit_weight * weight * term
                )
                digit_sum = digit_sum + digit_weight * weight * term
                digit_count += weight * len(token)
                # The predicted token: hard pick of the noisy logits, soft gradient.
                noisy = z if noise is None else z + gumbel_noise * noise[drawn]
                drawn += 1
                pick = int(torch.argmax(noisy))
                soft_weights = torch.softmax(noisy / temperature, dim=-1)
                soft = sum(soft_weights[j] * int(digits[j]) for j in range(len(ids)))
                value = int(digits[pick]) + (soft - soft.detach())
                predicted = predicted + value * 10.0**place
                target += int(token) * 10**place
            run_weight = 1.0 if weights is None else float(weights[r, run[0]])
            y = float(target)
            larger = torch.maximum(predicted, predicted.new_tensor(y))
            relative = (predicted - y).abs() / (larger + 1)
            magnitude = (torch.log1p(predicted) - math.log1p(y)).abs()
            terms = run_weight * (value_weight * relative + magnitude_weight * magnitude)
            per_position[r * size + run[0]] = per_position[r * size + run[0]] + terms
            run_sum = run_sum + terms
            run_count += run_weight
    assert columns  # (the vocabulary is not empty)
    if reduction == "none":
        return torch.stack(per_position).reshape(labels.shape)
    if reduction == "sum":
        return digit_sum + run_sum
    if num_items_in_batch is not None:
        return (digit_sum + run_sum) / num_items_in_batch
    mean = digit_sum / digit_count if digit_count > 0 else digit_sum
    return mean + (run_sum / run_count if run_count > 0 else run_sum)
