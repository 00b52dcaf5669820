"""The peak memory of one Hugging Face Trainer step under DeepSpeed ZeRO-3, 2 processes, a
Llama-3-sized vocabulary (V = 128,256): CE + 0.3·NTL from the logits (``logits``, the base of the
ratios), logits-free (``logits_free``, the output layer's weight gathered for numtok's pass),
``patch_model``'s default (``patched``: numtok's logits-free pass on CPU), and the model's own
cross-entropy without NTL (``unpatched``).

    python benchmarks/bench_zero3_memory.py              # V = 128,256, 4 x 512 tokens a process
    python benchmarks/bench_zero3_memory.py --quick      # V = 8,192, 4 x 128: a smoke run

Method: each mode runs in a torchrun of its own (2 processes, gloo, ``DS_ACCELERATOR=cpu``, one
thread each), the model and data of ``bench_trainer_step.py`` (a 2-layer Llama, hidden 256,
untied, float32; 4 sequences of 512 random ids a process, 10 % of them digits), the Trainer given
``deepspeed=`` a ZeRO-3 configuration with DeepSpeed's default thresholds (the 32.8M-parameter
embeddings and output layer are partitioned, the decoder's small matrices kept whole), torch's
AdamW (``zero_allow_untested_optimizer``), gradient clipping at the Trainer's 1.0, three
optimizer steps. The step's
peak: at the start of the second step each process resets VmHWM to its VmRSS (writing "5" to
``/proc/self/clear_refs``), and VmHWM's rise by the end of that step is everything the step
allocates above the partitioned model, gradients and optimizer state (``runner.StepClock``,
the benchmarks' one clock and memory probe); the larger of the two processes' is reported, with
the process's peak over the run. Each mode runs once, in processes of its own (torchrun), so
there are no rounds to interleave and ``runner.in_fresh_process`` (one process) does not
apply. Time: the median of steps 2 and 3 (two processes sharing the cores of a shared machine:
indicative only). The first logged loss checks that the three NTL modes compute one loss.
Results go to ``benchmarks/results/<date>T<time>-zero3-memory-cpu-t1.{jsonl,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from bench_common import numtok_source, provenance, quantiles
from bench_trainer_step import MODES, NTL_WEIGHT, NUMBER_FRACTION, PRESETS, build_trainer, peaks
from runner import StepClock

RESULTS = Path(__file__).resolve().parent / "results"
PROCESSES, STEPS = 2, 3
#: ZeRO-3 as a user writes it; DeepSpeed's defaults otherwise (its thresholds included).
ZERO3 = {
    "zero_optimization": {"stage": 3},
    "zero_allow_untested_optimizer": True,
    "gradient_clipping": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "train_batch_size": "auto",
}


def worker(mode: str, size: dict[str, Any]) -> None:
    """One process of a mode's torchrun: three steps, then a JSON line with its measurements."""
    torch.set_num_threads(1)
    clock = StepClock(torch.device("cpu"), measure_memory=True)
    trainer = build_trainer(
        mode, size, STEPS, clock, deepspeed=ZERO3, ddp_backend="gloo", logging_steps=1
    )
    trainer.train()
    measured = {
        "rank": int(os.environ["RANK"]),
        **peaks(clock),
        "seconds": clock.steps.wall[1:],
        "first_loss": None if clock.first_log is None else clock.first_log["loss"],
    }
    print("MEASURED " + json.dumps(measured), flush=True)


def run_mode(mode: str, preset: str) -> list[dict[str, Any]]:
    """The mode's torchrun; each process's measurements."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={PROCESSES}", __file__, "--worker", mode, "--preset", preset,
    ]  # fmt: skip
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    finished = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if finished.returncode != 0:
        sys.exit(f"{mode}: torchrun failed\n{finished.stdout[-3000:]}{finished.stderr[-5000:]}")
    lines = [line for line in finished.stdout.splitlines() if line.startswith("MEASURED ")]
    return sorted((json.loads(line.split(" ", 1)[1]) for line in lines), key=lambda m: m["rank"])


def summary(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| mode | step peak MiB (larger process) | peak × base | process peak MiB "
        "| step s median | first loss |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['mode']} | {row['step_peak_mib']:,.0f} | {row['step_peak_ratio']:.3f} "
            f"| {row['process_peak_mib']:,.0f} | {row['median_ms'] / 1e3:.1f} "
            f"| {row['first_loss']:.4f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small shapes: --preset quick")
    parser.add_argument("--preset", choices=["default", "quick"], default="default")
    parser.add_argument("--out", type=Path, help="JSONL file (default: results/...; none --quick)")
    parser.add_argument("--worker", choices=list(MODES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    preset = "quick" if args.quick else args.preset
    size = PRESETS[preset]
    if args.worker:
        worker(args.worker, size)
        return

    import deepspeed
    import transformers

    meta = {
        **provenance(torch.device("cpu"), compiled=False),
        "transformers": transformers.__version__,
        "deepspeed": deepspeed.__version__,
        "numtok_source": numtok_source(),
        "processes": PROCESSES,
        "threads_per_process": 1,
        "zero": ZERO3,
        "preset": preset,
    }
    measured = {mode: run_mode(mode, preset) for mode in MODES}
    base = "logits"
    base_peak = max(m["step_peak_bytes"] for m in measured[base])
    rows = []
    for mode, processes in measured.items():
        step_peak = max(m["step_peak_bytes"] for m in processes)
        seconds = [s for m in processes for s in m["seconds"]]
        rows.append(
            {
                **meta,
                **size,
                "ntl_weight": NTL_WEIGHT,
                "number_fraction": NUMBER_FRACTION,
                "mode": mode,
                "description": MODES[mode],
                "base": base,
                "step_peak_mib": round(step_peak / 2**20, 1),
                "step_peak_ratio": round(step_peak / base_peak, 3),
                "step_peak_mib_per_process": [
                    round(m["step_peak_bytes"] / 2**20, 1) for m in processes
                ],
                "process_peak_mib": round(max(m["process_peak_bytes"] for m in processes) / 2**20),
                "median_ms": round(quantiles(seconds)[1], 1),
                "first_loss": processes[0]["first_loss"],
            }
        )
    table = summary(rows)
    print(table)
    out = args.out
    if out is None and preset != "quick":
        out = RESULTS / f"{meta['date'][:16].replace(':', '')}-zero3-memory-cpu-t1.jsonl"
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(json.dumps(row) + "\n" for row in rows))
        out.with_suffix(".md").write_text(table + "\n")
        print(f"results: {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
