"""The GPU targets of the fused and logits-free paths, read off one run's rows: each target with
the ratio measured, per case, and whether it holds.

    python benchmarks/gpu_targets.py --rows RUN-eager.jsonl RUN-linear.jsonl --trainer RUN.jsonl

Targets (ratios of medians in the same run; peak memory in process, ``max_memory_allocated``):

* fused CE + NTL (``cross_entropy_with_ntl impl=triton``, the Triton kernels, opt-in until these
  hold) ≤ 0.6× ``F.cross_entropy`` and ≤ 1.0× Liger's cross-entropy (which computes no NTL), in
  every logits case (issue 27: also with 50 % ignored labels and an upstream gradient ≠ 1); in
  place, extra peak memory ≤ 0.05× the logits;
* logits-free (``linear_cross_entropy_with_ntl impl=triton``) ≤ 1.0× the materialised path
  (``hidden @ W.T``, then CE + ``number_token_loss``) at ≤ 0.2× its peak memory, and ≤ 0.5×
  Liger's fused linear cross-entropy, in every linear case;
* the Trainer step with ``logits_free=True`` ≤ 1.0× the time of the logits path at ≤ 0.6× its
  peak memory.

A row that is missing (a variant that did not run, a step that stopped) is reported as such.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

Rows = list[dict[str, Any]]


def _load(path: Path) -> Rows:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def case_label(row: dict[str, Any]) -> str:
    """bench_loss.py's case label without the suite: shape, dtype, reweigh, and the share of
    ignored labels and the upstream gradient where they are not 5 % and 1."""
    label = f"N={row['tokens']} V={row['vocab_size']}"
    label += f" H={row['hidden_size']}" if row["hidden_size"] else ""
    label += f" {row['dtype']} reweigh={'on' if row['reweigh'] else 'off'}"
    if row.get("ignored_fraction", 0.05) != 0.05:
        label += f" ignored={row['ignored_fraction']:.0%}"
    if row.get("upstream", 1.0) != 1:
        label += f" upstream={row['upstream']:g}"
    return label


def _cases(rows: Rows, suite: str) -> Iterator[tuple[str, dict[str, dict[str, Any]]]]:
    """(label, {variant: full-mode row}) per case of ``suite``, eager rows only."""
    by_case: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        if row["suite"] != suite or row["mode"] != "full" or row.get("compiled"):
            continue
        by_case.setdefault(case_label(row), {})[row["variant"]] = row
    yield from by_case.items()


def _ratio(rows: dict[str, dict[str, Any]], name: str, base: str, field: str) -> float | None:
    if name not in rows or base not in rows or field not in rows[name] or field not in rows[base]:
        return None
    denominator = rows[base][field]
    return None if not denominator else rows[name][field] / denominator


def _line(target: str, case: str, value: float | None, bound: float) -> str:
    if value is None:
        return f"| {target} | {case} | not measured | ≤ {bound:g} | – |"
    verdict = "yes" if value <= bound else "**no**"
    return f"| {target} | {case} | {value:.2f} | ≤ {bound:g} | {verdict} |"


def logits_targets(rows: Rows) -> list[str]:
    lines = []
    fused = "cross_entropy_with_ntl impl=triton"
    inplace = "cross_entropy_with_ntl inplace impl=triton"
    for case, variants in _cases(rows, "logits"):
        time = "median_ms"
        lines.append(
            _line(
                "fused × F.cross_entropy",
                case,
                _ratio(variants, fused, "F.cross_entropy", time),
                0.6,
            )
        )
        lines.append(
            _line("fused × Liger CE", case, _ratio(variants, fused, "Liger CE (no NTL)", time), 1.0)
        )
        memory = variants.get(inplace, {}).get("peak_extra_x_logits")
        lines.append(_line("in place: extra peak × logits", case, memory, 0.05))
    return lines


def linear_targets(rows: Rows) -> list[str]:
    lines = []
    linear = "linear_cross_entropy_with_ntl impl=triton"
    base = "materialised + CE + number_token_loss"
    liger = "Liger fused linear CE (no NTL)"
    for case, variants in _cases(rows, "linear"):
        lines.append(
            _line(
                "logits-free × materialised", case, _ratio(variants, linear, base, "median_ms"), 1.0
            )
        )
        memory = _ratio(variants, linear, base, "peak_extra_mib")
        lines.append(_line("logits-free peak × materialised peak", case, memory, 0.2))
        lines.append(
            _line(
                "logits-free × Liger FLCE", case, _ratio(variants, linear, liger, "median_ms"), 0.5
            )
        )
    return lines


def trainer_targets(rows: Rows) -> list[str]:
    by_mode = {row["mode"]: row for row in rows}
    if "logits" not in by_mode:
        return []
    case = ", ".join(f"{key}={by_mode['logits'][key]}" for key in ("preset", "batch", "sequence"))
    free = by_mode.get("logits_free", {})
    return [
        _line("Trainer step, logits-free × logits: time", case, free.get("time_ratio"), 1.0),
        _line("Trainer step, logits-free × logits: peak", case, free.get("step_peak_ratio"), 0.6),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows", type=Path, nargs="+", required=True, help="bench_loss.py's eager JSONL files"
    )
    parser.add_argument("--trainer", type=Path, help="bench_trainer_step.py's JSONL")
    args = parser.parse_args()
    lines = ["| target | case | measured | bound | holds |", "|---|---|---|---|---|"]
    rows = [row for path in args.rows if path.is_file() for row in _load(path)]
    lines += logits_targets(rows) + linear_targets(rows)
    if args.trainer is not None and args.trainer.is_file():
        lines += trainer_targets(_load(args.trainer))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
