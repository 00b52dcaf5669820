"""Where ``numtok compare``'s time goes on a small task: training against scoring.

The task (``--task``) is 600 questions written as JSON Lines (480 train, 60 validation, 60
test), fixed by a seed: ``word-problems`` ("Ann has A apples and gets B more", A and B from 0 to
299, so answers run up to 598: three-digit readouts) or ``diamonds`` (ggplot2's diamonds priced
below $10,000, in dollars: four-digit readouts; the ``tabular`` extra). The run is
SmolLM2-135M-Instruct with LoRA, CE against CE + 0.3·NTL-WAS, two seeds, 30 steps, every readout
(greedy, expected, median, mode), compare's defaults otherwise. The rows give the minutes of
training and of scoring (validation and test) the run itself recorded, and their ratio.

    .venv/bin/python benchmarks/bench_compare_cost.py [--task word-problems]
        [--out runs/compare-cost] [--threads 2] [--readout-tolerance T]
        [--readout-samples N] [--max-value V]

``--readout-tolerance``, ``--readout-samples`` and ``--max-value`` are compare's (default: its
own): the unexplored mass each item's distribution readouts may leave, which their cost
follows; the numbers drawn per item instead; the largest number read.

Run it alone on the machine: the minutes are wall time.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

from numtok.cli import main as numtok

ROWS = {"train": 480, "validation": 60, "test": 60}


def write_task(path: Path, seed: int = 0) -> None:
    """The 600 word problems: distinct (A, B) pairs drawn from one seeded stream, so that no
    question is in two splits."""
    pairs = random.Random(seed).sample(range(300 * 300), sum(ROWS.values()))
    splits = [split for split, count in ROWS.items() for _ in range(count)]
    lines = []
    for pair, split in zip(pairs, splits, strict=True):
        a, b = divmod(pair, 300)
        prompt = f"Ann has {a} apples and gets {b} more. How many apples does Ann have now?"
        lines.append(json.dumps({"prompt": prompt, "answer": a + b, "split": split}))
    path.write_text("\n".join(lines) + "\n")


def write_diamonds(path: Path) -> None:
    """600 diamonds priced below $10,000 (four-digit answers): the first of each split of the
    diamonds task's fixed shuffle (numtok_compare.tasks.diamonds) that are."""
    from numtok_compare.tasks.diamonds import diamond_splits

    pool = diamond_splits("diamonds", {split: 2 * count for split, count in ROWS.items()})
    lines = []
    for split, count in ROWS.items():
        below = [d for d in pool[split] if d.answer < 10_000][:count]
        if len(below) < count:
            raise RuntimeError(f"only {len(below)} {split} diamonds below $10,000")
        lines += [json.dumps({"prompt": d.question, "answer": d.answer, "split": split})
                  for d in below]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")


TASKS = {"word-problems": write_task, "diamonds": write_diamonds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/compare-cost"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--results", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--readout-tolerance", type=float)
    parser.add_argument("--readout-samples", type=int)
    parser.add_argument("--max-value")
    parser.add_argument("--task", choices=tuple(TASKS), default="word-problems")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    data = args.out / f"{args.task}.jsonl"
    TASKS[args.task](data)
    run = args.out / "run"
    began = time.perf_counter()
    command = ["compare", "--data", str(data), "--arms", "ce,was", "--seeds", "0,1",
               "--steps", "30", "--threads", str(args.threads), "--out", str(run),
               "--no-progress"]  # fmt: skip
    if args.readout_tolerance is not None:
        command += ["--readout-tolerance", f"{args.readout_tolerance:g}"]
    if args.readout_samples is not None:
        command += ["--readout-samples", str(args.readout_samples)]
    if args.max_value is not None:
        command += ["--max-value", args.max_value]
    status = numtok(command)
    wall = (time.perf_counter() - began) / 60
    results = json.loads((run / "results.json").read_text())
    training = sum(r["train_minutes"] for r in results["runs"])
    validation = sum(r["validation_minutes"] for r in results["runs"])
    test = sum(results["test_minutes"].values())
    row = {
        "command": "numtok " + " ".join(command),
        "status": status,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "threads": args.threads,
        "task": args.task,
        "readout_tolerance": results["config"]["readout_tolerance"],
        "readout_samples": results["config"].get("readout_samples"),
        "test_draws": results["choice"].get("draws"),
        "max_value": results["config"]["max_value"],
        "train_minutes": training,
        "validation_scoring_minutes": validation,
        "test_scoring_minutes": test,
        "scoring_over_training": (validation + test) / training,
        "wall_minutes": wall,
        "seconds_per_step": [r["seconds_per_step"] for r in results["runs"]],
        "largest_unexplored": results.get("largest_unexplored"),
        "sampling_error": results.get("sampling_error"),
        "readout_errors": _primary_errors(results),
        "decisions": decisions(results),
        "scored_items": {split: len(truth) for split, truth in results["references"].items()},
    }
    args.results.mkdir(parents=True, exist_ok=True)
    name = f"{time.strftime('%Y-%m-%dT%H%M')}-compare-cost-{args.task}-cpu-t{args.threads}.json"
    path = args.results / name
    path.write_text(json.dumps(row, indent=1) + "\n")
    print(json.dumps(row, indent=1))
    print(f"rows: {path}")


def _primary_errors(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each test comparison of the expected readout by MAE: its interval and the readouts' own
    error beside it, the bound of their pruning or the draws' share of its variance and the
    draws it would need for a tenth (empty where the run kept neither)."""
    return [
        {key: entry.get(key) for key in ("split", "arm", "baseline_arm", "difference", "low",
                                          "high", "se", "df", "readout_bound", "could_flip",
                                          "draws_share", "draws_needed", "verdict")}
        for entry in results["comparisons"]
        if entry["readout"] == "expected" and entry["metric"] == "mae"
        and ("readout_bound" in entry or "draws_share" in entry)
    ]  # fmt: skip


def decisions(results: dict[str, Any]) -> dict[str, list[str]]:
    """Every gate decision and every test comparison of a run's ``results.json``, one line each
    with its estimate and interval (``"was expected: not learnt, +0.068 [-0.477, +0.612]"``,
    ``"was expected − ce expected mae: no verdict, -0.40 [-8.1, +7.3]"``): two runs of the same
    comparison that read their answers differently are compared by these lines."""

    def estimate(value: float, low: float, high: float) -> str:
        return f"{value:+.4g} [{low:+.4g}, {high:+.4g}]"

    gate = [
        f"{e['arm']} {e['readout']}: {'learnt' if e['learnt'] else 'not learnt'}, "
        + estimate(e["improvement"], e["low"], e["high"])
        for e in results["gate"]["arms"]
    ]
    verdicts = [
        f"{e['arm']} {e['readout']} − {e['baseline_arm']} {e['baseline']} {e['metric']}: "
        f"{e['verdict']}, " + estimate(e["difference"], e["low"], e["high"])
        for e in results["comparisons"]
        if e["split"] == "test"
    ]
    return {"gate": gate, "test_comparisons": verdicts}


if __name__ == "__main__":
    main()
