"""What NTL costs per training step, measured the way the benchmarks do: arms interleaved round
by round on the same batches, in one process, medians of per-round ratios to CE."""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from numtok_compare.runner.loop import Step

__all__ = ["interleaved_step_times"]


def _quantile(values: list[float], q: float) -> float:
    return float(np.quantile(np.asarray(values), q))


def interleaved_step_times(
    steps: Mapping[str, Step],
    *,
    learning_rate: Any,
    batch_size: int,
    device: str,
    threads: int,
    rounds: int = 30,
    warmup_rounds: int = 3,
) -> dict[str, Any]:
    """Time one full training step (forward, loss, backward, optimiser) of every arm.

    ``steps[arm](round, learning_rate)`` runs one step of that arm on round ``round``'s batch (the
    same batch for every arm); ``learning_rate(round)`` gives the rate. Each round times every
    arm once, in an order that rotates from round to round, so that slow phases of a shared
    machine hit all arms alike. The result holds, per arm, the median step time, its ratio to
    CE's median (``ratio_to_ce``), and the 20th and 80th percentile of the per-round ratios (how
    much single rounds scatter).
    """
    names = list(steps)
    seconds: dict[str, list[float]] = {arm: [] for arm in names}
    for round_index in range(warmup_rounds + rounds):
        shift = round_index % len(names)
        for arm in names[shift:] + names[:shift]:
            started = time.perf_counter()
            steps[arm](round_index, learning_rate(round_index))
            if round_index >= warmup_rounds:
                seconds[arm].append(time.perf_counter() - started)
    result: dict[str, Any] = {
        "rounds": rounds,
        "batch_size": batch_size,
        "device": device,
        "threads": threads,
        "arms": {},
    }
    for arm in names:
        ratios = [a / b for a, b in zip(seconds[arm], seconds["ce"], strict=True)]
        result["arms"][arm] = {
            "median_seconds": statistics.median(seconds[arm]),
            "ratio_to_ce": statistics.median(seconds[arm]) / statistics.median(seconds["ce"]),
            "ratio_p20": _quantile(ratios, 0.2),
            "ratio_p80": _quantile(ratios, 0.8),
        }
    return result
