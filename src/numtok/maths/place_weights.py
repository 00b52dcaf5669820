"""Place weights of number-token labels, read from the label sequence: what DEL and DIST2
(:mod:`numtok.maths.kinds`) multiply each position's loss by.

Both read the (shifted) labels (R, T) row by row; ``ignore_index`` and every token that is not a
number token or a decimal point end a number (unlike the authors' code, which runs over the
flattened, ignore-stripped labels and can join numbers across a gap), and a word-start number
token (``Ġ12``) begins a new one. A token's place is that of its last digit.

* DEL (:func:`del_place_weights`): a number is a run of number tokens and decimal points; its
  first point splits it into an integer part and a fraction, unless the run starts with the
  point (then it is all integer). The integer token whose last digit is at place ``k`` (units 1,
  tens 2, …) weighs ``2k``; the fraction token whose last digit is the ``m``-th decimal weighs
  ``1.02^-(m+1)``. ``12345``: 10, 8, 6, 4, 2; ``3.14``: 2 | 0.961, 0.942; ``.5``: 2.
* DIST2 (:func:`run_place_weights`): a number is a run of number tokens (a point ends it); the
  token whose last digit is at place ``k`` weighs ``k``. ``123``: 3, 2, 1; ``3.14``: 1 | 2, 1.

Positions whose label is not a number token get 0.
"""

from __future__ import annotations

import torch

from numtok._common.shift import shift_left, shift_right

__all__ = ["del_place_weights", "run_place_weights"]

# DEL's decay of the decimals' weights, 1.02^-(m+1) for the m-th decimal.
_DECIMAL_DECAY = 1.02


def _start_index(run_start: torch.Tensor) -> torch.Tensor:
    """(R·T,) the flat index of the run start at or before each position (of the run a position
    of a run belongs to)."""
    flat = run_start.reshape(-1)
    index = torch.arange(flat.numel(), device=flat.device)
    return torch.cummax(torch.where(flat, index, 0), dim=0).values


def _through(values: torch.Tensor, run_start: torch.Tensor) -> torch.Tensor:
    """(R, T): the sum of ``values`` from the start of each position's run up to it, inclusive
    (meaningful within runs; every run begins at a ``run_start``)."""
    flat = values.reshape(-1)
    total = flat.cumsum(dim=0)
    start = _start_index(run_start)
    return (total - total[start] + flat[start]).reshape(values.shape)


def _after_in_run(
    values: torch.Tensor, in_run: torch.Tensor, run_start: torch.Tensor
) -> torch.Tensor:
    """(R, T): the sum of ``values`` at the later positions of each position's run."""
    continues = in_run & ~run_start
    run_end = in_run & ~shift_left(continues, False)
    flipped = _through(values.flip(-1), run_end.flip(-1)).flip(-1)
    return flipped - values


def _runs(members: torch.Tensor, starts_word: torch.Tensor) -> torch.Tensor:
    """(R, T) bool: the first position of each run of ``members``; a word start begins one."""
    return members & (~shift_right(members, False) | starts_word)


def run_place_weights(
    is_number: torch.Tensor, digits: torch.Tensor, starts_word: torch.Tensor
) -> torch.Tensor:
    """DIST2's weights (R, T) long: the place ``k`` of each number token's last digit within its
    run of number tokens, 0 elsewhere. ``is_number``, ``starts_word`` (R, T) bool; ``digits``
    (R, T) long, the digits of each number token (0 elsewhere)."""
    run_start = _runs(is_number, starts_word)
    later = _after_in_run(digits, is_number, run_start)
    return torch.where(is_number, later + 1, 0)


def del_place_weights(
    is_number: torch.Tensor,
    is_point: torch.Tensor,
    digits: torch.Tensor,
    starts_word: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    """DEL's weights (R, T) in ``dtype``: ``2k`` for integer tokens, ``1.02^-(m+1)`` for fraction
    tokens, 0 elsewhere. ``is_number``, ``is_point``, ``starts_word`` (R, T) bool; ``digits``
    (R, T) long, the digits of each number token (0 elsewhere)."""
    in_run = is_number | is_point
    run_start = _runs(in_run, starts_word)
    starts_with_point = is_point.reshape(-1)[_start_index(run_start)].reshape(is_point.shape)
    points = _through(is_point.long(), run_start)
    split = is_point & (points == 1) & ~starts_with_point
    in_fraction = is_number & (_through(split.long(), run_start) > 0)
    integer = is_number & ~in_fraction
    integer_digits = torch.where(integer, digits, 0)
    place = _after_in_run(integer_digits, in_run, run_start) + 1  # k of the token's last digit
    decimal = _through(torch.where(in_fraction, digits, 0), run_start)  # m of its last digit
    integer_weight = 2.0 * place.to(dtype)
    fraction_weight = torch.pow(_DECIMAL_DECAY, -(decimal.to(dtype) + 1.0))
    weight = torch.where(in_fraction, fraction_weight, integer_weight)
    return torch.where(is_number, weight, torch.zeros_like(weight))
