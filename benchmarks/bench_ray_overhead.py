"""What ``numtok compare --executor ray`` costs over the local executor on a one-job run.

The run is the ``smoke`` preset (a one-layer Llama from scratch on a + b) with one seed and one
arm (CE), so one job: at 40 steps (a second of training, where Ray's start-up shows) and at 4000
(about 20 seconds). Each run is a fresh ``numtok`` process into a fresh folder (Python's imports
and, for Ray, starting a local Ray instance and its worker are counted, as a user's command pays
them), the executors interleaved round by round; the questions are generated once before the
first round. A row per run, and per size the medians and the median overhead in seconds and as a
ratio.

    .venv/bin/python benchmarks/bench_ray_overhead.py [--rounds 3] [--out runs/ray-overhead]

Run it alone on the machine: the seconds are wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

SIZES = (40, 4000)
EXECUTORS = ("local", "ray")


def _command(steps: int, executor: str, cache: Path, out: Path) -> list[str]:
    # The local executor in this process (--workers 1); Ray chooses its own concurrency.
    workers = ["--workers", "1"] if executor == "local" else []
    return [sys.executable, "-m", "numtok.cli", "compare", "--preset", "smoke", "--seeds", "1",
            "--arms", "ce", "--steps", str(steps), *workers, "--threads", "1", "--no-progress",
            "--cache-dir", str(cache), "--executor", executor, "--out", str(out)]  # fmt: skip


def _timed(command: list[str]) -> float:
    began = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, text=True)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("runs/ray-overhead"))
    parser.add_argument("--results", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    cache = args.out / "cache"
    _timed(_command(SIZES[0], "local", cache, args.out / "warm-up"))  # generates the questions
    rows = []
    for round_ in range(args.rounds):
        for steps in SIZES:
            for executor in EXECUTORS if round_ % 2 == 0 else EXECUTORS[::-1]:
                folder = args.out / f"{executor}-{steps}-{round_}"
                seconds = _timed(_command(steps, executor, cache, folder))
                rows.append({"round": round_, "steps": steps, "executor": executor,
                             "wall_seconds": seconds})  # fmt: skip
                print(json.dumps(rows[-1]), flush=True)
    summary = []
    for steps in SIZES:
        medians = {
            executor: statistics.median(r["wall_seconds"] for r in rows
                                        if r["steps"] == steps and r["executor"] == executor)
            for executor in EXECUTORS
        }  # fmt: skip
        summary.append({
            "steps": steps, "median_seconds": medians,
            "overhead_seconds": medians["ray"] - medians["local"],
            "ray_over_local": medians["ray"] / medians["local"],
        })  # fmt: skip
    import ray

    record = {
        "benchmark": "bench_ray_overhead",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                    "python": platform.python_version(), "ray": ray.__version__},
        "rounds": args.rounds,
        "runs": rows,
        "summary": summary,
    }  # fmt: skip
    args.results.mkdir(parents=True, exist_ok=True)
    path = args.results / f"{time.strftime('%Y-%m-%dT%H%M')}-ray-overhead-cpu.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    print(f"rows: {path}")


if __name__ == "__main__":
    main()
