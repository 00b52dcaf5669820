"""``gpu_checks.py report``: the report of ``benchmarks/gpu.sh`` so far, from its work folder
(``steps.jsonl``, a line per step; each step's ``.md``, ``.jsonl``, ``.out``, ``.err`` and, in
the dry run, ``.variants``): ``BASE.md`` (the steps' table, the targets of ``gpu_targets.py``,
in the dry run the estimates of ``gpu_budget.py``, each step's section), ``BASE.jsonl`` (every
step's status and rows, each row tagged with its step) and ``BASE-log.txt`` (the end of each
step's output). gpu.sh runs it after every step; ``estimate`` prints the estimates and exits 1
when one exceeds its step's limit. It imports no torch."""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

from gpu_budget import estimates
from gpu_budget import table as budget_table
from gpu_common import read_rows, short, tail

#: The outcome of the pytest step, from its closing line.
PYTEST_COUNTS = re.compile(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed)")


def _pytest_row(lines: list[str]) -> dict[str, Any]:
    for line in reversed(lines):
        counts = PYTEST_COUNTS.findall(line)
        if counts and (" in " in line or line.startswith("=")):
            return {word.rstrip("s") if word == "errors" else word: int(n) for n, word in counts}
    return {}


def _section(work: Path, step: dict[str, Any]) -> list[str]:
    """A step's part of the report: its heading and status, what it wrote (``<step>.md``), and
    where it did not complete or its output is the result, the end of its log."""
    name, status = step["step"], step["status"]
    took = f"{step['seconds']} s of its {step['limit']} s" if status != "skipped" else ""
    lines = [f"## {step['title']}: {status}" + (f" ({took})" if took else ""), ""]
    if step.get("note"):
        lines += [step["note"], ""]
    lines += [f"`{step['command']}`", ""] if step.get("command") else []
    section = work / f"{name}.md"
    if section.is_file():
        lines += [section.read_text().rstrip(), ""]
    out, err = work / f"{name}.out", work / f"{name}.err"
    if name == "tests":
        results = Counter(r["outcome"] for r in read_rows(work / "tests.jsonl") if "test" in r)
        counted = ", ".join(f"{n} {outcome}" for outcome, n in sorted(results.items()))
        lines += [f"Results written as the tests finished: {counted or 'none'}.", ""]
        lines += ["```", *tail(out, 25), "```", ""]
    if name == "sanitizer":
        verdict = [line for line in tail(out, 400) if line.startswith("=========")]
        if verdict:
            lines += ["compute-sanitizer:", "", "```", *verdict[-30:], "```", ""]
    if status not in ("completed", "skipped"):
        # (pytest, which runs the gpu-marked tests, reports a failure on its standard output)
        log = tail(err, 20) or tail(out, 20)
        lines += [f"End of the {name} step's log:", "", "```", *log, "```", ""]
    return lines


def report(args: argparse.Namespace) -> int:
    """The report of gpu.sh so far, from its work folder: ``BASE.md`` (a table of the steps, the
    targets, then each step's section), ``BASE.jsonl`` (every step's status and rows, each row
    with its step) and ``BASE-log.txt`` (the end of each step's output)."""
    from gpu_targets import linear_targets, logits_targets, trainer_targets

    work = Path(args.work)
    steps = read_rows(work / "steps.jsonl")
    setup_row = next(iter(read_rows(work / "setup.jsonl")), {})
    machine = setup_row.get("gpu") or (
        "CPU (a dry run)" if setup_row.get("device") == "cpu" else "(set-up not run)"
    )
    state = (
        "finished"
        if args.finished
        else "still running (the steps below the last one listed have not run yet)"
    )
    lines = [
        f"# numtok on {machine}: `benchmarks/gpu.sh`, "
        f"{time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}",
        "",
        f"{args.elapsed} s of its {args.budget}-second budget, {state}. Each step runs under its "
        "own time limit; a step stopped at its limit keeps what it wrote until then.",
        "",
        "| step | status | s | limit s |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {s['title']} | {s['status']} | {'–' if s.get('seconds') is None else s['seconds']} "
        f"| {s.get('limit', '')} |"
        for s in steps
    ]
    loss_rows = read_rows(work / "loss.jsonl")
    trainer_rows = read_rows(work / "trainer.jsonl")
    try:
        targets = logits_targets(loss_rows) + linear_targets(loss_rows)
        targets += trainer_targets(trainer_rows)
    except Exception as error:
        targets = [f"| (the targets could not be read: {short(error)}) | | | | |"]
    lines += ["", "## Targets (`benchmarks/gpu_targets.py`, the timing rows below)", ""]
    lines += (
        ["| target | case | measured | bound | holds |", "|---|---|---|---|---|", *targets]
        if targets
        else ["(no timing rows yet)"]
    )
    lines.append("")
    if setup_row.get("device") == "cpu":
        lines += [
            "## Estimates on the GPU (`benchmarks/gpu_budget.py`)",
            "",
            "What each step would take on the GPU machine, from what its dry run counted (the "
            "assumed costs are `gpu_budget.py`'s); the dry run fails when one exceeds its "
            "limit.",
            "",
            *budget_table(estimates(work)),
            "",
        ]
    rows: list[dict[str, Any]] = []
    log: list[str] = []
    for step in steps:
        name = step["step"]
        try:
            lines += _section(work, step)
        except Exception as error:  # one step's odd files do not cost the rest of the report
            lines += [f"## {step.get('title', name)}: its section failed: {short(error)}", ""]
        rows.append({"record": "step", **step})
        step_rows = read_rows(work / f"{name}.jsonl")
        if name == "tests":  # each test as it finished (gpu_pytest_rows.py), then the summary
            step_rows.append({"record": "summary", **_pytest_row(tail(work / "tests.out", 40))})
        rows += [{"step": name, **row} for row in step_rows if row]
        log += [f"===== {name}: {step['status']} =====", f"$ {step.get('command', '')}"]
        for stream in ("out", "err"):
            log += [f"----- std{stream} (the last {args.log_lines} lines) -----"]
            log += tail(work / f"{name}.{stream}", args.log_lines)
        log.append("")
    base = Path(args.out)
    base.parent.mkdir(parents=True, exist_ok=True)
    base.with_suffix(".md").write_text("\n".join(lines).rstrip() + "\n")
    base.with_suffix(".jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    base.with_name(base.name + "-log.txt").write_text("\n".join(log) + "\n")
    return 0


def estimate(args: argparse.Namespace) -> int:
    """The estimates of the dry run in ``args.work``; 1 when a step's exceeds its limit."""
    found = estimates(Path(args.work))
    print("\n".join(budget_table(found)))
    over = [e.step for e in found if not e.fits]
    if over:
        print(f"gpu_budget: estimated past their limits on the GPU: {', '.join(over)}")
    return 1 if over else 0
