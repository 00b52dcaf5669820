"""A ``numtok compare`` run whose readouts were drawn against the same run scored exactly.

The two run folders come from the same command but the readout (``bench_compare_cost.py``
without, then with ``--readout-tolerance 0``): the same seeds, data and settings train the same
weights, which the greedy answers (exact in both) confirm item by item. For every seed, arm and
split, each drawn expected answer ``m̂`` is set against the exact mean ``m`` by its standard
error ``s``: ``z = (m̂ − m) / s``, whose share within ±1.96 is the draws' coverage at 95 %; the
median and mode are compared as shares equal. The gate decisions and test verdicts of both runs
(``bench_compare_cost.decisions``) are set side by side, and every one that differs is listed.

    .venv/bin/python benchmarks/drawn_against_exact.py DRAWN_RUN EXACT_RUN [--out FILE]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
from bench_compare_cost import decisions

#: The two-sided normal quantile at 95 %.
Z_95 = 1.959963984540054


def split_scores(job: Path) -> dict[str, dict[str, Any]]:
    """Each split's stored scores of one job folder (``seedS/ARM``): validation and test."""
    scores = {"validation": json.loads((job / "validation.json").read_text())}
    test = job / "test.json"
    if test.is_file():
        scores |= json.loads(test.read_text())["splits"]
    return scores


def compared(drawn_run: Path, exact_run: Path) -> dict[str, Any]:
    """The row: per job and split the greedy agreement, the expected answers' z statistics, the
    median's and mode's agreement; over all items the coverage; the decisions that differ."""
    jobs, z_all = [], []
    for job in sorted(drawn_run.glob("seed*/*/")):
        exact_job = exact_run / job.relative_to(drawn_run)
        exact_scores = split_scores(exact_job)
        for split, drawn in split_scores(job).items():
            exact = exact_scores[split]
            answers = {
                name: np.array(drawn["answers"][name], dtype=float) for name in drawn["answers"]
            }
            truth = {
                name: np.array(exact["answers"][name], dtype=float) for name in exact["answers"]
            }
            error = np.array(drawn["standard_errors"]["expected"], dtype=float)
            spread = error > 0
            z = (answers["expected"][spread] - truth["expected"][spread]) / error[spread]
            z_all += z.tolist()
            gap = np.abs(answers["expected"] - truth["expected"])
            jobs.append({
                "job": str(job.relative_to(drawn_run)), "split": split,
                "greedy_equal": _equal_share(answers["greedy"], truth["greedy"]),
                "items": int(error.size), "zero_standard_error": int((~spread).sum()),
                "zero_standard_error_exact_equal": int(
                    np.sum(answers["expected"][~spread] == truth["expected"][~spread])),
                "z_mean": float(z.mean()), "z_sd": float(z.std(ddof=1)),
                "within_95": float(np.mean(np.abs(z) <= Z_95)),
                "largest_abs_difference": float(gap.max()),
                "mean_standard_error": float(error.mean()),
                "median_equal": _equal_share(answers["median"], truth["median"]),
                "mode_equal": _equal_share(answers["mode"], truth["mode"]),
            })  # fmt: skip
    z_array = np.array(z_all)
    drawn_lines = decisions(json.loads((drawn_run / "results.json").read_text()))
    exact_lines = decisions(json.loads((exact_run / "results.json").read_text()))
    return {
        "drawn_run": str(drawn_run),
        "exact_run": str(exact_run),
        "greedy_equal": all(j["greedy_equal"] == 1.0 for j in jobs),
        "items": int(z_array.size),
        "z_mean": float(z_array.mean()),
        "z_sd": float(z_array.std(ddof=1)),
        "within_95": float(np.mean(np.abs(z_array) <= Z_95)),
        "jobs": jobs,
        "decisions_that_differ": _differing(drawn_lines, exact_lines),
        "drawn_decisions": drawn_lines,
        "exact_decisions": exact_lines,
    }


def _equal_share(one: np.ndarray, other: np.ndarray) -> float:
    """The share of items whose two answers are equal (two unparsed answers, NaN, are)."""
    return float(np.mean((one == other) | (np.isnan(one) & np.isnan(other))))


def _differing(drawn: dict[str, list[str]], exact: dict[str, list[str]]) -> list[dict[str, str]]:
    """The gate decisions and verdicts (the words before the estimate) that differ."""
    return [
        {"drawn": one, "exact": other}
        for kind in drawn
        for one, other in zip(drawn[kind], exact[kind], strict=True)
        if one.split(", ")[0] != other.split(", ")[0]
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("drawn", type=Path)
    parser.add_argument("exact", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    row = compared(args.drawn, args.exact)
    text = json.dumps(row, indent=1) + "\n"
    if args.out is not None:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
