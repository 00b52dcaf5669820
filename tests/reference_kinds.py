"""Plain float64 references for DEL, SMMD and DIST2 (numtok.maths.kinds), written from their
definitions (``shared/number-losses.md`` and the generalisation stated in numtok.maths.kinds) with
Python loops over positions and tokens, independent of the library's vectorised code."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from reference import reduced, shifted


def _place_weights_of_row(
    row: Sequence[int],
    digits_of: Mapping[int, str],
    point_ids: set[int],
    word_start_ids: set[int],
    kind: str,
) -> list[float]:
    """DEL's (``2k`` / ``1.02^-(m+1)``) or DIST2's (``k``) weight of each label in one row."""
    weights = [0.0] * len(row)

    def member(token: int) -> bool:
        return token in digits_of or (kind == "del" and token in point_ids)

    t = 0
    while t < len(row):
        if not member(row[t]):
            t += 1
            continue
        run = [t]
        t += 1
        while t < len(row) and member(row[t]) and row[t] not in word_start_ids:
            run.append(t)
            t += 1
        numbers = [i for i in run if row[i] in digits_of]
        split = None
        if kind == "del" and row[run[0]] not in point_ids:
            split = next((i for i in run if row[i] in point_ids), None)
        integers = [i for i in numbers if split is None or i < split]
        fractions = [i for i in numbers if split is not None and i > split]
        for i in integers:
            k = 1 + sum(len(digits_of[row[j]]) for j in integers if j > i)
            weights[i] = 2.0 * k if kind == "del" else float(k)
        for i in fractions:
            m = sum(len(digits_of[row[j]]) for j in fractions if j <= i)
            weights[i] = 1.02 ** -(m + 1)
    return weights


def place_weights(
    labels: torch.Tensor,
    digits_of: Mapping[int, str],
    point_ids: set[int],
    word_start_ids: set[int],
    kind: str,
) -> torch.Tensor:
    rows = labels.reshape(-1, labels.shape[-1]).tolist()
    weights = [_place_weights_of_row(r, digits_of, point_ids, word_start_ids, kind) for r in rows]
    return torch.tensor(weights, dtype=torch.float64).reshape(labels.shape)


def smmd_kernel(values: Sequence[float], settings: Any) -> torch.Tensor:
    distances = [[abs(a - b) for b in values] for a in values]
    nonzero = [d for row in distances for d in row if d > 0]
    if settings.squash_factor is not None and nonzero:
        low, high = min(nonzero), max(nonzero)
        slope = (settings.squash_factor - 1) / (high - low) if high > low else 0.0
        distances = [[0.0 if d == 0 else 1 + (d - low) * slope for d in row] for row in distances]
    kernel = []
    for row in distances:
        entries = []
        for d in row:
            if settings.kernel == "gaussian":
                each = [math.exp(-(d**2) / (2 * s**2)) for s in settings.sigmas]
            else:
                each = [math.exp(-d / s) for s in settings.sigmas]
            entries.append(min(1.0, max(0.0, sum(each) / len(each))))
        kernel.append(entries)
    return torch.tensor(kernel, dtype=torch.float64)


def position_loss(
    settings: Any,
    z: torch.Tensor,
    label: int,
    number_ids: Sequence[int],
    digits_of: Mapping[int, str],
    place: float,
) -> torch.Tensor:
    """The loss at one position from the number logits ``z`` (N,) and its label id."""
    n = len(number_ids)
    t = list(number_ids).index(label)
    log_p = F.log_softmax(z, dim=0)
    p = log_p.exp()
    name = type(settings).__name__
    if name == "DEL":
        total = z.new_zeros(())
        for c in range(n):
            sigma = torch.sigmoid(z[c])
            bce = -torch.log(sigma) if c == t else -torch.log(1 - sigma)
            total = total + p[c] * bce
        return (place if settings.place_weights else 1.0) * total / n
    if name == "SMMD":
        kernel = smmd_kernel([float(int(digits_of[i])) for i in number_ids], settings)
        r = p - F.one_hot(torch.tensor(t), n).to(p.dtype)
        mmd = r @ kernel @ r
        laplacian = torch.diag(kernel.sum(dim=1)) - kernel
        smooth = r @ laplacian @ r
        alpha = (
            1 / (2 * float(kernel.sum(dim=1).mean()))
            if settings.alpha == "auto"
            else settings.alpha
        )
        value = {"smmd": mmd + alpha * smooth, "mmd": mmd, "smooth": alpha * smooth}
        return torch.clamp(value[settings.mode], min=0.0)
    # DIST2: the soft target over the tokens of the label's length, on that length's scale.
    length = len(digits_of[label])
    target = int(digits_of[label]) / 10 ** (length - 1)
    group = [j for j, i in enumerate(number_ids) if len(digits_of[i]) == length]
    scaled = [int(digits_of[number_ids[j]]) / 10 ** (length - 1) for j in group]
    closeness = [-((s - target) ** 2) / settings.temperature for s in scaled]
    q = torch.softmax(torch.tensor(closeness, dtype=torch.float64), dim=0)
    total = z.new_zeros(())
    for q_j, j in zip(q, group, strict=True):
        total = total + q_j * (torch.log(q_j) - log_p[j])
    return (place if settings.place_weights else 1.0) * total / n


def kind_loss(
    settings: Any,
    logits: torch.Tensor,
    labels: torch.Tensor,
    digits_of: Mapping[int, str],
    *,
    point_ids: set[int],
    word_start_ids: set[int],
    loss_weights: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    num_items_in_batch: int | None = None,
    shift: bool = False,
) -> torch.Tensor:
    """The loss over logits (..., V) and labels (...), reduced like number_token_loss."""
    if shift:
        labels, loss_weights = shifted(labels, loss_weights, ignore_index)
    number_ids = sorted(digits_of)
    name = type(settings).__name__.lower()
    places = place_weights(labels, digits_of, point_ids, word_start_ids, name)
    flat_logits = logits.reshape(-1, logits.shape[-1]).double()
    flat_labels = labels.reshape(-1).tolist()
    flat_places = places.reshape(-1).tolist()
    weights = (
        [1.0] * len(flat_labels)
        if loss_weights is None
        else loss_weights.reshape(-1).double().tolist()
    )
    terms = []
    weight_sum = 0.0
    for i, label in enumerate(flat_labels):
        if label == ignore_index or label not in digits_of:
            terms.append(flat_logits.new_zeros(()))
            continue
        z = flat_logits[i, number_ids]
        loss = position_loss(settings, z, label, number_ids, digits_of, flat_places[i])
        terms.append(weights[i] * loss)
        weight_sum = weight_sum + weights[i]
    return reduced(terms, labels.shape, reduction, num_items_in_batch, weight_sum)
