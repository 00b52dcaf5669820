"""The report of a fine-tuning comparison: ``results.json`` (every setting, every seed's answer
to every item, every metric and comparison; ``null`` where a value is undefined), ``report.md``
and ``report.png`` in the run folder.

``report.md`` opens with what a reader needs first: the pre-registration (when there is one)
and the primary endpoint, then the learnability gate — when it fails, the report says the task
was not learnt at this budget and gives no verdict on any loss — then the λ chosen on
validation, and per split every arm's metrics (every seed shown), the constant answers, and the
paired differences from CE with the paired-seed t interval, the seed × item bootstrap interval,
the bootstrap's minimal detectable effect (MDE) and the verdict
(:mod:`~numtok.experiments.analysis`).
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from numtok.experiments.analysis import (
    BOOTSTRAP_REPLICATES,
    comparisons,
    learnability_gate,
    metric_table,
)
from numtok.experiments.finetune.config import FinetuneConfig
from numtok.experiments.finetune.data import FinetuneData
from numtok.experiments.finetune.preregistration import git_provenance
from numtok.experiments.item_metrics import (
    HIGHER_IS_BETTER,
    ITEM_METRICS,
    answer_values,
    item_metrics,
)
from numtok.experiments.objectives import NUMBER_LOSS_ARMS
from numtok.experiments.report_format import json_safe, signed
from numtok.readout.distribution import FAST_TOLERANCE

__all__ = ["write_report"]

#: The metrics of the tables (``parsed_share`` is in results.json).
SHOWN_METRICS = tuple(m for m in ITEM_METRICS if m != "parsed_share")


def _answers(
    config: FinetuneConfig,
    validation: Mapping[tuple[int, str, float], dict[str, Any]],
    chosen: Mapping[str, float],
    test: Mapping[tuple[int, str], dict[str, Any]],
) -> dict[str, dict[str, dict[str, NDArray[np.float64]]]]:
    """``answers[split][arm][readout]``: (seeds, items), one row for ``base``; the test splits
    when they were scored."""
    answers: dict[str, dict[str, dict[str, NDArray[np.float64]]]] = {}
    for split in ("validation", *(config.evaluation_splits if test else ())):
        answers[split] = {}
        for arm in config.arms:
            seeds = config.seeds[:1] if arm == "base" else config.seeds
            if split == "validation":
                stored = [validation[(seed, arm, chosen[arm])]["answers"] for seed in seeds]
            else:
                stored = [test[(seed, arm)]["splits"][split]["answers"] for seed in seeds]
            answers[split][arm] = {
                readout: np.stack([answer_values(entry[readout]) for entry in stored])
                for readout in stored[0]
            }
    return answers


def _number(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _interval(low: float | None, high: float | None) -> str:
    return "n/a" if low is None or high is None else f"[{signed(low)}, {signed(high)}]"


def _difference_cells(entry: dict[str, Any]) -> list[str]:
    boot = entry["bootstrap"]
    verdict = entry["verdict"] or "–"
    return [
        signed(entry["mean"]),
        _interval(entry["seed"]["low"], entry["seed"]["high"]),
        _interval(boot["low"], boot["high"]),
        _number(boot["mde"]),
        f"**{verdict}**" if entry["verdict"] else verdict,
    ]


def _primary_lines(
    config: FinetuneConfig,
    entries: Sequence[dict[str, Any]],
    arms: Sequence[str],
    gate: bool,
    tested: bool,
) -> list[str]:
    split, metric, readout = config.evaluation_splits[0], config.metric, config.readout
    lines = ["## Primary endpoint", ""]
    if not tested:
        lines += [
            "**Not measured: the test splits were not scored** (a validation-only run, for "
            "choosing settings). The same differences on validation, which chose them, claim "
            "nothing:",
            "",
        ]
        split = "validation"
    lines += [
        f"{metric} of the {readout} readout on {split}, each arm minus CE (paired by seed; "
        f"{len(config.seeds)} seeds). Verdict only when both 95 % intervals exclude 0"
        + ("" if gate else "; **none here: the learnability gate failed**")
        + ".",
        "",
        "| arm − CE | Δ | seed t 95 % | seed × item bootstrap 95 % | MDE | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for arm in arms:
        found = [
            e for e in entries
            if (e["split"], e["arm"], e["readout"], e["baseline"], e["metric"])
            == (split, arm, readout, readout, metric)
        ]  # fmt: skip
        if found:
            lines.append(f"| {arm} | " + " | ".join(_difference_cells(found[0])) + " |")
    return lines


def _gate_lines(gate: dict[str, Any]) -> list[str]:
    best = gate["best"]
    constant = (
        f"answering the training {gate['constant']} ({gate['constant_value']:.4g}) to every "
        f"example: {gate['metric']} {_number(gate['constant_metric'])}"
    )
    lines = ["## Learnability gate (validation)", ""]
    if gate["passed"]:
        lines.append(
            f"**Passed.** The best constant is {constant}; {best['arm']} ({best['readout']}) "
            f"beats it by {_number(best['improvement'])} (bootstrap standard error "
            f"{_number(best['se'])})."
        )
    else:
        lines.append(
            f"**Failed: the task was not learnt at this budget, so this report gives no verdict "
            f"on any loss.** No trained arm beats the best constant, {constant}, by more than "
            "the standard error of the difference"
            + (
                f" (closest: {best['arm']} ({best['readout']}), {signed(best['improvement'])} "
                f"± {_number(best['se'])})."
                if best
                else "."
            )
        )
    lines += ["", "| arm | readout | improvement over the constant | bootstrap SE | passes |",
              "|---|---|---|---|---|"]  # fmt: skip
    for entry in gate["arms"]:
        lines.append(
            f"| {entry['arm']} | {entry['readout']} | {signed(entry['improvement'])} | "
            f"{_number(entry['se'])} | {'yes' if entry['passes'] else 'no'} |"
        )
    return lines


def _best_constant(constants: dict[str, dict[str, Any]], metric: str) -> float | None:
    scores = [float(c["metrics"][metric]) for c in constants.values()
              if c["metrics"][metric] is not None]  # fmt: skip
    if not scores:
        return None
    return max(scores) if metric in HIGHER_IS_BETTER else min(scores)


def _split_lines(
    split: str,
    table: Sequence[dict[str, Any]],
    entries: Sequence[dict[str, Any]],
    constants: dict[str, dict[str, Any]],
    metric_of_run: str,
) -> list[str]:
    best = _best_constant(constants, metric_of_run)
    lines = [f"## {split}", "", "Mean ± std over seeds, every seed in brackets; the last column: "
             f"whether the mean {metric_of_run} beats every constant answer's "
             f"({_number(best)}, table below).", "",
             "| arm | readout | " + " | ".join(SHOWN_METRICS) + " | beats the constants |",
             "|---|---|" + "---|" * (len(SHOWN_METRICS) + 1)]  # fmt: skip
    rows = list(dict.fromkeys((e["arm"], e["readout"]) for e in table if e["split"] == split))
    for arm, readout in rows:
        cells = []
        for metric in SHOWN_METRICS:
            entry = next(e for e in table if (e["split"], e["arm"], e["readout"], e["metric"])
                         == (split, arm, readout, metric))  # fmt: skip
            text = _number(entry["mean"])
            if entry["std"] is not None:
                text += f" ± {_number(entry['std'])}"
            if arm != "base":
                text += " [" + ", ".join(_number(v) for v in entry["values"]) + "]"
            cells.append(text)
        mean = next(e["mean"] for e in table if (e["split"], e["arm"], e["readout"], e["metric"])
                    == (split, arm, readout, metric_of_run))  # fmt: skip
        beats = "n/a"
        if mean is not None and best is not None:
            beats = "yes" if (mean > best) == (metric_of_run in HIGHER_IS_BETTER) else "no"
        lines.append(f"| {arm} | {readout} | " + " | ".join(cells) + f" | {beats} |")
    lines += ["", "Constant answers (the training answers' statistic, the same for every "
              "example): an arm that does not beat them learnt nothing from the prompts.", "",
              "| constant | value | " + " | ".join(SHOWN_METRICS) + " |",
              "|---|---|" + "---|" * len(SHOWN_METRICS)]  # fmt: skip
    for name, scored in constants.items():
        cells = [_number(scored["metrics"][m]) for m in SHOWN_METRICS]
        lines.append(f"| training {name} | {scored['value']:.4g} | " + " | ".join(cells) + " |")
    lines += ["", "Paired differences from CE (arm − CE; MDE: the bootstrap's minimal "
              "detectable effect at 80 % power).", "",
              "| arm | readout | vs CE | metric | Δ | seed t 95 % | bootstrap 95 % | MDE | "
              "verdict |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for entry in entries:
        if entry["split"] == split and entry["metric"] in SHOWN_METRICS:
            lines.append(
                f"| {entry['arm']} | {entry['readout']} | CE {entry['baseline']} | "
                f"{entry['metric']} | " + " | ".join(_difference_cells(entry)) + " |"
            )
    return lines


def _preregistration_lines(
    preregistered: tuple[Path, dict[str, Any]] | None, started: float
) -> list[str]:
    if preregistered is None:
        return ["Not pre-registered (`--preregister FILE`): read every difference as "
                "exploratory.", ""]  # fmt: skip
    path, record = preregistered
    provenance = git_provenance(path)
    began = datetime.datetime.fromtimestamp(started, datetime.timezone.utc)
    if provenance["committed"] is None:
        status = "**not committed in git as it is**: it does not prove it came before the run"
    else:
        committed = datetime.datetime.fromisoformat(provenance["committed"])
        before = committed <= began
        status = (
            f"committed in {provenance['commit'][:12]} at {provenance['committed']}, "
            + ("before" if before else "**after**")
            + f" the run began ({began.isoformat(timespec='seconds')})"
        )
    return [
        f"**Pre-registered** in `{path.name}` (sha256 {provenance['sha256'][:16]}), {status}; "
        "the run's settings, data and model match it.",
        "",
        f"Hypothesis: {record['hypothesis']}",
        "",
    ]


def _constants(
    constants: Mapping[str, float], references: Mapping[str, NDArray[np.float64]]
) -> dict[str, dict[str, dict[str, Any]]]:
    return {
        split: {
            name: {"value": value,
                   "metrics": item_metrics(np.full_like(truth, value), truth)}
            for name, value in constants.items()
        }
        for split, truth in references.items()
    }  # fmt: skip


def _plot(config: FinetuneConfig, splits: Sequence[str], table: Sequence[dict[str, Any]],
          constants: dict[str, dict[str, dict[str, Any]]], path: Path) -> None:  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(splits), figsize=(4.2 * len(splits), 3.4), squeeze=False)
    for axis, split in zip(axes[0], splits, strict=True):
        chosen = [e for e in table if e["split"] == split and e["metric"] == config.metric]
        for index, entry in enumerate(chosen):
            if entry["mean"] is not None:
                axis.bar(index, entry["mean"], color="#9ecae1")
            values = [v for v in entry["values"] if v is not None and math.isfinite(v)]
            axis.plot([index] * len(values), values, "k.", markersize=4)
        scores = [c["metrics"][config.metric] for c in constants[split].values()]
        finite = [s for s in scores if s is not None]
        if finite:
            best = max(finite) if config.metric in HIGHER_IS_BETTER else min(finite)
            axis.axhline(best, color="#d62728", linestyle="--", linewidth=1)
        axis.set_xticks(range(len(chosen)))
        axis.set_xticklabels([f"{e['arm']}\n{e['readout']}" for e in chosen], fontsize=7,
                             rotation=45)  # fmt: skip
        axis.set_title(f"{split}: {config.metric} (dashed: best constant)", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_report(
    run_dir: Path,
    config: FinetuneConfig,
    data: FinetuneData,
    validation: Mapping[tuple[int, str, float], dict[str, Any]],
    choice: dict[str, Any],
    test: Mapping[tuple[int, str], dict[str, Any]],
    *,
    constants: Mapping[str, float],
    preregistered: tuple[Path, dict[str, Any]] | None,
    started: float,
) -> dict[str, Any]:
    """Write ``results.json``, ``report.md`` and ``report.png`` into ``run_dir``; return the
    results (as ``results.json`` holds them)."""
    answers = _answers(config, validation, choice["chosen"], test)
    references = {split: answer_values([e.value for e in data.splits[split]]) for split in answers}
    seeds = len(config.seeds)
    trained = {arm: by_readout for arm, by_readout in answers["validation"].items()
               if arm != "base"}  # fmt: skip
    gate = learnability_gate(trained, constants, references["validation"], seeds, config.metric)
    table = metric_table(answers, references, seeds)
    entries = comparisons(answers, references, seeds, verdicts=gate["passed"])
    scored_constants = _constants(constants, references)
    minutes = sum(r["train_minutes"] + r["score_minutes"] for r in validation.values())
    minutes += sum(r["score_minutes"] for r in test.values())
    scores = [*validation.values(), *(s for r in test.values() for s in r["splits"].values())]
    unexplored = [u for scored in scores for u in scored.get("unexplored", [])]
    largest_unexplored = max(unexplored) if unexplored else None
    results = json_safe({
        "config": config.to_dict(),
        "data": {"notes": data.notes, "digest": data.digest,
                 "sizes": {s: len(e) for s, e in data.splits.items()}},
        "preregistration": None if preregistered is None else str(preregistered[0]),
        "choice": choice,
        "gate": gate,
        "metrics": table,
        "comparisons": entries,
        "constants": scored_constants,
        "bootstrap_replicates": BOOTSTRAP_REPLICATES,
        "references": {split: truth for split, truth in references.items()},
        "answers": {split: {arm: {r: rows for r, rows in by_readout.items()}
                            for arm, by_readout in by_arm.items()}
                    for split, by_arm in answers.items()},
        "runs": [
            {"seed": seed, "arm": arm, "weight": weight, "history": r["history"],
             "seconds_per_step": r["seconds_per_step"], "train_minutes": r["train_minutes"],
             "validation_minutes": r["score_minutes"]}
            for (seed, arm, weight), r in validation.items()
        ],
        "test_minutes": {f"seed{seed}/{arm}": r["score_minutes"]
                         for (seed, arm), r in test.items()},
        "minutes": minutes,
        "largest_unexplored": largest_unexplored,
    })  # fmt: skip
    (run_dir / "results.json").write_text(json.dumps(results, indent=1, allow_nan=False))
    lines = [f"# Fine-tuning {config.model} on {config.task}", ""]
    lines += _preregistration_lines(preregistered, started)
    compared_arms = [arm for arm in config.arms if arm != "ce"]
    if preregistered is not None:  # the registered arm alone is primary
        compared_arms = [preregistered[1]["primary_endpoint"]["difference"].split(" ")[0]]
    lines += _primary_lines(config, entries, compared_arms, gate["passed"], bool(test))
    lines += ["", *_gate_lines(gate), ""]
    lines += _settings_lines(config, data, choice, minutes, largest_unexplored)
    for split in (*(s for s in config.evaluation_splits if s in answers), "validation"):
        lines += ["", *_split_lines(split, table, entries, scored_constants[split], config.metric)]
    (run_dir / "report.md").write_text("\n".join(lines) + "\n")
    _plot(config, list(answers), table, scored_constants, run_dir / "report.png")
    loaded: dict[str, Any] = json.loads((run_dir / "results.json").read_text())
    return loaded


def _settings_lines(
    config: FinetuneConfig,
    data: FinetuneData,
    choice: dict[str, Any],
    minutes: float,
    largest_unexplored: float | None,
) -> list[str]:
    weights = ", ".join(
        f"{arm} {w:g}" for arm, w in choice["chosen"].items() if arm in NUMBER_LOSS_ARMS
    )
    lines = [
        "## Settings",
        "",
        f"Seeds {list(config.seeds)}; {config.adaptation} fine-tuning, {config.steps} steps × "
        f"{config.batch_size} examples, learning rate {config.learning_rate:g}; λ: "
        f"{weights or 'none'}. Data: " + "; ".join(data.notes or ["generated"]) + ". "
        f"{minutes:.1f} minutes of training and scoring. Intervals: the paired-seed t interval "
        f"({len(config.seeds) - 1} degrees of freedom) and the seed × item bootstrap "
        f"({BOOTSTRAP_REPLICATES} replicates). Many comparisons at the 5 % level: a few verdicts "
        "may come from chance; the primary endpoint is the one the run was made for.",
    ]
    if largest_unexplored is not None:
        lines[-1] += (
            f" The distribution readouts left at most {largest_unexplored:.2g} of an item's "
            f"probability unexplored (tolerance {FAST_TOLERANCE:g} of its number mass); its mean "
            "moves by at most unexplored / (covered + unexplored) of the range 0.."
            f"{config.max_value}."
        )
    if choice["means"]:
        lines += ["", f"λ chosen on validation (mean {config.metric} of the {config.readout} "
                  "readout over the seeds; ties to the smaller λ):", "",
                  "| arm | " + " | ".join(f"λ={w}" for w in next(iter(choice['means'].values())))
                  + " | chosen |",
                  "|---|" + "---|" * (len(next(iter(choice["means"].values()))) + 1)]  # fmt: skip
        for arm, means in choice["means"].items():
            lines.append(
                f"| {arm} | "
                + " | ".join(_number(m, 4) for m in means.values())
                + f" | {choice['chosen'][arm]:g} |"
            )
    return lines
