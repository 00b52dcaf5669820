"""The lines ``numtok compare`` and ``numtok demo`` print at the end of a run, from its results:
the learnability gate, the primary endpoint of every arm and, when asked, the planning of a next
run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from numtok_compare.design import Design
from numtok_compare.item_metrics import per_item_metric
from numtok_compare.report_format import needed, signed

__all__ = ["summary_lines"]


def summary_lines(results: Mapping[str, Any]) -> list[str]:
    """What the command prints at the end: the gate and the primary endpoint of every arm, or
    with one seed that it cannot give a verdict."""
    design = Design.from_dict(results["design"])
    gate = results["gate"]
    split = design.splits[0]
    if split not in results["answers"]:
        split = "validation"
    learnt = sum(entry["learnt"] for entry in gate["arms"])
    closest = gate["closest"]
    one_seed = len(design.seeds) == 1
    if one_seed:
        outcome = "cannot be shown with one seed (no interval): no verdict on any loss"
    elif learnt:
        outcome = f"shown for {learnt} of {gate['candidates']} arm × readout candidates"
    else:
        outcome = "not shown at this budget for any arm: no verdict on any loss"
    if closest is not None and not one_seed:
        outcome += (
            f" (closest not shown: {closest['arm']} ({closest['readout']}), "
            f"{signed(closest['improvement'], 4)} [{signed(closest['low'], 4)}, "
            f"{signed(closest['high'], 4)}], MDE {_positive(closest['mde'])})"
        )
    lines = [
        f"learnability gate (validation {design.metric}, beating the best constant at one-sided "
        f"α {gate['alpha']:g}, Bonferroni over {gate['candidates']}): {outcome}",
    ]
    if one_seed:
        lines.append(
            "one seed cannot give a verdict: the seed-to-seed variance cannot be estimated from "
            "one seed, so no difference has an interval (run at least 2 seeds; 3 or more for "
            "useful power)"
        )
    metric = per_item_metric(design.metric)
    lines.append(
        f"primary endpoint, {metric} ({design.readout}) on {split}, arm − CE"
        + (" (the test splits not scored: nothing to claim):" if split == "validation" else ":")
    )
    for entry in results["comparisons"]:
        if (
            entry["split"], entry["readout"], entry["baseline_arm"], entry["baseline"],
            entry["metric"],
        ) == (split, design.readout, "ce", design.readout, metric):  # fmt: skip
            verdict = entry["verdict"]
            if verdict == "no verdict" and not one_seed:  # one seed: said above
                verdict += f" ({entry['reason']})"
            lines.append(
                f"  {entry['arm']}: {signed(entry['difference'], 4)} "
                f"[{signed(entry['low'], 4)}, {signed(entry['high'], 4)}], MDE "
                f"{_positive(entry['mde'])}: {verdict}"
            )
    plan = results.get("planning")
    if plan:
        lines.append(f"planning for a target effect of {plan['target_effect']:g} "
                     f"({plan['metric']}, {plan['split']}):")  # fmt: skip
        for entry in plan["arms"]:
            seeds, items = (
                f"{needed(entry[f'{kind}_needed'])} (at the components' 95 % limits "
                + "–".join(needed(n) for n in entry[f"{kind}_needed_range"])
                + ")"
                for kind in ("seeds", "items")
            )
            lines.append(
                f"  {entry['arm']} − CE: MDE now {_positive(entry['mde'])}; seeds needed at "
                f"{entry['items']:,} items: {seeds}; items needed at {plan['seeds']} seeds: {items}"
            )
    return lines


def _positive(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"
