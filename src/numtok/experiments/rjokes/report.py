"""Summaries of a finished rJokes run: ``results.json``, ``report.md`` and ``report.png``.

``results.json`` holds a flat table ``rows``, one row per (arm, readout, seed, split) with the
metrics as keys, ready for a data frame; ``summary`` (mean ± std over seeds per arm and
readout); ``comparisons``, paired differences seed by seed (:mod:`numtok.experiments.stats`) of
four kinds: ``ntl_vs_ce`` (each other token arm against CE under the same readout),
``vs_was`` (each token arm but CE against NTL-WAS, when it runs),
``readout_vs_greedy`` (each distribution readout against greedy decoding within an arm) and
``vs_head`` (every token arm and readout against the regression head); and the constant
predictions (training mean, median and mode) scored on the same jokes, for scale.

Each comparison of RMSE, MAE and Pearson's r carries, beside the paired-seed t interval, the seed
× item bootstrap interval (:mod:`numtok.experiments.bootstrap`: the evaluated jokes' own noise
too) and a verdict only where both exclude 0. The learnability check asks whether some trained
arm beats the best constant answer by more than the bootstrap standard error
(:func:`numtok.experiments.bootstrap.bootstrap_gate`): a run that learnt nothing
from the jokes gets no verdict. It reads the evaluated split (these runs score no validation split
beside it); it chooses nothing, it only withholds verdicts.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from numtok.experiments.bootstrap import (
    bootstrap_gate,
    both_intervals_verdict,
    resamples_of,
    seed_item_difference,
)
from numtok.experiments.item_metrics import answer_values
from numtok.experiments.objectives import ARM_LABELS
from numtok.experiments.report_format import ARM_COLOURS, json_safe, run_header, signed, table
from numtok.experiments.rjokes.config import RJokesConfig
from numtok.experiments.rjokes.evaluate import (
    REGRESSION_METRICS,
    TOKEN_READOUTS,
    readouts_of,
    regression_metrics,
)
from numtok.experiments.run_folder import arm_directory
from numtok.experiments.stats import (
    constant_answers,
    finite,
    paired_comparison,
    seeds_note,
    summarise,
)

__all__ = ["LABELS", "PUBLISHED", "constant_predictions", "summary_table", "write_report"]

LABELS = {**ARM_LABELS, "head": "regression head"}
#: The metrics the comparisons test (the unparseable rate is shown, not tested).
TESTED = ("rmse", "mae", "pearson", "spearman", "accuracy")
#: The metrics that also get the seed × item bootstrap (the others: the seed interval alone).
BOOTSTRAPPED = ("rmse", "mae", "pearson")
#: The dataset paper's regression baselines, trained on the full 550k-joke train split (not
#: available offline): rJokesData ``analysis/regression_results_base.csv``.
PUBLISHED = (
    "BERT-base Pearson 0.44–0.47, RMSE 1.63–1.88; RoBERTa-base Pearson 0.45–0.47, RMSE 1.64–1.88 "
    "(Weller and Seppi 2020, trained on the full 550k-joke train split)"
)
COMPARISON_TITLES = {
    "ntl_vs_ce": "Each arm against CE, same readout (arm − CE)",
    "vs_was": "Each other number loss against NTL-WAS, same readout (arm − NTL-WAS)",
    "readout_vs_greedy": "Distribution readouts against greedy decoding (readout − greedy)",
    "vs_head": "Token arms against the regression head (arm − head)",
}
_EXAMPLES = 5


def _pairs(config: RJokesConfig) -> list[tuple[str, str]]:
    """The (arm, readout) pairs of a run, in report order."""
    return [(arm, readout) for arm in config.arms for readout in readouts_of(arm)]


def _name(arm: str, readout: str) -> str:
    return LABELS[arm] if arm == "head" else f"{LABELS[arm]}, {readout}"


def _rows(config: RJokesConfig, runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for run in sorted(runs, key=lambda r: (config.arms.index(r["arm"]), r["seed"])):
        for readout, metrics in run["metrics"].items():
            distribution = readout in ("expected", "median")
            rows.append(
                {
                    "arm": run["arm"],
                    "readout": readout,
                    "seed": run["seed"],
                    "split": config.evaluate_on,
                    **metrics,
                    "mass": run["mass"] if distribution else None,
                    "pruned": run["pruned"] if distribution else None,
                }
            )
    return rows


def _values(
    runs: dict[tuple[int, str], dict[str, Any]],
    seeds: Sequence[int],
    arm: str,
    readout: str,
    metric: str,
) -> list[float | None]:
    return [runs[(seed, arm)]["metrics"][readout][metric] for seed in seeds]


def _comparisons(
    config: RJokesConfig, runs: dict[tuple[int, str], dict[str, Any]]
) -> list[dict[str, Any]]:
    """Paired comparisons ``(arm, readout) − (baseline arm, baseline readout)``."""
    token_arms = [arm for arm in config.arms if arm != "head"]
    wanted = [
        ("ntl_vs_ce", arm, readout, "ce", readout)
        for arm in token_arms
        if arm != "ce"
        for readout in TOKEN_READOUTS
    ]
    if "was" in config.arms:
        wanted += [
            ("vs_was", arm, readout, "was", readout)
            for arm in token_arms
            if arm not in ("ce", "was")
            for readout in TOKEN_READOUTS
        ]
    wanted += [
        ("readout_vs_greedy", arm, readout, arm, "greedy")
        for arm in token_arms
        for readout in TOKEN_READOUTS
        if readout != "greedy"
    ]
    if "head" in config.arms:
        wanted += [
            ("vs_head", arm, readout, "head", "head")
            for arm in token_arms
            for readout in TOKEN_READOUTS
        ]
    return [
        {
            "kind": kind,
            "arm": arm,
            "readout": readout,
            "baseline_arm": base_arm,
            "baseline_readout": base_readout,
            **{
                metric: paired_comparison(
                    _values(runs, config.seeds, arm, readout, metric),
                    _values(runs, config.seeds, base_arm, base_readout, metric),
                )
                for metric in TESTED
            },
        }
        for kind, arm, readout, base_arm, base_readout in wanted
    ]


Answers = dict[str, dict[str, Any]]


def _answers(config: RJokesConfig, run_dir: Path) -> tuple[Answers, Any]:
    """``(answers[arm][readout] (seeds, jokes), the true scores (jokes,))`` from every arm's
    ``predictions.json``."""
    stored = {
        (seed, arm): json.loads(
            (arm_directory(run_dir, seed, arm) / "predictions.json").read_text()
        )
        for seed in config.seeds
        for arm in config.arms
    }
    import numpy as np

    answers = {
        arm: {
            readout: np.stack(
                [answer_values(stored[(seed, arm)][readout]) for seed in config.seeds]
            )
            for readout in readouts_of(arm)
        }
        for arm in config.arms
    }
    scores = stored[(config.seeds[0], config.arms[0])]["scores"]
    return answers, answer_values(scores)


def _with_bootstrap(
    config: RJokesConfig, comparisons: list[dict[str, Any]], answers: Answers, truth: Any,
    *, verdicts: bool,
) -> None:  # fmt: skip
    """Add the seed × item bootstrap and the verdict (both intervals exclude 0, and the run
    learnt something) to the bootstrapped metrics of every comparison."""
    resamples = resamples_of(len(config.seeds), len(truth), config.evaluate_on)
    for comparison in comparisons:
        rows = answers[comparison["arm"]][comparison["readout"]]
        baseline = answers[comparison["baseline_arm"]][comparison["baseline_readout"]]
        for metric in BOOTSTRAPPED:
            entry = comparison[metric]
            entry["bootstrap"] = seed_item_difference(metric, rows, baseline, truth, resamples)
            entry["verdict"] = (
                both_intervals_verdict(metric, entry, entry["bootstrap"]) if verdicts else None
            )


def constant_predictions(train: Sequence[int], truth: Sequence[int]) -> dict[str, Any]:
    """The metrics of predicting one constant for every score of ``truth``: the ``train``
    scores' mean, median and mode (correlations are undefined for a constant)."""
    return {
        name: {"value": value, **regression_metrics([float(value)] * len(truth), truth)}
        for name, value in constant_answers(train).items()
    }


def _number(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.3f}"


def _mean_std(entry: dict[str, Any]) -> str:
    """``mean ± std``, and ``(2 of 3 seeds)`` where the metric is undefined on some seeds."""
    text = _number(entry["mean"])
    if entry["std"] is not None:
        text += f" ± {_number(entry['std'])}"
    values = entry.get("values") or []
    return text + seeds_note(len(finite(values)), len(values))


def _difference(entry: dict[str, Any]) -> str:
    """``+0.041 [−0.012, +0.094] {−0.030, +0.110}``: the paired-seed t interval, then (for the
    bootstrapped metrics) the seed × item bootstrap's; ``*`` when the difference exceeds the
    seed spread, **better**/**worse** when both intervals exclude 0 and the run learnt."""
    if entry["mean"] is None:
        return "n/a"
    text = signed(entry["mean"])
    if entry["low"] is not None:
        text += f" [{signed(entry['low'])}, {signed(entry['high'])}]"
    text += seeds_note(len(entry.get("values") or []), entry.get("seeds", 0))
    boot = entry.get("bootstrap")
    if boot is not None:
        interval = (
            "n/a" if boot["low"] is None else f"{signed(boot['low'])}, {signed(boot['high'])}"
        )
        text += f" {{{interval}}}"
    if entry.get("verdict"):
        return text + f" **{entry['verdict']}**"
    return text + (" **\\***" if entry["exceeds"] else "")


def _judgement(entry: dict[str, Any], metric: str) -> str:
    if entry["mean"] is None or entry["exceeds"] is None:
        return "n/a"
    if entry.get("verdict"):
        return str(entry["verdict"])
    if entry["exceeds"] and entry.get("bootstrap") is not None:
        return "beyond the seed spread, not beyond the jokes' noise"
    if not entry["exceeds"]:
        return "within the seed spread"
    return "better" if (entry["mean"] > 0) == REGRESSION_METRICS[metric][1] else "worse"


def summary_table(results: dict[str, Any], *, markdown: bool = True) -> str:
    """Mean ± std over seeds for every arm and readout, then the constant predictions."""
    config = RJokesConfig.from_dict(results["config"])
    header = ["arm", "readout", *(title for title, _ in REGRESSION_METRICS.values()), "mass"]
    rows = []
    for arm, readout in _pairs(config):
        entry = results["summary"][arm][readout]
        masses = [
            row["mass"]
            for row in results["rows"]
            if (row["arm"], row["readout"]) == (arm, readout) and row["mass"] is not None
        ]
        rows.append(
            [
                LABELS[arm],
                readout,
                *(_mean_std(entry[metric]) for metric in REGRESSION_METRICS),
                _number(statistics.fmean(masses)) if masses else "-",
            ]
        )
    for name, entry in results["constant_predictions"].items():
        rows.append(
            [
                f"constant: training {name} ({entry['value']:.3g})",
                "-",
                *(_number(entry[metric]) for metric in REGRESSION_METRICS),
                "-",
            ]
        )
    return table(header, rows, markdown=markdown)


def _comparison_table(results: dict[str, Any], kind: str) -> str:
    header = ["arm, readout", "against", *(REGRESSION_METRICS[m][0] for m in TESTED)]
    rows = [
        [
            _name(c["arm"], c["readout"]),
            _name(c["baseline_arm"], c["baseline_readout"]),
            *(_difference(c[m]) for m in TESTED),
        ]
        for c in results["comparisons"]
        if c["kind"] == kind
    ]
    return table(header, rows, markdown=True)


def verdict_lines(results: dict[str, Any]) -> list[str]:
    """Plain sentences from the comparisons: what NTL changes under each readout, and how far the
    best token readout is from the head (RMSE is what the head's loss aims at, MAE what the
    median readout and NTL-WAS aim at)."""
    if len(results["config"]["seeds"]) < 2:
        return ["With one seed the seed spread is unknown; run with --seeds 3 or more."]
    if not results["learnability"]["passed"]:
        return ["No verdict: no arm beat the best constant answer (learnability check)."]
    lines = []
    for comparison in results["comparisons"]:
        if comparison["kind"] == "readout_vs_greedy":
            continue
        parts = [
            f"{REGRESSION_METRICS[m][0]} {signed(entry['mean'])} ({_judgement(entry, m)})"
            for m in ("rmse", "mae", "pearson")
            if (entry := comparison[m])["mean"] is not None
        ]
        lines.append(
            f"{_name(comparison['arm'], comparison['readout'])} vs "
            f"{_name(comparison['baseline_arm'], comparison['baseline_readout'])}: "
            + ", ".join(parts)
        )
    return lines


def _settings_lines(results: dict[str, Any]) -> list[str]:
    config = RJokesConfig.from_dict(results["config"])
    data = results["data"]
    hw = results["hardware"]
    pruning = (
        f"prefixes below {config.min_probability:g} not extended (largest probability left out "
        f"of one joke's distribution: {results['largest_pruned']:.2g})"
        if config.min_probability > 0
        else "every prefix enumerated (exact)"
    )
    return [
        f"- date: {results['date']}",
        f"- command: `{results['command']}`" if results["command"] else "- command: (API call)",
        f"- hardware: {hw['platform']}, {hw['cpu_count']} CPU cores, device {hw['device']}, "
        f"torch {hw['torch']}, {results['workers']} worker process(es) × "
        f"{hw['threads_per_worker']} thread(s)",
        f"- wall time of this invocation: {results['wall_seconds'] / 60:.1f} min (a resumed run "
        "counts only its own part)",
        f"- data: {', '.join(data['files'])} (sha256 of their bytes {data['digest']}); "
        f"{data['train']:,} training jokes, {data['validation']:,} held out for validation; "
        f"evaluated on {data['evaluated']:,} jokes of the {config.evaluate_on} split",
        f"- model: decoder-only transformer, {config.n_layers} layers, d={config.d_model}, "
        f"{config.n_heads} heads, RoPE, {results['model_parameters']:,} parameters; word tokens "
        f"({config.vocabulary_words:,} most frequent training words + the ten digits), a joke "
        f"cut to {config.max_prompt_tokens} tokens, then `<answer>` and the score's digits",
        f"- training: {config.steps} steps × batch {config.batch_size}, AdamW lr "
        f"{config.learning_rate:g}, {config.warmup_steps} warm-up steps then cosine; token arms: "
        "loss on the answer tokens; head: squared error on the standardised score",
        f"- arms: {', '.join(LABELS[a] for a in config.arms)}; {config.weights_text()}; seeds "
        f"{list(config.seeds)} (each seed: same initial trunk and batches for every arm)",
        f"- readouts: greedy decoding (the paper's), and the mean (`expected`) and median of the "
        f"model's distribution over whole numbers of up to {config.max_digits} digits; {pruning}",
    ]


def _markdown(results: dict[str, Any]) -> str:
    config = RJokesConfig.from_dict(results["config"])
    lines = [
        "# CE vs CE + λ·NTL vs a regression head on rJokes",
        "",
        *_settings_lines(results),
        "",
        f"## Results on {config.evaluate_on} (mean ± std over {len(config.seeds)} seeds)",
        "",
        "`exact acc`: the share of jokes whose prediction rounds to the true score; `mass`: the "
        "probability the enumerated numbers cover (the rest went to words, longer numbers or "
        "pruning). For scale, the published baselines: " + PUBLISHED + ".",
        "",
        summary_table(results),
        "",
        *_learnability_lines(results["learnability"]),
        "",
        "## Paired differences",
        "",
        "The mean difference over seeds with its paired-seed 95 % interval in brackets (the "
        "seed-to-seed spread only; **\\*** marks a difference beyond it) and, for RMSE, MAE and "
        "Pearson, the seed × item bootstrap 95 % interval in braces (the evaluated jokes' own "
        "noise too). **better** / **worse**: both intervals exclude 0 and the run passed the "
        "learnability check. Lower is better for RMSE and MAE, higher for Pearson, Spearman and "
        "exact accuracy.",
        "",
    ]
    for kind, title in COMPARISON_TITLES.items():
        if any(c["kind"] == kind for c in results["comparisons"]):
            lines += [f"### {title}", "", _comparison_table(results, kind), ""]
    lines += [
        "## Verdict",
        "",
        *(f"- {line}" for line in verdict_lines(results)),
        "",
        "## Cost",
        "",
        *_cost_lines(results),
        "",
        "## Predictions",
        "",
        "![mean prediction per true score, and RMSE / Pearson per arm and readout](report.png)",
        "",
        f"Examples (seed {config.seeds[0]}, the first {_EXAMPLES} evaluated jokes):",
        "",
    ]
    first = {r["arm"]: r for r in results["runs"] if r["seed"] == config.seeds[0]}
    header = ["joke", "score", *(_name(arm, readout) for arm, readout in _pairs(config))]
    rows = []
    for index in range(_EXAMPLES):
        example = first[config.arms[0]]["examples"][index]
        cells = [example["joke"].replace("|", "/")[:60], str(example["score"])]
        for arm, readout in _pairs(config):
            value = first[arm]["examples"][index][readout]
            cells.append("-" if value is None else f"{value:.2f}")
        rows.append(cells)
    lines += [table(header, rows, markdown=True), ""]
    return "\n".join(lines)


def _learnability_lines(gate: dict[str, Any]) -> list[str]:
    best = gate["best"]
    constant = (
        f"the training {gate['constant']} ({gate['constant_value']:.3g}) for every joke, RMSE "
        f"{_number(gate['constant_metric'])}"
    )
    closest = f"{_name(best['arm'], best['readout'])}: {_number(best['improvement'])} better" + (
        f" (bootstrap standard error {_number(best['se'])})" if best["se"] is not None else ""
    )
    if gate["passed"]:
        verdict = f"**Passed**: the best constant answer is {constant}; {closest}."
    else:
        verdict = (
            f"**Failed: no arm learnt from the jokes at this budget, so no verdict is given on "
            f"any loss.** No arm beats the best constant answer, {constant}, by more than the "
            f"standard error of the difference; closest {closest}."
        )
    lines = ["## Learnability check", "", verdict, "", "RMSE below the best constant "
             "(positive: better than answering it to every joke):", ""]  # fmt: skip
    rows = [
        [_name(e["arm"], e["readout"]), _number(e["improvement"]), _number(e["se"]),
         "yes" if e["passes"] else "no"]
        for e in gate["arms"]
    ]  # fmt: skip
    return [*lines, table(["arm, readout", "improvement", "bootstrap SE", "beyond it"], rows,
                          markdown=True)]  # fmt: skip


def _cost_lines(results: dict[str, Any]) -> list[str]:
    timing = results["timing"]
    lines = []
    ce_ms = 1e3 * timing["arms"]["ce"]["median_seconds"]
    for arm, entry in timing["arms"].items():
        if arm == "ce":
            continue
        lines.append(
            f"- {LABELS[arm]}: a training step takes {entry['ratio_to_ce']:.3f}× CE's (median "
            f"{1e3 * entry['median_seconds']:.1f} ms vs {ce_ms:.1f} ms "
            f"over {timing['rounds']} interleaved rounds, the run's last job, perhaps beside "
            f"another arm's training; per-round ratios p20–p80 "
            f"{entry['ratio_p20']:.3f}–{entry['ratio_p80']:.3f})"
        )
    for arm in results["config"]["arms"]:
        runs = [r for r in results["runs"] if r["arm"] == arm]
        minutes = statistics.fmean(r["train_seconds"] for r in runs) / 60
        lines.append(
            f"- {LABELS[arm]}: training {minutes:.1f} min, scoring "
            f"{statistics.fmean(r['eval_seconds'] for r in runs):.0f} s per seed"
        )
    return lines


def _plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    config = RJokesConfig.from_dict(results["config"])
    token_arms = [arm for arm in config.arms if arm != "head"]
    figure, axes = plt.subplots(2, 3, figsize=(15, 9))

    def by_score(arm: str, readout: str) -> tuple[list[int], list[float]]:
        """The mean prediction per true score, averaged over seeds."""
        tables = [r["by_score"][readout] for r in results["runs"] if r["arm"] == arm]
        scores = sorted({int(s) for t in tables for s in t}, key=int)
        means = [statistics.fmean(t[str(s)] for t in tables if str(s) in t) for s in scores]
        return scores, means

    for axis, readout in zip(axes[0], TOKEN_READOUTS, strict=True):
        top = max(int(s) for r in results["runs"] for t in r["by_score"].values() for s in t)
        axis.plot([0, top], [0, top], color="black", linewidth=0.8, linestyle=":")
        for arm in token_arms:
            axis.plot(
                *by_score(arm, readout), marker="o", color=ARM_COLOURS[arm], label=LABELS[arm]
            )
        if "head" in config.arms:
            axis.plot(
                *by_score("head", "head"), marker="s", color=ARM_COLOURS["head"], label="head"
            )
        axis.set(
            title=f"{readout}: mean prediction per true score",
            xlabel="true score",
            ylabel="mean prediction",
        )
        axis.legend(fontsize=8)

    pairs = _pairs(config)
    names = [_name(arm, readout) for arm, readout in pairs]
    for axis, metric in zip(axes[1], ("rmse", "mae", "pearson"), strict=True):
        for index, (arm, readout) in enumerate(pairs):
            entry = results["summary"][arm][readout][metric]
            colour = ARM_COLOURS[arm]
            if entry["mean"] is not None:
                axis.bar(index, entry["mean"], yerr=entry["std"] or 0.0, color=colour, capsize=3)
            seeds = [v for v in entry["values"] if v is not None]
            axis.scatter([index] * len(seeds), seeds, color="black", s=8, zorder=3)
        axis.set_xticks(range(len(pairs)), names, rotation=70, ha="right", fontsize=7)
        axis.set(title=f"{REGRESSION_METRICS[metric][0]} (mean ± std; dots: seeds)")
    figure.suptitle(
        f"rJokes, {config.evaluate_on} split: {config.steps} steps, {config.weights_text()}, "
        f"{len(config.seeds)} seeds"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def write_report(
    config: RJokesConfig,
    runs: Sequence[dict[str, Any]],
    timing: dict[str, Any],
    run_dir: Path,
    *,
    data: dict[str, Any],
    constants: dict[str, Any],
    vocabulary_size: int,
    command: str | None,
    wall_seconds: float,
    workers: int,
) -> dict[str, Any]:
    """Write ``results.json``, ``report.md`` and ``report.png`` into ``run_dir``; return the
    results (as stored in results.json)."""
    by_seed = {(r["seed"], r["arm"]): r for r in runs}
    pruned = [r["pruned"] for r in runs if r["pruned"] is not None]
    answers, truth = _answers(config, run_dir)
    learnability = bootstrap_gate(
        answers, {name: entry["value"] for name, entry in constants.items()}, truth,
        len(config.seeds), "rmse",
    )  # fmt: skip
    comparisons = _comparisons(config, by_seed)
    _with_bootstrap(config, comparisons, answers, truth, verdicts=learnability["passed"])
    header = run_header(
        config, vocabulary_size, command=command, wall_seconds=wall_seconds, workers=workers
    )
    results = json_safe(
        {
            **header,
            "data": data,
            "rows": _rows(config, runs),
            "summary": {
                arm: {
                    readout: {
                        metric: summarise(_values(by_seed, config.seeds, arm, readout, metric))
                        for metric in REGRESSION_METRICS
                    }
                    for readout in readouts_of(arm)
                }
                for arm in config.arms
            },
            "comparisons": comparisons,
            "learnability": learnability,
            "constant_predictions": constants,
            "largest_pruned": max(pruned, default=0.0),
            "timing": timing,
            "runs": list(runs),
        }
    )
    (run_dir / "results.json").write_text(json.dumps(results, indent=1))
    (run_dir / "report.md").write_text(_markdown(results))
    _plot(results, run_dir / "report.png")
    return dict(results)
