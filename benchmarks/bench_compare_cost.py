"""Where ``numtok compare``'s time goes on a small task: training against scoring.

The task is 600 word problems written as JSON Lines (480 train, 60 validation, 60 test; "Ann has
A apples and gets B more", A and B from 0 to 299, so answers run up to 598: three-digit
readouts), fixed by a seed; the run is SmolLM2-135M-Instruct with LoRA, CE against CE + 0.3·NTL-WAS,
two seeds, 30 steps, every readout (greedy, expected, median, mode). The rows give the minutes of
training and of scoring (validation and test) the run itself recorded, and their ratio.

    .venv/bin/python benchmarks/bench_compare_cost.py [--out runs/compare-cost] [--threads 2]
        [--readout-tolerance T]

``--readout-tolerance`` is compare's (default: its own, 1e-3): the unexplored mass each item's
distribution readouts may leave, which their cost follows.

Run it alone on the machine: the minutes are wall time.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/compare-cost"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--results", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--readout-tolerance", type=float)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    data = args.out / "word-problems.jsonl"
    write_task(data)
    run = args.out / "run"
    began = time.perf_counter()
    command = ["compare", "--data", str(data), "--arms", "ce,was", "--seeds", "0,1",
               "--steps", "30", "--threads", str(args.threads), "--out", str(run),
               "--no-progress"]  # fmt: skip
    if args.readout_tolerance is not None:
        command += ["--readout-tolerance", f"{args.readout_tolerance:g}"]
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
        "readout_tolerance": results["config"]["readout_tolerance"],
        "train_minutes": training,
        "validation_scoring_minutes": validation,
        "test_scoring_minutes": test,
        "scoring_over_training": (validation + test) / training,
        "wall_minutes": wall,
        "seconds_per_step": [r["seconds_per_step"] for r in results["runs"]],
        "largest_unexplored": results.get("largest_unexplored"),
        "scored_items": {split: len(truth) for split, truth in results["references"].items()},
    }
    args.results.mkdir(parents=True, exist_ok=True)
    path = args.results / f"{time.strftime('%Y-%m-%dT%H%M')}-compare-cost-cpu-t{args.threads}.json"
    path.write_text(json.dumps(row, indent=1) + "\n")
    print(json.dumps(row, indent=1))
    print(f"rows: {path}")


if __name__ == "__main__":
    main()
