"""The formulas of NTIL, the Numerical Token Integrity Loss (Fei et al., ACL 2025, arXiv 2505.13077;
authors' code ``xfey/NTIL``, ``ntil.py``), one function per term; :mod:`numtok.losses.ntil` puts
them together into :func:`numtok.ntil_loss`, whose docstring states the whole loss and where it
follows the paper and where the authors' code.

Three pieces, each on the labels of one row (R rows of T labels, already shifted):

* :func:`run_places`: a *number* is a run of number-token labels; any other token,
  ``ignore_index`` and a decimal point end it, and a word-start number token (``Ġ12``) begins a
  new one. Each token's place ``k`` is the count of digits after its last digit in its run
  (``1234`` as ``1|2|3|4``: 3, 2, 1, 0; as ``123|4``: 1, 0).
* :func:`digit_costs`: the (N, N) transport costs of the per-digit earth mover's distance,
  ``C[t, j] = Σ_{i < L_t} b^i · c_i(t, j)`` with ``c_i = |digit_i(v_t) - digit_i(v_j)|`` (digit
  ``i`` counted from the token's last digit) where ``L_j = L_t``, else 9, the largest digit
  distance; ``b`` the place base. On single digits ``C[t, j] = |t - j|``.
* :func:`relative_error` and :func:`magnitude_error`: the sequence-level comparisons of two
  non-negative whole numbers.
"""

from __future__ import annotations

import torch

from numtok._common.shift import shift_right

__all__ = ["digit_costs", "magnitude_error", "relative_error", "run_places"]

# The largest distance between two digits: what a digit costs against a token of another length.
MAX_DIGIT_DISTANCE = 9.0


def run_places(
    is_number: torch.Tensor, lengths: torch.Tensor, starts_word: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The runs of number tokens in labels (R, T).

    Args:
        is_number: (R, T) bool, the label is a number token.
        lengths: (R, T) long, its digit count (0 elsewhere).
        starts_word: (R, T) bool, the label is a word-start number token.

    Returns:
        ``place`` (R, T) long, the digits after each number token's last digit within its run (0
        elsewhere); ``run`` (R, T) long, the index of each number token's run in flat order (-1
        elsewhere); ``run_start`` (R, T) bool, the first token of each run.
    """
    run_start = is_number & (~shift_right(is_number, False) | starts_word)
    flat_start = run_start.reshape(-1)
    run_index = torch.cumsum(flat_start.long(), dim=0) - 1  # (R·T,)
    run = torch.where(is_number.reshape(-1), run_index, -1)
    # Digits from each position to its row's end, inclusive; minus those from the run's end on.
    digits = torch.where(is_number, lengths, 0)
    through_end = digits.flip(-1).cumsum(-1).flip(-1)  # (R, T)
    continues = is_number & shift_right(is_number, False) & ~starts_word
    run_end = is_number & ~torch.cat([continues[..., 1:], torch.zeros_like(continues[..., :1])], -1)
    columns = torch.arange(is_number.shape[-1], device=is_number.device).expand_as(is_number)
    # The column of each position's run end: the first run end at or after it.
    end_column = torch.where(run_end, columns, is_number.shape[-1]).flip(-1).cummin(-1).values
    end_column = end_column.flip(-1).clamp_max(is_number.shape[-1] - 1)
    after_end = through_end.gather(-1, end_column) - digits.gather(-1, end_column)
    place = torch.where(is_number, through_end - digits - after_end, 0)
    return place, run.reshape(is_number.shape), run_start


def digit_costs(values: torch.Tensor, lengths: torch.Tensor, place_base: float) -> torch.Tensor:
    """The (N, N) float64 costs ``C[t, j]`` of the module docstring, from the number tokens' raw
    integer values (N,) int64 and digit counts (N,) long: row ``t`` is the label, column ``j``
    the candidate. ``C[t, t] = 0``; tokens of equal digits (``7`` and ``Ġ7``) cost 0."""
    width = int(lengths.max()) if lengths.numel() else 1
    same_length = lengths[:, None] == lengths[None, :]  # (N, N)
    cost = torch.zeros(same_length.shape, dtype=torch.float64, device=values.device)
    for i in range(width):  # one (N, N) term per digit place: no (N, N, width) tensor
        digit = (values // 10**i) % 10  # (N,) the i-th digit from the right (0 past the token)
        apart = (digit[:, None] - digit[None, :]).abs().to(torch.float64)
        term = torch.where(same_length, apart, torch.full_like(apart, MAX_DIGIT_DISTANCE))
        in_label = (lengths > i)[:, None]  # i < L_t
        cost += torch.where(in_label, float(place_base) ** i * term, torch.zeros_like(term))
    return cost


def relative_error(predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``|x - y| / (max(x, y) + 1)`` for non-negative numbers: in [0, 1), 0 where they are
    equal (with gradient 0 there, as the authors' code has it)."""
    return (predicted - target).abs() / (torch.maximum(predicted, target) + 1.0)


def magnitude_error(predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``log((max(x, y) + 1) / (min(x, y) + 1)) = |log(1 + x) - log(1 + y)|`` for non-negative
    numbers (the authors' order-of-magnitude term: a smooth log ratio, not a digit count)."""
    return (torch.log1p(predicted) - torch.log1p(target)).abs()
