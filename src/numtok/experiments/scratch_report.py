"""The report of an arithmetic run trained from scratch: ``results.json``, ``report.md``,
``curves.png`` and the table printed at the end of ``numtok demo`` (its arithmetic fallback).

For each split, arm and metric the report gives the mean and standard deviation over seeds, and
the *paired* difference to CE seed by seed, tested as :mod:`numtok.experiments.stats` describes.
Every seed draws its own evaluation questions — items nested in seeds — so the seed-to-seed
spread holds the test questions' sampling noise, and the paired-seed t interval is this design's
analysis (the fine-tuning and rJokes runs, whose seeds share one test set, are crossed and go to
the one report writer, :mod:`numtok.experiments.report`).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from numtok.experiments.config import ExperimentConfig
from numtok.experiments.objectives import ARM_LABELS
from numtok.experiments.report_format import ARM_COLOURS, json_safe, run_header, table
from numtok.experiments.stats import finite, paired_comparison, seeds_note, summarise
from numtok.experiments.tokenizer import CharTokenizer

__all__ = ["METRICS", "format_table", "write_report"]

#: Metrics shown and tested: name -> (column title, higher is better). Plain MAE is left out: a
#: few generations with many extra digits decide it (1e16 and more).
METRICS: dict[str, tuple[str, bool]] = {
    "exact_accuracy": ("exact acc", True),
    "median_absolute_error": ("median abs err", False),
    "within_1_percent": ("within 1%", True),
    "clipped_mae": ("clipped MAE", False),
    "log_mae": ("log-MAE", False),
    "unparseable_rate": ("unparseable", False),
}
#: The metrics the verdict tests (the unparseable rate is shown but not tested).
TESTED = ("exact_accuracy", "median_absolute_error", "within_1_percent", "clipped_mae", "log_mae")
SPLIT_LABELS = {
    "easy": "easy (train-easy difficulty, held out)",
    "medium_hard": "medium+hard (train difficulty, held out)",
    "interpolate": "interpolation (test setting)",
    "extrapolate": "extrapolation (bigger numbers / longer)",
    "validation": "validation (train difficulties, held out; for choosing settings)",
}


def _by_seed(results: Sequence[dict[str, Any]]) -> dict[tuple[int, str], dict[str, Any]]:
    return {(r["seed"], r["arm"]): r for r in results}


def _summarise(
    config: ExperimentConfig, results: Sequence[dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``(summary, paired, paired_vs_was)``: per split, arm and metric the summary over seeds;
    every other arm − CE; every arm but CE − NTL-WAS (empty without a ``was`` arm)."""
    runs = _by_seed(results)

    def values(arm: str, split: str, metric: str) -> list[float | None]:
        return [runs[(s, arm)]["metrics"][split][metric] for s in config.seeds]

    def paired_to(baseline: str) -> dict[str, Any]:
        if baseline not in config.arms:
            return {}
        others = [arm for arm in config.arms if arm not in ("ce", baseline)]
        return {
            split: {
                arm: {
                    metric: paired_comparison(
                        values(arm, split, metric), values(baseline, split, metric)
                    )
                    for metric in METRICS
                }
                for arm in others
            }
            for split in config.splits
        }

    summary = {
        split: {
            arm: {metric: summarise(values(arm, split, metric)) for metric in METRICS}
            for arm in config.arms
        }
        for split in config.splits
    }
    return summary, paired_to("ce"), paired_to("was")


def _verdict(config: ExperimentConfig, paired: dict[str, Any]) -> tuple[str, list[str]]:
    """A plain statement of whether any difference to CE exceeds the seed spread."""
    n = len(config.seeds)
    if n < 2:
        return (
            "With one seed the seed spread is unknown, so no difference between arms can be "
            "judged; run with --seeds 3 or more.",
            [],
        )
    hits, tested, better_count = [], 0, 0
    for split, arms in paired.items():
        for arm, metrics in arms.items():
            for metric in TESTED:
                entry = metrics[metric]
                if entry["exceeds"] is None:
                    continue
                tested += 1
                if entry["exceeds"]:
                    better = (entry["mean"] > 0) == METRICS[metric][1]
                    better_count += better
                    hits.append(
                        f"{ARM_LABELS[arm]} on {split}: {METRICS[metric][0]} "
                        f"{entry['mean']:+.4g} vs CE ({'better' if better else 'worse'}; "
                        f"per seed {', '.join(f'{v:+.4g}' for v in entry['values'])})"
                    )
    if not hits:
        text = (
            f"No difference to CE exceeds the seed spread: none of {tested} comparisons (arms × "
            f"splits × metrics) passes a two-sided paired t-test at 5 % over {n} seeds. At this "
            "budget the arms cannot be told apart."
        )
    else:
        text = (
            f"{len(hits)} of {tested} comparisons to CE exceed the seed spread (two-sided paired "
            f"t-test at 5 % over {n} seeds): {better_count} better than CE, "
            f"{len(hits) - better_count} worse. About {0.05 * tested:.1f} would pass by chance "
            "alone, so treat isolated hits as noise until a longer run repeats them."
        )
    return text, hits


def _format_value(metric: str, value: float | None) -> str:
    if value is None:
        return "n/a"
    if metric in ("exact_accuracy", "within_1_percent", "unparseable_rate"):
        return f"{value:.3f}"
    if metric == "log_mae":
        return f"{value:.2f}"
    return f"{value:.3g}"


def _mean_std(metric: str, entry: dict[str, Any]) -> str:
    """``mean ± std``, and ``(2 of 3 seeds)`` where the metric is undefined on some seeds."""
    text = _format_value(metric, entry["mean"])
    if entry["std"] is not None:
        text += f" ± {_format_value(metric, entry['std'])}"
    values = entry.get("values") or []
    return text + seeds_note(len(finite(values)), len(values))


def _signed(metric: str, value: float | None) -> str:
    text = _format_value(metric, value)
    return text if value is None or value < 0 else "+" + text


def format_table(results: dict[str, Any], *, markdown: bool = False) -> str:
    """The results table: one block per split, one row per arm, mean ± std over seeds."""
    config = ExperimentConfig.from_dict(results["config"])
    header = ["split", "arm", *(METRICS[m][0] for m in METRICS)]
    rows = []
    for split in config.splits:
        for arm in config.arms:
            entry = results["summary"][split][arm]
            rows.append([split, ARM_LABELS[arm], *(_mean_std(m, entry[m]) for m in METRICS)])
    return table(header, rows, markdown=markdown)


def _differences_table(results: dict[str, Any], key: str, baseline: str) -> str:
    """Mean difference (\\* where it exceeds the seed spread), its 95 % interval and the
    differences per seed, of each arm in ``results[key]`` against ``baseline``."""
    header = ["split", f"arm − {baseline}", *(METRICS[m][0] for m in TESTED)]
    rows = []
    for split, arms in results[key].items():
        for arm, metrics in arms.items():
            cells = []
            for metric in TESTED:
                entry = metrics[metric]
                per_seed = ", ".join(_signed(metric, v) for v in entry["values"])
                mark = " **\\***" if entry["exceeds"] else ""
                interval = ""
                if entry["low"] is not None:
                    low, high = _signed(metric, entry["low"]), _signed(metric, entry["high"])
                    interval = f" [{low}, {high}]"
                cells.append(f"{_signed(metric, entry['mean'])}{mark}{interval} ({per_seed})")
            rows.append([split, ARM_LABELS[arm], *cells])
    return table(header, rows, markdown=True)


def overhead_lines(results: dict[str, Any]) -> list[str]:
    """One line per NTL arm: its step time relative to CE, measured in this run."""
    timing = results["timing"]
    lines = []
    for arm, entry in timing["arms"].items():
        if arm == "ce":
            continue
        lines.append(
            f"{ARM_LABELS[arm]} step time = {entry['ratio_to_ce']:.3f}× CE "
            f"(overhead {100 * (entry['ratio_to_ce'] - 1):+.1f} %): median "
            f"{1e3 * entry['median_seconds']:.1f} ms vs "
            f"{1e3 * timing['arms']['ce']['median_seconds']:.1f} ms over {timing['rounds']} "
            f"interleaved rounds (per-round ratios p20–p80 "
            f"{entry['ratio_p20']:.3f}–{entry['ratio_p80']:.3f}), batch {timing['batch_size']}, "
            f"{timing['device']}"
        )
    return lines


def _training_step_lines(results: dict[str, Any]) -> list[str]:
    config = ExperimentConfig.from_dict(results["config"])
    lines = []
    for arm in config.arms:
        times = [r["median_step_seconds"] for r in results["runs"] if r["arm"] == arm]
        lines.append(
            f"- {ARM_LABELS[arm]}: median step {1e3 * statistics.fmean(times):.1f} ms "
            f"(mean over seeds of each run's median)"
        )
    return lines


def _markdown(results: dict[str, Any]) -> str:
    config = ExperimentConfig.from_dict(results["config"])
    hardware = results["hardware"]
    lines = [
        f"# CE vs CE + λ·NTL on {config.task}",
        "",
        f"- date: {results['date']}",
        f"- command: `{results['command']}`" if results["command"] else "- command: (API call)",
        f"- hardware: {hardware['platform']}, {hardware['cpu_count']} CPU cores, "
        f"device {hardware['device']}{', ' + hardware['gpu'] if 'gpu' in hardware else ''}, "
        f"torch {hardware['torch']}, {results['workers']} worker process(es) × "
        f"{hardware['threads_per_worker']} thread(s)",
        f"- wall time of this invocation: {results['wall_seconds'] / 60:.1f} min (a resumed run "
        "counts only its own part); training + evaluation summed over all arms: "
        f"{sum(r['train_seconds'] + r['eval_seconds'] for r in results['runs']) / 60:.1f} min",
        f"- model: decoder-only transformer, {config.n_layers} layers, d={config.d_model}, "
        f"{config.n_heads} heads, RoPE, {results['model_parameters']:,} parameters, character "
        "tokens (digits 0-9 are the number tokens)",
        f"- training: {config.steps} steps × batch {config.batch_size} on "
        f"{config.train_questions:,} generated questions (easy/medium/hard thirds), AdamW lr "
        f"{config.learning_rate:g}, {config.warmup_steps} warm-up steps then cosine; loss on "
        "answer tokens",
        f"- arms: {', '.join(ARM_LABELS[a] for a in config.arms)}; {config.weights_text()}; "
        f"seeds {list(config.seeds)} (each seed: same initial weights and batches for every arm)",
        f"- evaluation: greedy decoding, last number of the answer, {config.eval_questions} "
        f"held-out questions per split, on the {config.evaluate_on} split(s): "
        f"{', '.join(config.splits)}",
        "",
        f"## Results (mean ± std over {len(config.seeds)} seeds)",
        "",
        format_table(results, markdown=True),
        "",
        "## Paired differences to CE (arm − CE; 95 % interval, per seed in brackets)",
        "",
        "\\* marks a difference that exceeds the seed spread (two-sided paired t-test, 5 %). "
        "Each seed draws its own evaluation questions (data.py), so the spread over seeds holds "
        "the test questions' own sampling noise too: no item bootstrap is needed beside it.",
        "",
        _differences_table(results, "paired_differences", "CE"),
        "",
        *(
            [
                "## Paired differences to NTL-WAS (arm − NTL-WAS, the same way)",
                "",
                _differences_table(results, "paired_vs_was", "NTL-WAS"),
                "",
            ]
            if results.get("paired_vs_was")
            else []
        ),
        "## Verdict",
        "",
        results["verdict"],
        "",
        *(f"- {hit}" for hit in results["verdict_hits"]),
        "",
        "## Cost",
        "",
        *(f"- {line}" for line in overhead_lines(results)),
        "",
        "Step times inside the training runs (arms ran in parallel processes on a possibly shared "
        "machine, so these are rougher than the interleaved measurement above):",
        "",
        *_training_step_lines(results),
        "",
        "## Curves",
        "",
        "![training loss, accuracy and error per arm](curves.png)",
        "",
        f"## Examples (seed {config.seeds[0]})",
        "",
    ]
    for split in config.splits:
        lines.append(f"**{SPLIT_LABELS[split]}**")
        lines.append("")
        lines.append(
            "| question | answer | " + " | ".join(ARM_LABELS[a] for a in config.arms) + " |"
        )
        lines.append("|---|---|" + "---|" * len(config.arms))
        runs = _by_seed(results["runs"])
        examples = {arm: runs[(config.seeds[0], arm)]["examples"][split] for arm in config.arms}
        for row in range(len(examples["ce"])):
            question, answer = examples["ce"][row][0], examples["ce"][row][1]
            predicted = [f"`{examples[a][row][2]}`" for a in config.arms]
            lines.append(f"| {question} | {answer} | " + " | ".join(predicted) + " |")
        lines.append("")
    return "\n".join(lines)


def _plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    config = ExperimentConfig.from_dict(results["config"])
    splits = config.splits
    figure, axes = plt.subplots(2, 2, figsize=(12, 8.5))

    curves = axes[0, 0]
    for arm in config.arms:
        runs = [r for r in results["runs"] if r["arm"] == arm]
        steps = [entry["step"] for entry in runs[0]["history"]]
        per_seed = [[entry["ce"] for entry in r["history"]] for r in runs]
        mean = [statistics.fmean(values) for values in zip(*per_seed, strict=True)]
        low = [min(values) for values in zip(*per_seed, strict=True)]
        high = [max(values) for values in zip(*per_seed, strict=True)]
        curves.plot(steps, mean, color=ARM_COLOURS[arm], label=ARM_LABELS[arm])
        curves.fill_between(steps, low, high, color=ARM_COLOURS[arm], alpha=0.2)
    curves.set(
        xlabel="step",
        ylabel="cross-entropy on answer tokens",
        yscale="log",
        title="training CE (mean over seeds, band: min–max)",
    )
    curves.legend()

    panels = [
        (axes[0, 1], "exact_accuracy", "exact-number accuracy", False),
        (axes[1, 0], "within_1_percent", "share within 1 % of the answer", False),
        (axes[1, 1], "median_absolute_error", "median absolute error", True),
    ]
    width = 0.8 / len(config.arms)
    for axis, metric, title, log_scale in panels:
        plotted: list[float] = []
        for index, arm in enumerate(config.arms):
            means, errors = [], []
            for split in splits:
                entry = results["summary"][split][arm][metric]
                means.append(entry["mean"] if entry["mean"] is not None else math.nan)
                errors.append(entry["std"] or 0.0)
            positions = [
                i + (index - (len(config.arms) - 1) / 2) * width for i in range(len(splits))
            ]
            plotted += means
            axis.bar(
                positions,
                means,
                width,
                yerr=errors,
                capsize=3,
                color=ARM_COLOURS[arm],
                label=ARM_LABELS[arm],
            )
        axis.set_xticks(range(len(splits)), splits)
        axis.set(title=f"{title} (mean ± std over seeds)")
        # A log axis needs a positive value: a run too short to answer any number has none.
        if log_scale and any(value > 0 for value in plotted):
            axis.set_yscale("log")
        axis.legend()
    figure.suptitle(
        f"{config.task}: {config.steps} steps, {config.weights_text()}, {len(config.seeds)} seeds"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_report(
    config: ExperimentConfig,
    runs: Sequence[dict[str, Any]],
    timing: dict[str, Any],
    run_dir: Path,
    *,
    command: str | None,
    wall_seconds: float,
    workers: int,
) -> dict[str, Any]:
    """Write ``results.json``, ``report.md`` and ``curves.png`` into ``run_dir``; return the
    results (as stored in results.json)."""
    summary, paired, paired_vs_was = _summarise(config, runs)
    verdict, hits = _verdict(config, paired)
    header = run_header(
        config,
        len(CharTokenizer()),
        command=command,
        wall_seconds=wall_seconds,
        workers=workers,
    )
    results = json_safe(
        {
            **header,
            "splits": list(config.splits),
            "summary": summary,
            "paired_differences": paired,
            "paired_vs_was": paired_vs_was,
            "verdict": verdict,
            "verdict_hits": hits,
            "timing": timing,
            "runs": list(runs),
        }
    )
    (run_dir / "results.json").write_text(json.dumps(results, indent=1))
    (run_dir / "report.md").write_text(_markdown(results))
    _plot(results, run_dir / "curves.png")
    return dict(results)
