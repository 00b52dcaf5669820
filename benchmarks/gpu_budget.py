"""What each step of ``benchmarks/gpu.sh`` would take on the GPU machine, estimated from its CPU
dry run: the dry run fails when a step's estimate exceeds its time limit, so that the one GPU
run is not spent on a step that cannot finish.

The dry run cannot time the GPU, but it counts what a step's GPU time is made of:

    estimate = start + CUDA_START_S + new variants × COMPILE_S + units × UNIT_S[step]

* ``start``: the Python start and the imports the steps share (torch, triton, transformers,
  numtok), timed by the dry run's set-up (the GPU machine's CPU is not slower than the shared 2
  cores here); the ``tests`` step uses its own collection time instead.
* new variants: the Triton kernel variants the step launches that no earlier step launched
  (``gpu_variants.py`` records them in the dry run; Triton's JIT keeps each binary in its disk
  cache, so a later step reuses an earlier one's). The ``tests`` step's come from
  :data:`DEVICE_TESTS` (the full device suite, measured here), shared out over its workers.
* units: what the step repeats, counted from its rows (calls, routes, cases, tests), times an
  assumed cost each on the GPU.

The constants below are assumptions where no GPU has measured them yet; the GPU run's report
shows each step's estimate beside its measured time, to correct them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_common import read_rows
from gpu_variants import read as read_variants

#: A CUDA context, cuBLAS's handle and the caching allocator's first blocks (assumed).
CUDA_START_S = 5.0
#: One Triton variant on the GPU machine: the compilation (ptxas for sm_90 took 0.40 s on average
#: and 1.1 s at most for each of the 60 variants of the launch step, serially on the shared 2
#: cores here, Triton 3.9), loading the binary, and the launchers Triton builds with the host's C
#: compiler (assumed: 2.5 times that average).
COMPILE_S = 1.0
#: Each step's unit, and its assumed cost on the GPU (besides compilations).
UNIT_S: dict[str, tuple[str, float]] = {
    "setup": ("steps", 0.0),  # its dry-run time is the estimate: pip and imports, CPU work
    "launch": ("calls", 0.1),  # a call and its torch reference, synchronised after each launch
    "large": ("runs", 4.0),  # 2.5e9 bfloat16 logits: a run, its gradient and its share of the
    # float64 reference (about 70 GB of traffic a run at 4.8 TB/s, and allocations)
    "sanitizer": ("calls", 4.0),  # a call with every kernel instrumented by memcheck
    "sync": ("routes", 1.5),  # two training steps of the small Llama and a strict rerun
    "tests": ("tests", 0.05),  # a device test besides its compilations, per worker
    "loss": ("cases", 3.0),  # a timed case: inputs, rounds, Liger's and PyTorch's kernels
    "kinds": ("cases", 2.0),
    "trainer": ("rows", 10.0),
    "readout": ("rows", 8.0),
    "head": ("rows", 1.5),
    "trl": ("rows", 10.0),
}
#: Installing the wheels of benchmarks/wheels (``make gpu-wheels``: five, pip --no-deps
#: --target): 6.1 s here, added where the dry run found them installed already.
PIP_INSTALL_S = 6.0
#: compute-sanitizer's start: it instruments the CUDA libraries torch loads (assumed).
SANITIZER_START_S = 20.0
#: The ``tests`` step's workers (``GPU_SH_WORKERS``), and how many of them compile the same
#: variant at once (each compiles what its tests need; the disk cache shares what is done).
WORKERS = 8
DUPLICATION = 2.0
#: The full device suite (``pytest -m device``), measured on CPU with gpu_variants.py recording
#: (benchmarks/README.md, 2026-12-03): its tests, and the distinct variants they launch, all
#: counted as new (some are the earlier steps', but their sets are the dry run's, at other shapes).
DEVICE_TESTS = {"tests": 1451, "variants": 326}
#: The dry run's benchmarks run smaller case lists than the GPU's: the GPU run's cases per case
#: of the dry run (bench_loss.py --gpu-cases: 14 against 8 with --quick).
FULL_OVER_QUICK = {"loss": 14 / 8}
#: The variants a benchmark compiles on a GPU only (on CPU it runs no Triton kernel), counted from
#: its code: bench_loss.py's Triton rows (four kernels for each of its four (V, dtype) pairs, in
#: place and 50 % ignored sharing them; the logits-free chunks in two dtypes) and Liger-Kernel's
#: cross-entropy; bench_kinds.py's DEL, SMMD and DIST2 rows.
GPU_ONLY_VARIANTS = {"loss": 28, "kinds": 10}
#: Work a step does on the GPU alone, once (assumed).
GPU_ONLY_S = {"head": ("Cut Cross-Entropy's Triton kernels compiled", 20.0)}
#: What tells bench_loss.py's cases apart in its rows.
_CASE = ("suite", "tokens", "vocab_size", "hidden_size", "dtype", "reweigh", "ignored_fraction",
         "upstream")  # fmt: skip


@dataclass(frozen=True)
class Estimate:
    """A step's estimated time on the GPU and what it is made of."""

    step: str
    limit: int
    dry_run_s: int | None
    seconds: float
    parts: tuple[tuple[str, float], ...]

    @property
    def fits(self) -> bool:
        return self.seconds <= self.limit


def _units(step: str, work: Path) -> float:
    """How many of the step's units its dry run ran (its rows), scaled to the GPU run."""
    rows = read_rows(work / f"{step}.jsonl")
    if step == "launch":
        count = sum(1 for r in rows if r.get("record") == "call")
    elif step == "large":
        count = sum(1 for r in rows if "variant" in r)
    elif step == "tests":
        count = DEVICE_TESTS["tests"]
    elif step == "setup":
        count = 1
    elif step == "loss":  # a row per case, variant and mode: the cases
        count = len({tuple(r.get(k) for k in _CASE) for r in rows})
    else:
        count = len(rows)
    return count * FULL_OVER_QUICK.get(step, 1.0)


def estimates(work: Path) -> list[Estimate]:
    """The estimate of every step that ran in the dry run's work folder ``work``."""
    steps = read_rows(work / "steps.jsonl")
    setup = next(iter(read_rows(work / "setup.jsonl")), {})
    start = float(setup.get("import_seconds", 10.0))
    seen: set[tuple[str, str]] = set()
    result = []
    for step in steps:
        name = step["step"]
        variants = read_variants(work / f"{name}.variants")
        new = len(variants - seen)
        seen |= variants
        parts: list[tuple[str, float]] = []
        if name == "setup":
            parts.append(("its dry run (pip, imports)", float(step.get("seconds") or 0)))
            if not setup.get("wheels", {}).get("installed"):
                parts.append(("the wheels' installation", PIP_INSTALL_S))
        elif name == "tests":
            collection = _collection_seconds(work)
            compiled = DEVICE_TESTS["variants"] * COMPILE_S * DUPLICATION / WORKERS
            parts += [
                ("collection", collection),
                (
                    f"{DEVICE_TESTS['variants']} variants × {COMPILE_S} s × {DUPLICATION} / "
                    f"{WORKERS} workers",
                    compiled,
                ),
            ]
        else:
            parts.append(("start", start))
            if new:
                parts.append((f"{new} new variants × {COMPILE_S} s", new * COMPILE_S))
            if name in GPU_ONLY_VARIANTS:
                more = GPU_ONLY_VARIANTS[name]
                parts.append((f"{more} variants on the GPU only × {COMPILE_S} s", more * COMPILE_S))
            if name in GPU_ONLY_S:
                parts.append(GPU_ONLY_S[name])
        if name == "sanitizer":
            parts.append(("compute-sanitizer's start", SANITIZER_START_S))
        parts.append(("CUDA", CUDA_START_S))
        unit, cost = UNIT_S.get(name, ("rows", 5.0))
        units = _units(name, work)
        if cost and units:
            per = f" / {WORKERS} workers" if name == "tests" else ""
            share = units * cost / (WORKERS if name == "tests" else 1)
            parts.append((f"{units:g} {unit} × {cost} s{per}", share))
        result.append(
            Estimate(
                step=name,
                limit=int(step["limit"]),
                dry_run_s=step.get("seconds"),
                seconds=round(sum(p for _, p in parts), 1),
                parts=tuple((what, round(p, 1)) for what, p in parts),
            )
        )
    return result


def _collection_seconds(work: Path) -> float:
    """The tests step's collection time in its dry run (the plugin's first row), else 15 s."""
    rows: list[dict[str, Any]] = read_rows(work / "tests.jsonl")
    first = next((r for r in rows if r.get("record") == "collected"), None)
    return float(first["seconds"]) if first else 15.0


def table(found: list[Estimate]) -> list[str]:
    """The estimates as a Markdown table, with a line on what they mean."""
    lines = [
        "| step | dry run s | estimate on the GPU, s | limit s | fits | made of |",
        "|---|---|---|---|---|---|",
    ]
    for e in found:
        made_of = " + ".join(f"{what} {seconds:g}" for what, seconds in e.parts)
        dry = "–" if e.dry_run_s is None else e.dry_run_s
        lines.append(
            f"| {e.step} | {dry} | {e.seconds:g} | {e.limit} | "
            f"{'yes' if e.fits else '**no**'} | {made_of} |"
        )
    return lines
