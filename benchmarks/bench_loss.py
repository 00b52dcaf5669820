"""CE + NTL benchmark: time (forward, backward, full) and peak memory of every variant on identical
inputs, as ratios against plain ``F.cross_entropy`` (logits suite) or the materialised output
layer (linear suite) measured in the same run.

    python benchmarks/bench_loss.py               # full suite, results in benchmarks/results/
    python benchmarks/bench_loss.py --quick       # small shapes, a smoke run of everything

Method (see benchmarks/README.md): a fixed thread count; the first round of every case checks each
variant's value and gradients against the unfused reference and warms up, the next ``--rounds``
rounds are timed with the variants interleaved (the order rotates each round); forward is the
training forward (autograd recording), backward is ``loss.backward()``, full is their sum in the
same call. Medians with p20/p80. Peak memory is measured for each variant in a fresh subprocess:
the rise of VmHWM over VmRSS during one forward + backward (VmHWM reset by writing "5" to
/proc/self/clear_refs right before), reported as a multiple of the logits' size.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import numtok
from numtok import NumberVocab, number_token_loss
from numtok._fused_rows import row_statistics
from numtok.fused import cross_entropy_with_ntl
from numtok.linear import linear_cross_entropy_with_ntl

RESULTS = Path(__file__).resolve().parent / "results"
NTL_WEIGHT = 0.3
FIRST_DIGIT_ID = 100  # "0".."9" are token ids 100..109
SEQUENCE_LENGTH = 512
NUMBER_FRACTION = 0.10
IGNORED_FRACTION = 0.05


@dataclass(frozen=True)
class Case:
    suite: str  # "logits" (given logits) or "linear" (given hidden states and the output layer)
    tokens: int  # N
    vocab_size: int  # V
    hidden_size: int  # H (linear suite), 0 otherwise
    dtype: str  # "float32" or "bfloat16"
    reweigh: bool

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)  # type: ignore[no-any-return]

    @property
    def logits_bytes(self) -> int:
        return self.tokens * self.vocab_size * self.torch_dtype.itemsize

    def label(self) -> str:
        shape = f"N={self.tokens} V={self.vocab_size}"
        shape += f" H={self.hidden_size}" if self.hidden_size else ""
        return f"{self.suite} {shape} {self.dtype} reweigh={'on' if self.reweigh else 'off'}"


def full_cases() -> list[Case]:
    logits = [
        Case("logits", n, v, 0, dtype, reweigh)
        for n, v in [(4096, 32_768), (2048, 131_072)]
        for dtype in ["float32", "bfloat16"]
        for reweigh in [False, True]
    ]
    linear = [
        Case("linear", 4096, 131_072, 1024, dtype, False) for dtype in ["float32", "bfloat16"]
    ]
    return logits + linear


def quick_cases() -> list[Case]:
    logits = [
        Case("logits", 1024, 8192, 0, dtype, reweigh)
        for dtype in ["float32", "bfloat16"]
        for reweigh in [False, True]
    ]
    return [*logits, Case("linear", 1024, 8192, 256, "float32", False)]


# ------------------------------------------------------------------ inputs


@functools.cache
def tokenizer(vocab_size: int) -> Any:
    """A WordLevel tokenizer whose ids 100..109 are the digits and every other id a word."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    words = {"<unk>": 0, **{f"w{i}": i for i in range(1, vocab_size)}}
    for digit in range(10):
        del words[f"w{FIRST_DIGIT_ID + digit}"]
        words[str(digit)] = FIRST_DIGIT_ID + digit
    backend = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")


@functools.cache
def number_vocab(vocab_size: int) -> NumberVocab:
    return NumberVocab.from_tokenizer(tokenizer(vocab_size), vocab_size=vocab_size)


def make_inputs(case: Case) -> dict[str, torch.Tensor]:
    """Leaves (``logits`` or ``hidden`` + ``weight``) requiring grad, and ``labels``: 10% digits,
    5% ignore_index, the rest other tokens. Deterministic for a case."""
    generator = torch.Generator().manual_seed(0)
    batch = max(1, case.tokens // SEQUENCE_LENGTH)
    shape = (batch, case.tokens // batch)
    labels = torch.randint(FIRST_DIGIT_ID + 10, case.vocab_size, shape, generator=generator)
    choice = torch.rand(shape, generator=generator)
    digits = FIRST_DIGIT_ID + torch.randint(10, shape, generator=generator)
    labels = torch.where(choice < NUMBER_FRACTION, digits, labels)
    labels = torch.where(choice > 1 - IGNORED_FRACTION, torch.full_like(labels, -100), labels)
    if case.suite == "logits":
        logits = 2 * torch.randn(*shape, case.vocab_size, generator=generator)
        return {"logits": logits.to(case.torch_dtype).requires_grad_(), "labels": labels}
    hidden = torch.randn(*shape, case.hidden_size, generator=generator)
    weight = torch.randn(case.vocab_size, case.hidden_size, generator=generator)
    weight /= case.hidden_size**0.5
    return {
        "hidden": hidden.to(case.torch_dtype).requires_grad_(),
        "weight": weight.to(case.torch_dtype).requires_grad_(),
        "labels": labels,
    }


def leaves(inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    return [t for name, t in inputs.items() if name != "labels"]


# ------------------------------------------------------------------ variants

Variant = Callable[[Case, dict[str, torch.Tensor]], torch.Tensor]


def _cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def _ce_plus_ntl(case: Case, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    ntl = number_token_loss(logits, labels, number_vocab(case.vocab_size), reweigh=case.reweigh)
    return _cross_entropy(logits, labels) + NTL_WEIGHT * ntl


@functools.cache
def _ntloss(vocab_size: int, reweigh: bool) -> Any:
    from loguru import logger
    from ntloss import NTLoss

    logger.disable("ntloss")
    return NTLoss(tokenizer(vocab_size), vocab_size=vocab_size, reweigh=reweigh)


def _fused_ce_only(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """numtok's fused kernel with the cross-entropy term alone: the baseline for NTL's marginal
    cost inside the fused path (private API, benchmark only)."""
    flat = labels.reshape(-1)
    is_target = flat != -100
    dtype = torch.float32 if logits.dtype != torch.float64 else torch.float64
    lse, target_logit, _ = row_statistics(
        logits.reshape(-1, logits.shape[-1]),
        torch.where(is_target, flat, 0),
        number_vocab(logits.shape[-1]).tables(logits.device).ids,
        dtype,
    )
    return torch.where(is_target, lse - target_logit, 0).sum() / is_target.sum().clamp_min(1)


LOGITS_VARIANTS: dict[str, Variant] = {
    "F.cross_entropy": lambda case, x: _cross_entropy(x["logits"], x["labels"]),
    "CE + number_token_loss": lambda case, x: _ce_plus_ntl(case, x["logits"], x["labels"]),
    "cross_entropy_with_ntl": lambda case, x: (
        cross_entropy_with_ntl(
            x["logits"], x["labels"], number_vocab(case.vocab_size), reweigh=case.reweigh
        ).loss
    ),
    "fused CE only": lambda case, x: _fused_ce_only(x["logits"], x["labels"]),
    "CE + ntloss 0.3.2": lambda case, x: (
        _cross_entropy(x["logits"], x["labels"])
        + NTL_WEIGHT * _ntloss(case.vocab_size, case.reweigh)(x["logits"], x["labels"])
    ),
}
LINEAR_VARIANTS: dict[str, Variant] = {
    "materialised + CE + number_token_loss": lambda case, x: _ce_plus_ntl(
        case, x["hidden"] @ x["weight"].T, x["labels"]
    ),
    "materialised + cross_entropy_with_ntl": lambda case, x: (
        cross_entropy_with_ntl(
            x["hidden"] @ x["weight"].T,
            x["labels"],
            number_vocab(case.vocab_size),
            reweigh=case.reweigh,
        ).loss
    ),
    "linear_cross_entropy_with_ntl": lambda case, x: (
        linear_cross_entropy_with_ntl(
            x["hidden"],
            x["weight"],
            x["labels"],
            number_vocab(case.vocab_size),
            reweigh=case.reweigh,
        ).loss
    ),
}
# The reference each variant is checked against, and the baseline of the time/memory ratios.
REFERENCE = {"logits": "CE + number_token_loss", "linear": "materialised + CE + number_token_loss"}
BASELINE = {"logits": "F.cross_entropy", "linear": "materialised + CE + number_token_loss"}


def variants(case: Case) -> dict[str, Variant]:
    return LOGITS_VARIANTS if case.suite == "logits" else LINEAR_VARIANTS


def reference_of(case: Case, name: str) -> str:
    return (
        "F.cross_entropy" if name in ("F.cross_entropy", "fused CE only") else REFERENCE[case.suite]
    )


# ------------------------------------------------------------------ correctness, timing


def run_once(
    case: Case, variant: Variant, inputs: dict[str, torch.Tensor]
) -> tuple[float, float, float]:
    """(forward, backward) wall-clock seconds of one training step of the loss, and the CPU
    seconds of the whole step (user + system: robust to other processes on a shared machine).
    Gradients land in .grad."""
    for leaf in leaves(inputs):
        leaf.grad = None
    cpu_start, start = time.process_time(), time.perf_counter()
    loss = variant(case, inputs)
    middle = time.perf_counter()
    loss.backward()
    end = time.perf_counter()
    return middle - start, end - middle, time.process_time() - cpu_start


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    """||value - reference|| / ||reference|| over row chunks (no full-size float32 temporaries)."""
    rows_value, rows_reference = (
        value.reshape(-1, value.shape[-1]),
        reference.reshape(-1, value.shape[-1]),
    )
    difference = total = 0.0
    for start in range(0, rows_value.shape[0], 256):
        a = rows_value[start : start + 256].double()
        b = rows_reference[start : start + 256].double()
        difference += float((a - b).square().sum())
        total += float(b.square().sum())
    return (difference / max(total, 1e-300)) ** 0.5


TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2}  # relative error of value and of each gradient


def check_variants(case: Case, inputs: dict[str, torch.Tensor]) -> dict[str, float]:
    """Run every variant once (also the warm-up) and compare value and gradients with its
    reference; raises if a variant is off. Returns the largest relative error per variant."""
    results: dict[str, tuple[torch.Tensor, list[torch.Tensor]]] = {}
    names = list(variants(case))
    order = sorted(names, key=lambda n: n not in (REFERENCE[case.suite], "F.cross_entropy"))
    errors = {}
    for name in order:
        for leaf in leaves(inputs):
            leaf.grad = None
        loss = variants(case)[name](case, inputs)
        loss.backward()
        grads = [leaf.grad for leaf in leaves(inputs)]
        assert all(g is not None for g in grads)
        if name in (REFERENCE[case.suite], "F.cross_entropy"):
            results[name] = (loss.detach().float(), grads)  # type: ignore[assignment]
        reference_value, reference_grads = results[reference_of(case, name)]
        error = max(
            [abs(float(loss.detach().float() - reference_value)) / abs(float(reference_value))]
            + [relative_error(g, r) for g, r in zip(grads, reference_grads, strict=True)]  # type: ignore[arg-type]
        )
        if error > TOLERANCE[case.dtype]:
            raise AssertionError(f"{case.label()}: {name} is off by {error:.2e} relative")
        errors[name] = error
    for leaf in leaves(inputs):
        leaf.grad = None
    return errors


def quantiles(samples: list[float]) -> tuple[float, float, float]:
    """(p20, median, p80) in milliseconds."""
    p20, _, _, p80 = statistics.quantiles(samples, n=5, method="inclusive")
    return 1e3 * p20, 1e3 * statistics.median(samples), 1e3 * p80


def time_case(case: Case, rounds: int) -> dict[str, dict[str, list[float]]]:
    inputs = make_inputs(case)
    errors = check_variants(case, inputs)
    names = list(variants(case))
    samples: dict[str, dict[str, list[float]]] = {
        n: {"forward": [], "backward": [], "full": [], "cpu": [], "check_error": [errors[n]]}
        for n in names
    }
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            forward, backward, cpu = run_once(case, variants(case)[name], inputs)
            samples[name]["forward"].append(forward)
            samples[name]["backward"].append(backward)
            samples[name]["full"].append(forward + backward)
            samples[name]["cpu"].append(cpu)
    return samples


# ------------------------------------------------------------------ memory in a fresh process


def _status(field: str) -> int:
    """A field of /proc/self/status in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def probe_memory(case: Case, name: str) -> int:
    """In this (fresh) process: peak resident memory added by one forward + backward."""
    inputs = make_inputs(case)
    variant = variants(case)[name]
    # Warm up lazily initialised machinery (thread pools, custom-op dispatch, ntloss caches) on
    # four positions per sequence, so that only the measured call's own buffers are counted.
    small = {
        k: v if k == "weight" else v.detach()[:, :4].requires_grad_(v.requires_grad)
        for k, v in inputs.items()
    }
    run_once(case, variant, small)
    del small
    for leaf in leaves(inputs):
        leaf.grad = None
    baseline = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")  # resets VmHWM to the current VmRSS
    run_once(case, variant, inputs)
    return _status("VmHWM") - baseline


def measure_memory(case: Case, name: str, threads: int) -> int:
    command = [
        sys.executable,
        __file__,
        "--probe-memory",
        json.dumps([dataclasses.asdict(case), name]),
        "--threads",
        str(threads),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    output = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
    return int(output.strip().splitlines()[-1])


# ------------------------------------------------------------------ reporting


def provenance(threads: int) -> dict[str, Any]:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            cpu = next(
                line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")
            )
    except (OSError, StopIteration):
        pass
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "numtok": numtok.__version__,
        "python": platform.python_version(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "threads": threads,
        "device": "cpu",
    }


def rows_for_case(
    case: Case,
    samples: dict[str, dict[str, list[float]]],
    memory: dict[str, int],
    rounds: int,
    meta: dict[str, Any],
) -> list[dict[str, Any]]:
    baseline = BASELINE[case.suite]
    rows = []
    for name, by_mode in samples.items():
        for mode in ("forward", "backward", "full"):
            p20, median, p80 = quantiles(by_mode[mode])
            baseline_median = quantiles(samples[baseline][mode])[1]
            row = {
                **meta,
                **dataclasses.asdict(case),
                "number_fraction": NUMBER_FRACTION,
                "ignored_fraction": IGNORED_FRACTION,
                "ntl_weight": NTL_WEIGHT,
                "variant": name,
                "mode": mode,
                "rounds": rounds,
                "median_ms": round(median, 2),
                "p20_ms": round(p20, 2),
                "p80_ms": round(p80, 2),
                "baseline": baseline,
                "time_ratio": round(median / baseline_median, 3),
                "check_relative_error": by_mode["check_error"][0],
            }
            if mode == "full":
                cpu_median = quantiles(by_mode["cpu"])[1]
                row["cpu_median_ms"] = round(cpu_median, 2)
                row["cpu_time_ratio"] = round(
                    cpu_median / quantiles(samples[baseline]["cpu"])[1], 3
                )
            if mode == "full" and name in memory:
                row["peak_extra_mib"] = round(memory[name] / 2**20, 1)
                row["peak_extra_x_logits"] = round(memory[name] / case.logits_bytes, 2)
            rows.append(row)
    return rows


def summary_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| case | variant | full ms (p20-p80) | × base | CPU × base | fwd ms | bwd ms "
        "| peak × logits |",
        "|---|---|---|---|---|---|---|---|",
    ]
    by_key: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for row in rows:
        case = Case(**{f.name: row[f.name] for f in dataclasses.fields(Case)})
        by_key.setdefault((case.label(), row["variant"]), {})[row["mode"]] = row
    for (label, variant), modes in by_key.items():
        full = modes["full"]
        memory = full.get("peak_extra_x_logits", "")
        lines.append(
            f"| {label} | {variant} | {full['median_ms']:.0f} ({full['p20_ms']:.0f}-"
            f"{full['p80_ms']:.0f}) | {full['time_ratio']:.2f} | {full['cpu_time_ratio']:.2f} | "
            f"{modes['forward']['median_ms']:.0f} | {modes['backward']['median_ms']:.0f} "
            f"| {memory} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small shapes: a smoke run")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds, logits suite")
    parser.add_argument("--linear-rounds", type=int, default=3, help="timed rounds, linear suite")
    parser.add_argument("--suite", choices=["logits", "linear", "all"], default="all")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "all"], default="all")
    parser.add_argument(
        "--no-memory", action="store_true", help="skip the fresh-process memory runs"
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="JSONL file (default: results/<date>T<time>-cpu-t<threads>.jsonl; none for --quick)",
    )
    parser.add_argument("--probe-memory", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    if args.probe_memory:
        case_fields, name = json.loads(args.probe_memory)
        print(probe_memory(Case(**case_fields), name))
        return

    cases = quick_cases() if args.quick else full_cases()
    cases = [c for c in cases if args.suite in ("all", c.suite) and args.dtype in ("all", c.dtype)]
    meta = provenance(args.threads)
    out = args.out
    if out is None and not args.quick:
        stamp = meta["date"][:16].replace(":", "")  # 2026-11-29T2215
        out = RESULTS / f"{stamp}-cpu-t{args.threads}.jsonl"
    rows: list[dict[str, Any]] = []
    for case in cases:
        rounds = args.rounds if case.suite == "logits" else args.linear_rounds
        print(f"== {case.label()}: {rounds} rounds", file=sys.stderr, flush=True)
        samples = time_case(case, rounds)
        memory = (
            {}
            if args.no_memory
            else {name: measure_memory(case, name, args.threads) for name in variants(case)}
        )
        case_rows = rows_for_case(case, samples, memory, rounds, meta)
        rows += case_rows
        print(summary_table(case_rows), file=sys.stderr, flush=True)
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            with out.open("a") as file:
                file.writelines(json.dumps(row) + "\n" for row in case_rows)
    print(summary_table(rows))
    if out is not None:
        out.with_suffix(".md").write_text(summary_table(rows) + "\n")
        print(f"results: {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
