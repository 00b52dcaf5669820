"""The report of a fine-tuning comparison: every seed's metrics per split and readout, the mean
and spread over seeds, and each arm's paired difference from CE with its 95 % interval
(:mod:`numtok.experiments.stats`); ``results.json``, ``report.md`` and ``report.png`` in the run
folder.

Every (arm, readout) is compared with CE's same readout; the regression head (rJokes), which has
a readout of its own, with CE's ``expected`` readout (the mean of its distribution, the readout a
squared error rewards) and with CE's ``greedy`` one. On rJokes each split's table is followed by
the constant answers every arm must beat (:func:`~numtok.experiments.finetune.evaluate.
constant_reference`); the plot draws the best of them as a dashed line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from numtok.experiments.finetune.config import FinetuneConfig
from numtok.experiments.stats import paired_comparison, summarise

__all__ = ["comparisons", "write_report"]

#: Whether a smaller value is better, per metric.
_LOWER_IS_BETTER = {"mae": True, "log_mae": True, "rmse": True}


def _baselines(readout: str) -> list[str]:
    return ["expected", "greedy"] if readout == "head" else [readout]


def _values(runs: Sequence[dict[str, Any]], seeds: Sequence[int], arm: str, split: str,
            readout: str, metric: str) -> list[float | None]:  # fmt: skip
    by_seed = {run["seed"]: run for run in runs if run["arm"] == arm}
    return [
        by_seed[seed]["metrics"].get(split, {}).get(readout, {}).get(metric)
        if seed in by_seed
        else None
        for seed in seeds
    ]


def comparisons(config: FinetuneConfig, runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (split, arm, readout, metric): the per-seed values, their summary, and the
    paired difference from CE (``vs_ce``, with ``baseline`` its readout; None for CE itself)."""
    entries = []
    first = next(run for run in runs if run["arm"] == "ce")
    for split, by_readout in first["metrics"].items():
        for arm in config.arms:
            arm_runs = [run for run in runs if run["arm"] == arm]
            if not arm_runs:
                continue
            for readout, metrics in arm_runs[0]["metrics"][split].items():
                for metric in metrics:
                    values = _values(runs, config.seeds, arm, split, readout, metric)
                    entry: dict[str, Any] = {
                        "split": split, "arm": arm, "readout": readout, "metric": metric,
                        **summarise(values), "vs_ce": [],
                    }  # fmt: skip
                    for baseline in _baselines(readout):
                        if arm == "ce" or baseline not in by_readout:
                            continue
                        ce = _values(runs, config.seeds, "ce", split, baseline, metric)
                        entry["vs_ce"].append(
                            {"baseline": baseline, **paired_comparison(values, ce)}
                        )
                    entries.append(entry)
    return entries


def _number(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.3f}"


def _difference(entry: dict[str, Any], metric: str) -> str:
    if entry["mean"] is None:
        return "n/a"
    text = f"{entry['mean']:+.3f}"
    if entry["low"] is not None:
        text += f" [{entry['low']:+.3f}, {entry['high']:+.3f}]"
    if entry["exceeds"]:
        better = (entry["mean"] < 0) == _LOWER_IS_BETTER.get(metric, False)
        text = f"**{text}** ({'better' if better else 'worse'})"
    return text


def _reference_lines(reference: dict[str, dict[str, Any]]) -> list[str]:
    """The constant answers' table: what an arm must beat to show it learnt from the jokes."""
    lines = [
        "Constant answers (the training jokes' score, the same for every joke; no pearson, it "
        "does not vary): an arm that does not beat them shows nothing learnt from the jokes.",
        "",
        "| constant | value | rmse | mae |",
        "|---|---|---|---|",
    ]
    for name, metrics in reference.items():
        lines.append(
            f"| training {name} | {metrics['value']:.3f} | {_number(metrics['rmse'])} | "
            f"{_number(metrics['mae'])} |"
        )
    return lines


def _markdown(
    config: FinetuneConfig,
    entries: Sequence[dict[str, Any]],
    minutes: float,
    reference: dict[str, dict[str, dict[str, Any]]],
) -> str:
    weights = ", ".join(
        f"{arm} {config.weight_of(arm)}" for arm in config.arms if arm in ("was", "mse", "del")
    )
    lines = [
        f"# Fine-tuning {config.model} on {config.task}: {config.evaluate_on} splits",
        "",
        f"Seeds {list(config.seeds)}; {config.adaptation} fine-tuning, {config.steps} steps × "
        f"{config.batch_size} examples, learning rate {config.learning_rate}; λ: {weights}. "
        f"{minutes:.1f} minutes of training and scoring. Mean ± std over seeds, every seed in "
        "brackets; Δ is the paired difference from CE (same readout) with its 95 % interval, "
        "in bold where it exceeds the seed spread.",
    ]
    splits = list(dict.fromkeys(e["split"] for e in entries))
    for split in splits:
        lines += ["", f"## {split}", ""]
        metrics = list(dict.fromkeys(e["metric"] for e in entries if e["split"] == split))
        lines.append("| arm | readout | " + " | ".join(metrics) + " |")
        lines.append("|---|---|" + "---|" * len(metrics))
        rows = list(dict.fromkeys((e["arm"], e["readout"]) for e in entries if e["split"] == split))
        for arm, readout in rows:
            cells = []
            for metric in metrics:
                found = [e for e in entries if (e["split"], e["arm"], e["readout"], e["metric"])
                         == (split, arm, readout, metric)]  # fmt: skip
                if not found:
                    cells.append("")
                    continue
                entry = found[0]
                seeds = ", ".join(_number(v) for v in entry["values"])
                text = _number(entry["mean"])
                if entry["std"] is not None:
                    text += f" ± {_number(entry['std'])}"
                cells.append(f"{text} [{seeds}]")
            lines.append(f"| {arm} | {readout} | " + " | ".join(cells) + " |")
        if split in reference:
            lines += ["", *_reference_lines(reference[split])]
        lines += ["", "| arm | readout | vs CE | " + " | ".join(metrics) + " |",
                  "|---|---|---|" + "---|" * len(metrics)]  # fmt: skip
        for arm, readout in rows:
            if arm == "ce":
                continue
            for baseline in _baselines(readout):
                cells = []
                for metric in metrics:
                    found = [
                        c for e in entries
                        if (e["split"], e["arm"], e["readout"], e["metric"])
                        == (split, arm, readout, metric)
                        for c in e["vs_ce"] if c["baseline"] == baseline
                    ]  # fmt: skip
                    cells.append(_difference(found[0], metric) if found else "")
                if any(cells):
                    lines.append(
                        f"| {arm} | {readout} | CE {baseline} | " + " | ".join(cells) + " |"
                    )
    return "\n".join(lines) + "\n"


def _plot(
    entries: Sequence[dict[str, Any]], reference: dict[str, dict[str, dict[str, Any]]], path: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    splits = list(dict.fromkeys(e["split"] for e in entries))
    metrics = list(dict.fromkeys(e["metric"] for e in entries if e["metric"] != "parsed_share"))
    # A panel a third of an inch per bar, at least 3.2 inches; with many bars (rJokes: 19
    # arm-readouts) one panel per row.
    bars = max(sum(e["split"] == s and e["metric"] == metrics[0] for e in entries) for s in splits)
    width = max(3.2, 0.34 * bars)
    panels = [(split, metric) for split in splits for metric in metrics]
    columns = len(metrics) if bars <= 10 else 1
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(width * columns, 2.8 * rows), squeeze=False)
    for number, (split, metric) in enumerate(panels):
        axis = axes[number // columns][number % columns]
        chosen = [e for e in entries if e["split"] == split and e["metric"] == metric]
        for index, entry in enumerate(chosen):
            if entry["mean"] is not None:
                axis.bar(index, entry["mean"], color="#9ecae1")
            values = [v for v in entry["values"] if v is not None and math.isfinite(v)]
            axis.plot([index] * len(values), values, "k.", markersize=4)
        # The best constant answer on this metric (mean for rmse, median for mae).
        constants = [c.get(metric) for c in reference.get(split, {}).values()]
        finite = [c for c in constants if c is not None and math.isfinite(c)]
        if finite:
            axis.axhline(min(finite), color="#d62728", linestyle="--", linewidth=1)
        axis.set_xticks(range(len(chosen)))
        axis.set_xticklabels(
            [e["arm"] if e["readout"] in ("greedy", "head") else f"{e['arm']}\n{e['readout']}"
             for e in chosen], fontsize=7, rotation=45,
        )  # fmt: skip
        axis.set_title(f"{split}: {metric}", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_report(
    run_dir: Path,
    config: FinetuneConfig,
    runs: Sequence[dict[str, Any]],
    minutes: float,
    reference: dict[str, dict[str, dict[str, Any]]],
) -> dict[str, Any]:
    """Write ``results.json``, ``report.md`` and ``report.png`` into ``run_dir``; return the
    results. ``reference``: per split, the constant answers' metrics (empty for arithmetic)."""
    entries = comparisons(config, runs)
    results = {"config": config.to_dict(), "runs": list(runs), "comparisons": entries,
               "reference": reference, "minutes": minutes}  # fmt: skip
    (run_dir / "results.json").write_text(json.dumps(results, indent=1))
    (run_dir / "report.md").write_text(_markdown(config, entries, minutes, reference))
    _plot(entries, reference, run_dir / "report.png")
    return results
