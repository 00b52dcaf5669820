"""What training an arm leaves beside its weights: the logged losses and every step's wall time,
whichever engine trained it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Progress", "TrainingLog", "median_step_seconds"]

#: ``progress(steps_or_items_done_since_last_call)``.
Progress = Callable[[int], None]

# Step times of the first steps include one-off allocations; the median skips them.
_TIMING_WARMUP_STEPS = 5


@dataclass(frozen=True)
class TrainingLog:
    """``history``: one ``{"step", "loss", "ce", "ntl"}`` entry per ``log_every`` steps (averages
    over the interval; ``ce``/``ntl`` None where the arm's loss does not log them);
    ``step_seconds``: the wall time of every step this process ran; ``resumed_at``: the step of
    the checkpoint training resumed from (a rerun after an interruption, or a retry after a lost
    worker), None when it began at step 0."""

    history: list[dict[str, Any]]
    step_seconds: list[float]
    resumed_at: int | None = None


def median_step_seconds(log: TrainingLog) -> float:
    """The median step time, skipping the first steps' one-off allocations (0 for a log of no
    steps: an arm that does not train)."""
    timed = log.step_seconds[_TIMING_WARMUP_STEPS:] or log.step_seconds
    return float(np.median(timed)) if timed else 0.0
