"""The one report of every comparison: ``results.json`` (the run's rows — every setting, every
seed's answer to every item — and the analysis of them; ``null`` where a value is undefined),
``report.md`` and ``report.png`` in the run folder, written from the rows alone
(:func:`analyse_and_write`), so that a run's report can be rebuilt from its rows by a later
version (``numtok compare --reanalyse``). What the harness ran is the rows'
:class:`~numtok_compare.design.Design`.

``report.md`` opens with what a reader needs first: the pre-registration (when there is one)
and the primary endpoint, then the learnability gate — which arms, by which readout, beat the
best constant answer on validation; a comparison of an arm that did not gets no verdict, and the
gate says "not shown at this budget" with the closest arm's improvement, its interval and the
smallest improvement the run could have shown — then the λ chosen on validation, and per split
every arm's metrics (every seed shown, the parsed share beside them), the constant answers, and
the differences from CE, each with one interval (the crossed seed × item analysis, or where each
seed drew its own items, the paired-seed t over the seeds' means), its minimal
detectable effect (MDE), the parsed shares and the verdict read from that interval
(:mod:`~numtok_compare.analysis`). Every error metric scores an unparsed answer as the
training answers' median; exact accuracy counts it wrong. One seed gives no interval and no
verdict, and the report says so.
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from numtok.readout import FAST_TOLERANCE
from numtok_compare.analysis import Draws, comparisons, learnability_gate, metric_table
from numtok_compare.design import Design
from numtok_compare.item_metrics import (
    HIGHER_IS_BETTER,
    ITEM_METRICS,
    answer_values,
    item_metrics,
    per_item_metric,
)
from numtok_compare.planning import planning
from numtok_compare.provenance import git_provenance, registered_arm
from numtok_compare.readout_error import DRAWS_SHARE_TARGET
from numtok_compare.report_format import json_safe, needed, signed

__all__ = [
    "analyse_and_write",
    "read_rows",
    "reanalyse",
    "registration_of",
]


#: What one seed gets instead of an interval.
ONE_SEED = (
    "**One seed cannot give a verdict**: the seed-to-seed variance cannot be estimated from one "
    "seed, so no difference has an interval (run at least 2 seeds; 3 or more for useful power)."
)


def _number(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _interval(low: float | None, high: float | None) -> str:
    return "n/a" if low is None or high is None else f"[{signed(low)}, {signed(high)}]"


def _readout_error(entry: Mapping[str, Any]) -> str:
    """After an interval, the readouts' own error: `` ±b``, how far their pruning could move its
    estimate (rows that keep the readouts' bounds), and `` (x % draws)``, the share of its
    variance their draws make up (rows of a sampled readout); nothing for older rows."""
    text = ""
    if "readout_bound" in entry:
        bound = entry["readout_bound"]
        text += " ±unbounded" if bound is None else f" ±{bound:.2g}"
    if "draws_share" in entry:
        share = entry["draws_share"]
        text += " (draws: n/a)" if share is None else f" ({100 * share:.0f} % draws)"
    return text


#: After a verdict that the readouts' bound could change, and one that the exact readout could
#: give otherwise than the draws.
_COULD_FLIP = " (could flip within the readout's ±)"
_COULD_DIFFER = " (the exact readout could differ)"


def _flip_mark(entry: Mapping[str, Any]) -> str:
    """The mark after a verdict or gate decision that the readouts' own error could change."""
    if entry.get("could_flip"):
        return _COULD_FLIP
    return _COULD_DIFFER if entry.get("draws_could_flip") else ""


def _verdict_cell(entry: dict[str, Any]) -> str:
    verdict = entry["verdict"]
    flip = _flip_mark(entry) if verdict != "no verdict" else ""
    if verdict in ("better", "worse"):
        return f"**{verdict}**{flip}"
    return f"no verdict: {entry['reason']}" if verdict == "no verdict" else verdict + flip


def _difference_cells(entry: dict[str, Any]) -> list[str]:
    parsed = entry["parsed_share"]
    return [
        signed(entry["difference"]),
        _interval(entry["low"], entry["high"]) + _readout_error(entry),
        _number(entry["df"], 1),
        _number(entry["mde"]),
        f"{_number(parsed['arm'])} / {_number(parsed['baseline'])}",
        _verdict_cell(entry),
    ]


#: The header of a table of differences after its first columns.
DIFFERENCE_HEADER = "Δ | 95 % interval | df | MDE | parsed, arm / baseline | verdict |"


def _baseline_name(entry: Mapping[str, Any]) -> str:
    """``CE greedy`` (CE by a readout) or ``head`` (the regression head)."""
    if entry["baseline_arm"] == "ce":
        return f"CE {entry['baseline']}"
    return str(entry["baseline_arm"])


#: The minimal detectable effect, as the reports define it: the t formula's nominal power, and
#: the power the interval read has at it (docs/statistics.md: simulated for the crossed
#: interval, the noncentral t for the paired-seed one).
_MDE_WORDS = (
    "MDE: (t(0.975, ν) + t(0.8, ν))·SE, nominally found with 80 % power; with few seeds less "
    "often (at 3 seeds 62–71 % by the crossed interval, simulated, and 77 % by the paired-seed "
    "t; docs/statistics.md)"
)

#: Above the validation split's tables: the split that chose the settings claims nothing.
_EXPLORATORY = (
    "**Exploratory.** Validation ran the learnability gate and chose λ where the run chose it, "
    "and a run's budget is set on it: its differences and verdicts below describe the data that "
    "chose the settings and claim nothing. The test splits' are the results."
)

#: How the differences are analysed, in the report's words: the crossed design (every seed
#: answers the same items) and items nested in seeds (each seed drew its own).
_ANALYSIS_WORDS = {
    False: {"pairing": "seed and item", "analysis": "the crossed seed × item analysis",
            "df": "Satterthwaite's", "gate": "crossed",
            "interval": "the generalized interval of the crossed seed × item design"},
    True: {"pairing": "seed", "analysis": "the paired-seed t over the means of each seed's own "
           "items", "df": "S − 1",
           "gate": "paired-seed", "interval": "the paired-seed t interval over the seeds' means "
           "(each seed drew its own items)"},
}  # fmt: skip


def _metric_name(metric: str) -> str:
    tested = per_item_metric(metric)
    return metric if tested == metric else f"{tested} (the test of {metric})"


def _primary_lines(
    design: Design,
    entries: Sequence[dict[str, Any]],
    arms: Sequence[str],
    tested: bool,
    nested: bool,
    registered: bool,
) -> list[str]:
    """The primary section: each of ``arms`` minus CE and, with a regression head in the run,
    each token arm's readout minus the head (the paper's regression claim). A registered run
    shows the registered arm's two differences; otherwise the head's own against CE and CE's
    against the head are shown too."""
    split, readout = design.splits[0], design.readout
    metric = per_item_metric(design.metric)
    lines = ["## Primary endpoint", ""]
    if len(design.seeds) == 1:
        lines += [ONE_SEED, ""]
    if not tested:
        lines += [
            "**Not measured: the test splits were not scored** (a validation-only run, for "
            "choosing settings). The same differences on validation, which chose them, claim "
            "nothing:",
            "",
        ]
        split = "validation"
    against = {"ce": "CE", "head": "the head"}.get(design.equivalence_baseline or "", "")
    equivalence = "" if design.margin is None else (
        f" Equivalence within ±{design.margin:g} ({metric}) of each arm − {against} (the "
        "comparisons the margin was set for; no other is called equivalent): two one-sided "
        "tests at 5 %, the "
        "90 % interval inside the margin (\"equivalent\"), outside it (\"different\") or across "
        "it (\"undecided\"), under the same gate."
    )  # fmt: skip
    words = _ANALYSIS_WORDS[nested]
    lines += [
        f"{_metric_name(design.metric)} of the {readout} readout on {split}, each arm minus CE, "
        f"paired by {words['pairing']} ({len(design.seeds)} seeds). One 95 % interval per "
        f"difference, {words['analysis']} (df: {words['df']}; {_MDE_WORDS}); the verdict is "
        "read from that interval alone, and "
        f"only where both arms learnt on validation (the gate below).{equivalence}",
        "",
    ]
    has_head = "head" in design.arms
    against_ce = [((arm, readout), ("ce", readout)) for arm in arms if arm != "head"]
    if has_head and not registered:  # the head's own readout against CE's
        against_ce.append((("head", "head"), ("ce", readout)))
    margins = {baseline: design.margin if baseline == design.equivalence_baseline else None
               for baseline in ("ce", "head")}  # fmt: skip
    lines += _primary_table("arm − CE", against_ce, entries, split, metric, margins["ce"])
    if has_head and readout != "head":  # the regression claim
        against_head = [((arm, readout), ("head", "head"))
                        for arm in (arms if registered else ("ce", *arms))
                        if arm not in ("head", "base")]  # fmt: skip
        lines += ["", f"Each token arm's {readout} readout against the regression head (the "
                  "paper's claim that a token head trained with NTL matches a regression head):",
                  ""]  # fmt: skip
        lines += _primary_table("arm − head", against_head, entries, split, metric, margins["head"])
    return lines


def _primary_table(
    title: str,
    pairs: Sequence[tuple[tuple[str, str], tuple[str, str]]],
    entries: Sequence[dict[str, Any]],
    split: str,
    metric: str,
    margin: float | None,
) -> list[str]:
    """One row per ((arm, readout), (baseline arm, its readout)) found among ``entries``."""
    extra = "" if margin is None else f" equivalence ±{margin:g} | 90 % interval |"
    lines = [f"| {title} | {DIFFERENCE_HEADER}{extra}",
             "|---|---|---|---|---|---|---|" + ("---|---|" if extra else "")]  # fmt: skip
    for (arm, readout), (baseline_arm, baseline) in pairs:
        key = (split, arm, readout, baseline_arm, baseline, metric)
        found = [e for e in entries if (e["split"], e["arm"], e["readout"], e["baseline_arm"],
                                        e["baseline"], e["metric"]) == key]  # fmt: skip
        if not found:
            continue
        name = arm if readout == baseline else f"{arm} ({readout})"
        cells = _difference_cells(found[0])
        if extra:
            test = found[0].get("equivalence") or {"verdict": "n/a", "low": None, "high": None}
            verdict = test["verdict"]
            if verdict == "no verdict":
                verdict += f": {test['reason']}"
            cells += [f"**{verdict}**" if verdict in ("equivalent", "different") else verdict,
                      _interval(test["low"], test["high"])]  # fmt: skip
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _improvement(entry: dict[str, Any]) -> str:
    return (
        f"{entry['arm']} ({entry['readout']}), {signed(entry['improvement'])} "
        f"{_interval(entry['low'], entry['high'])}; the smallest improvement this run could have "
        f"shown (its MDE): {_number(entry['mde'])}"
    )


def _gate_lines(gate: dict[str, Any], nested: bool) -> list[str]:
    level = f"{gate['confidence'] * 100:.1f} %"
    constant = (
        f"answering the training {gate['constant']} ({gate['constant_value']:.4g}) to every "
        f"example: {gate['tested']} {_number(gate['constant_score'])}"
    )
    learnt = [e for e in gate["arms"] if e["learnt"]]
    lines = [
        "## Learnability gate (validation)",
        "",
        f"Each arm × readout against the best constant answer, {constant}, by the same "
        f"{_ANALYSIS_WORDS[nested]['gate']} analysis: one-sided at α = {gate['alpha']:g} with "
        "Bonferroni's correction over the "
        f"{gate['candidates']} candidates (each interval at {level}). A difference from CE gets "
        "a verdict only where both arms it compares, by their readouts, beat the constant.",
        "",
    ]
    closest = gate["closest"]
    if gate["seeds"] < 2:
        lines.append(
            "**Cannot be shown with one seed** (no interval), so no comparison has a verdict."
        )
    elif not learnt:
        lines.append(
            "**Not shown at this budget** for any arm or readout, so no comparison has a "
            "verdict" + (f". Closest: {_improvement(closest)}." if closest else ".")
        )
    elif closest is not None:
        lines.append(
            f"**Shown for {len(learnt)} of {gate['candidates']}**; not shown at this budget for "
            f"the others, whose comparisons get no verdict (closest: {_improvement(closest)})."
        )
    else:
        lines.append("**Shown for every arm and readout.**")
    lines += ["", f"| arm | readout | improvement over the constant | {level} interval | MDE | "
              "parsed | learnt |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for entry in gate["arms"]:
        decided = ("yes" if entry["learnt"] else entry["reason"]) + _flip_mark(entry)
        lines.append(
            f"| {entry['arm']} | {entry['readout']} | {signed(entry['improvement'])} | "
            f"{_interval(entry['low'], entry['high'])}{_readout_error(entry)} | "
            f"{_number(entry['mde'])} | {_number(entry['parsed_share'])} | {decided} |"
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
    unparsed: float,
    nested: bool,
) -> list[str]:
    best = _best_constant(constants, metric_of_run)
    exploratory = [_EXPLORATORY, ""] if split == "validation" else []
    lines = [f"## {split}", "", *exploratory,
             "Mean ± std over seeds, every seed in brackets; the last column: whether the mean "
             f"{metric_of_run} beats every constant answer's "
             f"({_number(best)}, table below). Every error metric scores an unparsed answer as "
             f"the training median ({unparsed:.4g}); exact accuracy counts it wrong.", "",
             "| arm | readout | " + " | ".join(ITEM_METRICS) + " | beats the constants |",
             "|---|---|" + "---|" * (len(ITEM_METRICS) + 1)]  # fmt: skip
    rows = list(dict.fromkeys((e["arm"], e["readout"]) for e in table if e["split"] == split))
    for arm, readout in rows:
        cells = []
        for metric in ITEM_METRICS:
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
              "| constant | value | " + " | ".join(ITEM_METRICS) + " |",
              "|---|---|" + "---|" * len(ITEM_METRICS)]  # fmt: skip
    for name, scored in constants.items():
        cells = [_number(scored["metrics"][m]) for m in ITEM_METRICS]
        lines.append(f"| training {name} | {scored['value']:.4g} | " + " | ".join(cells) + " |")
    lines += ["", "Differences (arm − CE, and where a regression head ran every token arm − the "
              f"head; paired by {_ANALYSIS_WORDS[nested]['pairing']}; "
              f"{_ANALYSIS_WORDS[nested]['analysis']}; {_MDE_WORDS}; RMSE is tested as MSE, "
              "Pearson's r not at all).", "",
              f"| arm | readout | baseline | metric | {DIFFERENCE_HEADER}",
              "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for entry in entries:
        if entry["split"] == split:
            lines.append(
                f"| {entry['arm']} | {entry['readout']} | {_baseline_name(entry)} | "
                f"{entry['metric']} | " + " | ".join(_difference_cells(entry)) + " |"
            )
    return lines


def _run_lines(rows: Mapping[str, Any]) -> list[str]:
    """The command, numtok's version, the date and the machine, for rows that recorded them
    (the runs trained from scratch)."""
    if "command" not in rows:
        return []
    machine = rows["hardware"]
    return [
        f"`{rows['command'] or '(an API call)'}`: numtok {rows['numtok_version']}, "
        f"{rows['date']}; {machine['platform']}, {machine['cpu_count']} CPU cores, device "
        f"{machine['device']}, torch {machine['torch']}, {_workers(rows)} × "
        f"{machine['threads_per_worker']} thread(s); {rows['wall_seconds'] / 60:.1f} min of wall "
        "time in this invocation (a resumed run counts its own part)." + _resumed(rows),
        "",
    ]


def _resumed(rows: Mapping[str, Any]) -> str:
    """The arms whose training resumed from a checkpoint (a rerun after an interruption, or
    Ray's retry after a lost worker), each with the step it resumed at."""
    resumed = [f"seed {run['seed']} {run['arm']} λ={run['weight']:g} at step {run['resumed_at']}"
               for run in rows.get("runs", []) if "resumed_at" in run]  # fmt: skip
    if not resumed:
        return ""
    return (
        " Resumed from a checkpoint (an interrupted run or a lost worker): "
        + "; ".join(resumed)
        + "."
    )


def _workers(rows: Mapping[str, Any]) -> str:
    """Who trained the jobs: this process's workers, or Ray's tasks."""
    if "executor" in rows:
        return f"Ray tasks ({rows['executor']['ray']} cluster)"
    return f"{rows['workers']} worker process(es)"


def _preregistration_lines(
    preregistered: tuple[Path, dict[str, Any]] | None, rows: Mapping[str, Any]
) -> list[str]:
    if preregistered is None:
        return ["Not pre-registered (`--preregister FILE`): read every difference as "
                "exploratory.", ""]  # fmt: skip
    path, record = preregistered
    started = rows.get("started")
    provenance = git_provenance(path)
    if provenance["committed"] is None:
        status = "**not committed in git as it is**: it does not prove it came before the run"
    elif started is None:
        status = (
            f"committed in {provenance['commit'][:12]} at {provenance['committed']} (the run's "
            "start is not in its rows: its first report said whether that came before)"
        )
    else:
        committed = datetime.datetime.fromisoformat(provenance["committed"])
        before = committed <= datetime.datetime.fromisoformat(started)
        status = (
            f"committed in {provenance['commit'][:12]} at {provenance['committed']}, "
            + ("before" if before else "**after**")
            + f" the run began ({started}; both by the committer's and the machine's clocks)"
        )
    return [
        f"**Pre-registered** in `{path.name}` (sha256 {provenance['sha256'][:16]}), {status}. "
        + _registration_check(rows.get("registration_check"))
        + " "
        + _settings_check(record.get("settings", {}), rows.get("config", {})),
        "",
        f"Hypothesis: {record['hypothesis']}",
        "",
    ]


def _registration_check(check: Mapping[str, Any] | None) -> str:
    """What the run's own check against its registration found, as its rows record it."""
    if check is None:
        return (
            "These rows do not record the run's own check of its data, model and code against "
            "it (the version that ran refused a run whose settings, data or model differed, and "
            "did not hold the code)."
        )
    if not check["differences"]:
        return (
            f"The run checked its settings, data, model and code (source {check['source']}) "
            f"against it when it started ({check['checked']}): they matched."
        )
    return (
        f"**The run deviated from it** (checked {check['checked']}): "
        + "; ".join(check["differences"])
        + f". Deviation stated: {check['deviation']}"
    )


def _settings_check(registered: Mapping[str, Any], run: Mapping[str, Any]) -> str:
    """The rows' settings against the registration's, checked as this report is written."""
    differing = [key for key in sorted(registered) if run.get(key) != registered[key]]
    if not differing:
        return "The settings these rows record are the registered ones (checked by this report)."
    details = "; ".join(
        f"{key}: registered {json.dumps(registered[key])}, rows {json.dumps(run.get(key))}"
        for key in differing
    )
    return f"**The settings these rows record differ from the registered ones**: {details}."


def _reference_values(truth: Sequence[Any]) -> NDArray[np.float64]:
    """A split's true answers: (I,), or (S, I) where each seed drew its own items."""
    if truth and isinstance(truth[0], list):
        return np.stack([answer_values(row) for row in truth])
    return answer_values(truth)


def _constants(
    constants: Mapping[str, float], references: Mapping[str, NDArray[np.float64]]
) -> dict[str, dict[str, dict[str, Any]]]:  # a constant always parses: no unparsed rule
    return {
        split: {
            name: {"value": value,
                   "metrics": item_metrics(np.full(truth.size, value), truth.ravel())}
            for name, value in constants.items()
        }
        for split, truth in references.items()
    }  # fmt: skip


def _plot(metric: str, splits: Sequence[str], table: Sequence[dict[str, Any]],
          constants: dict[str, dict[str, dict[str, Any]]], path: Path) -> None:  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(splits), figsize=(4.2 * len(splits), 3.4), squeeze=False)
    for axis, split in zip(axes[0], splits, strict=True):
        chosen = [e for e in table if e["split"] == split and e["metric"] == metric]
        for index, entry in enumerate(chosen):
            if entry["mean"] is not None:
                axis.bar(index, entry["mean"], color="#9ecae1")
            values = [v for v in entry["values"] if v is not None and math.isfinite(v)]
            axis.plot([index] * len(values), values, "k.", markersize=4)
        scores = [c["metrics"][metric] for c in constants[split].values()]
        finite = [s for s in scores if s is not None]
        if finite:
            best = max(finite) if metric in HIGHER_IS_BETTER else min(finite)
            axis.axhline(best, color="#d62728", linestyle="--", linewidth=1)
        axis.set_xticks(range(len(chosen)))
        axis.set_xticklabels([f"{e['arm']}\n{e['readout']}" for e in chosen], fontsize=7,
                             rotation=45)  # fmt: skip
        axis.set_title(f"{split}: {metric} (dashed: best constant)", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def analyse_and_write(
    run_dir: Path,
    rows: Mapping[str, Any],
    *,
    preregistered: tuple[Path, dict[str, Any]] | None,
    target_effect: float | None = None,
) -> dict[str, Any]:
    """The analysis of a run's rows (``rows``: ``results.json`` without its analysis — the
    config, data sizes, choice of λ, ``training_constants``, ``references[split]``, every seed's
    ``answers[split][arm][readout]``, null where an answer held no number — and the run's
    timings): the learnability gate, every metric and comparison (module docstring), written
    with the rows as ``results.json``, ``report.md`` and ``report.png`` into ``run_dir``.
    ``target_effect``: plan a next run for it (:func:`planning`), from each primary
    comparison's variance components."""
    design = Design.from_dict(rows["design"])
    answers = _per_item(rows["answers"])
    bounds = _per_item(rows["readout_bounds"]) if "readout_bounds" in rows else None
    draws = None
    if "readout_standard_errors" in rows:
        samples = rows["config"]["readout_samples"]
        tested = rows["choice"].get("draws", {}).get("test", samples)  # chosen on validation
        draws = {
            split: Draws(errors, samples if split == "validation" else tested)
            for split, errors in _per_item(rows["readout_standard_errors"]).items()
        }
    references = {split: _reference_values(truth) for split, truth in rows["references"].items()}
    nested = any(truth.ndim == 2 for truth in references.values())
    constants = rows["training_constants"]
    seeds = len(design.seeds)
    unparsed = constants["median"]
    gate = learnability_gate(
        answers["validation"],
        constants,
        references["validation"],
        seeds,
        design.metric,
        unparsed,
        None if bounds is None else bounds["validation"],
        None if draws is None else draws["validation"],
    )
    table = metric_table(answers, references, seeds, unparsed)
    baseline = design.equivalence_baseline
    margin = (
        None
        if design.margin is None or baseline is None
        else (per_item_metric(design.metric), design.margin, baseline)
    )
    entries = comparisons(
        answers, references, seeds, unparsed, gate, margin=margin, bounds=bounds, draws=draws
    )
    scored_constants = _constants(constants, references)
    results = json_safe({
        **{key: value for key, value in rows.items() if key not in _ANALYSIS},
        "gate": gate,
        "metrics": table,
        "comparisons": entries,
        "constants": scored_constants,
        "unparsed_answer": unparsed,
        "planning": None if target_effect is None else planning(
            design, entries, {split: len(truth) for split, truth in references.items()},
            target_effect),
    })  # fmt: skip
    (run_dir / "results.json").write_text(json.dumps(results, indent=1, allow_nan=False))
    lines = [f"# {design.title}", "", *_run_lines(rows)]
    lines += _preregistration_lines(preregistered, rows)
    compared_arms = [arm for arm in design.arms if arm != "ce"]
    if preregistered is not None:  # the registered arm alone is primary
        compared_arms = [registered_arm(preregistered[1])]
    lines += _primary_lines(
        design, entries, compared_arms, len(answers) > 1, nested, preregistered is not None
    )
    if results["planning"] is not None:
        lines += ["", *_planning_lines(results["planning"])]
    lines += ["", *_gate_lines(gate, nested), ""]
    lines += _settings_lines(design, results, unparsed, nested)
    lines += _choice_lines(design, rows["choice"])
    for split in (*(s for s in design.splits if s in answers), "validation"):
        lines += ["", *_split_lines(split, table, entries, scored_constants[split], design.metric,
                                    unparsed, nested)]  # fmt: skip
    (run_dir / "report.md").write_text("\n".join(lines) + "\n")
    _plot(design.metric, list(answers), table, scored_constants, run_dir / "report.png")
    loaded: dict[str, Any] = json.loads((run_dir / "results.json").read_text())
    return loaded


def _per_item(stored: Mapping[str, Any]) -> dict[str, dict[str, dict[str, NDArray[np.float64]]]]:
    """Rows' lists per item, ``[split][arm][readout]`` one list per seed, as (S, I) float64
    arrays, NaN for None (no number, no bound)."""
    return {split: {arm: {readout: np.stack([answer_values(row) for row in lists])
                          for readout, lists in by_readout.items()}
                    for arm, by_readout in by_arm.items()}
            for split, by_arm in stored.items()}  # fmt: skip


#: What :func:`analyse_and_write` computes from the rows (and what older rows' ``bootstrap``
#: analysis held): dropped from the rows before it writes its own.
_ANALYSIS = ("gate", "metrics", "comparisons", "constants", "unparsed_answer", "planning",
             "bootstrap_replicates")  # fmt: skip


def read_rows(source: Path) -> dict[str, Any]:
    """A finished run's rows: ``source`` its run folder (its ``results.json``) or a results
    file; a ``ValueError`` naming ``--reanalyse`` when they cannot be read or hold no answers."""
    path = source / "results.json" if source.is_dir() else source
    try:
        rows = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"--reanalyse {source}: cannot read the run's results ({error})") from None
    expected = ("config", "answers", "references", "choice")
    missing = [key for key in expected if not isinstance(rows, dict) or key not in rows]
    if missing:
        raise ValueError(
            f"--reanalyse {source}: not the results of a run that stores every answer (no "
            f"{', '.join(missing)}; runs before numtok 0.1's one report writer kept none)"
        )
    stored: dict[str, Any] = rows
    return stored


def reanalyse(
    source: Path,
    out: Path,
    *,
    upgrade: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    target_effect: float | None = None,
) -> dict[str, Any]:
    """Rebuild a run's report from its rows (``source``: its run folder or results file) with
    this version's analysis, into ``out``; ``upgrade`` completes rows of an older layout;
    ``target_effect`` as :func:`analyse_and_write` takes it."""
    rows = read_rows(source)
    if upgrade is not None:
        rows = upgrade(rows)
    out.mkdir(parents=True, exist_ok=True)
    return analyse_and_write(
        out, rows, preregistered=registration_of(rows, source), target_effect=target_effect
    )


def _planning_lines(plan: Mapping[str, Any]) -> list[str]:
    target, seeds = plan["target_effect"], plan["seeds"]
    lines = [
        "## Planning",
        "",
        f"For a target effect of {target:g} in {plan['metric']} (arm − CE on {plan['split']}), "
        "from each comparison's variance components (seed, item, seed × item; the crossed "
        "analysis' ANOVA estimates): the MDE of a design of this size, and the fewest seeds at "
        f'this many items, and items at {seeds} seeds, whose MDE is at most the target ("not '
        'reachable": the seed component alone keeps the MDE above it); in brackets the same '
        "at the components' 95 % confidence limits, the range this run's own estimates allow "
        "(with few seeds the seed component is known to within a factor of ten or more).",
        "",
        "| arm − CE | σ² seed | σ² item | σ² seed × item | MDE now | seeds needed | items needed |",
        "|---|---|---|---|---|---|---|",
    ]
    for entry in plan["arms"]:
        c = entry["components"]
        seeds_low, seeds_high = entry["seeds_needed_range"]
        items_low, items_high = entry["items_needed_range"]
        lines.append(
            f"| {entry['arm']} | {c['seed']:.3g} | {c['item']:.3g} | {c['resid']:.3g} | "
            f"{_number(entry['mde'])} | {needed(entry['seeds_needed'])} at "
            f"{entry['items']:,} items ({needed(seeds_low)}–{needed(seeds_high)}) | "
            f"{needed(entry['items_needed'])} ({needed(items_low)}–{needed(items_high)}) |"
        )
    if plan["mde_above"]:
        lines += ["", f"**The MDE of this design is above the target** for "
                  f"{', '.join(plan['mde_above'])}: a run of this size would likely miss an "
                  "effect of that size."]  # fmt: skip
    return lines


def registration_of(rows: Mapping[str, Any], source: Path) -> tuple[Path, dict[str, Any]] | None:
    """The pre-registration the rows name, read where they name it or beside ``source``."""
    if not rows.get("preregistration"):
        return None
    registered = Path(rows["preregistration"])
    if not registered.is_file():
        folder = source if source.is_dir() else source.parent
        registered = folder / registered.name
    if not registered.is_file():
        return None
    return registered, json.loads(registered.read_text())


def _settings_lines(
    design: Design, rows: Mapping[str, Any], unparsed: float, nested: bool
) -> list[str]:
    largest_unexplored = rows.get("largest_unexplored")
    # Rows written before the tolerance was a setting were read at FAST_TOLERANCE.
    tolerance = rows.get("config", {}).get("readout_tolerance", FAST_TOLERANCE)
    lines = [
        "## Settings",
        "",
        f"Seeds {list(design.seeds)}; {design.trained} {rows['minutes']:.1f} minutes of training "
        f"and scoring. Intervals: {_ANALYSIS_WORDS[nested]['interval']} "
        "(numtok_compare.crossed, docs/statistics.md), one per difference, "
        + (
            "none with one seed"
            if len(design.seeds) == 1
            else f"its df {_ANALYSIS_WORDS[nested]['df']}"
        )
        + f". Unparsed answers: every error metric scores them as the training median "
        f"({unparsed:.4g}), exact accuracy as wrong. Many comparisons at the 5 % level: a few "
        "verdicts may come from chance; the primary endpoint is the one the run was made for.",
    ]
    if largest_unexplored is not None:
        lines[-1] += (
            f" The distribution readouts left at most {largest_unexplored:.2g} of an item's "
            f"probability unexplored (tolerance {tolerance:g} of its number mass); its mean "
            "moves by at most unexplored / (covered + unexplored) of the range 0.."
            f"{design.max_value}."
        )
    if "readout_bounds" in rows:
        lines[-1] += " " + _BOUND_WORDS + _flipped(rows)
    sampling = rows.get("sampling_error")
    if sampling is not None:
        lines[-1] += (
            f" The distribution readouts drew {rows['config']['readout_samples']} numbers per "
            f"item{_chosen_draws(rows['choice'].get('draws'), len(rows['references']) > 1)}: "
            "the expected answer is unbiased, its standard "
            f"error {sampling['mean']:.3g} on average (largest {sampling['largest']:.3g}). That "
            "noise is in every interval (it differs by seed and item: the residual), and it adds "
            f"its mean square, {sampling['mean_square']:.3g}, to an arm's expected MSE and at "
            "most its mean to the MAE: on both sides of a difference alike where the arms' "
            "answers spread alike."
        )
    if "readout_standard_errors" in rows:
        lines[-1] += " " + _DRAWS_WORDS + _draws_needed(design, rows)
        lines[-1] += _flipped(rows, "draws_could_flip")
    return lines


def _chosen_draws(draws: Mapping[str, Any] | None, tested: bool) -> str:
    """What the readouts drew where: `` instead of enumerating them``, and where the run chose the
    test splits' draws (:mod:`numtok_compare.finetune.draws`), on validation and how many the
    test splits drew (or, not ``tested``, will draw), and why."""
    if draws is None:
        return " instead of enumerating them"
    needed = ", ".join(f"{name} {'more than any' if count is None else f'{count:,}'}"
                       for name, count in draws["needed"].items()) or "none known"  # fmt: skip
    return (
        f" on validation instead of enumerating them, and {draws['test']:,} on the test splits"
        f"{'' if tested else ' (when they are scored)'}, chosen on validation: the most that a "
        f"comparison of the expected readout needed for the draws to make up at most "
        f"{100 * DRAWS_SHARE_TARGET:.0f} % of its variance ({needed}), "
        f"within the {draws['affordable']:,} that keep the scoring within the training's time, "
        "and no fewer than validation's"
    )


#: What the share beside an interval of a sampled readout is, in the report's words.
_DRAWS_WORDS = (
    "The (x % draws) after an interval: the share of its variance that the draws make up, each "
    "answer's standard error carried through the metric by the delta method "
    "(numtok_compare.readout_error); it falls as 1/draws, and the rest of the variance stays. "
    "The exact readout's estimate lies within 1.96 draws' standard errors of the drawn one "
    "(95 %), its interval narrower by the draws' share: where that could put it elsewhere "
    "against 0, the verdict or gate decision is marked."
)


def _draws_needed(design: Design, rows: Mapping[str, Any]) -> str:
    """The sentence that gives the draws per item at which the draws would make up a tenth of
    each primary comparison's variance (arm − CE by the run's readout and metric, on the first
    test split, or on validation where none was scored)."""
    split = design.splits[0] if design.splits[0] in rows["references"] else "validation"
    metric = per_item_metric(design.metric)
    primary = [e for e in rows["comparisons"] if (e["split"], e["readout"], e["metric"],
               e["baseline_arm"], e["baseline"]) == (split, design.readout, metric, "ce",
               design.readout) and e.get("draws_share")]  # fmt: skip
    if not primary:
        return ""
    counts = ", ".join(
        f"{e['arm']} " + ("n/a" if e["draws_needed"] is None else f"{e['draws_needed']:,}")
        for e in primary
    )
    return (
        f" For the draws to make up at most {100 * DRAWS_SHARE_TARGET:.0f} % of the variance of "
        f"each primary comparison (arm − CE, {design.readout} {metric} on {split}), this many "
        f"draws per item (--readout-samples): {counts} (n/a: the draws are all the variance "
        "measured); enumerating (--readout-tolerance 0) leaves none, at its own cost."
    )


#: What the ± beside an interval is, in the report's words.
_BOUND_WORDS = (
    "The ± beside an interval: how far the distribution readouts' pruning could move the "
    "estimate, the mean over seeds and items of each answer's bound on both sides "
    "(numtok_compare.readout_error: the expected readout's mean_bound carried through the "
    "metric; greedy and the head are exact, the median and mode of a pruned table unbounded); a "
    "bias, apart from the interval's sampling noise."
)


def _flipped(rows: Mapping[str, Any], key: str = "could_flip") -> str:
    """The sentence that names the verdicts and gate decisions the readouts' bound could change
    (``key`` ``"draws_could_flip"``: that the exact readout could give otherwise than the draws),
    or says that none could."""
    analysed = rows.get("comparisons", []) + rows.get("gate", {}).get("arms", [])
    flips = [e for e in analysed if e.get(key) and e.get("verdict") != "no verdict"]
    within, settle = (
        ("within it", "a finer --readout-tolerance")
        if key == "could_flip"
        else ("with the exact readout", "more draws (--readout-samples) or the enumeration")
    )
    if not flips:
        return f" No verdict or gate decision could change {within}."
    return (
        f" {len(flips)} verdicts or gate decisions could change {within} (marked); {settle} "
        "would settle them."
    )


def _choice_lines(design: Design, choice: Mapping[str, Any]) -> list[str]:
    """The λ grid's table: each λ's mean validation metric, its parsed share beside it (rows
    written before the shares were stored: n/a)."""
    if not choice["means"]:
        return []
    parsed = choice.get("parsed", {})
    grid = list(next(iter(choice["means"].values())))
    lines = ["", f"λ chosen on validation (mean {design.metric} of the {design.readout} "
             "readout over the seeds; ties to the smaller λ; the parsed share in brackets):", "",
             "| arm | " + " | ".join(f"λ={w}" for w in grid) + " | chosen |",
             "|---|" + "---|" * (len(grid) + 1)]  # fmt: skip
    for arm, means in choice["means"].items():
        cells = [f"{_number(m, 4)} ({_number(parsed.get(arm, {}).get(w))})"
                 for w, m in means.items()]  # fmt: skip
        lines.append(f"| {arm} | " + " | ".join(cells) + f" | {choice['chosen'][arm]:g} |")
    reuse = (
        "The test splits' comparisons reuse the seeds whose validation answers chose λ: the "
        "choice read no test item, but its intervals do not account for it, so an arm whose λ "
        "was chosen may look a little better than a fresh seed would."
    )
    lines += ["", reuse]
    return lines
