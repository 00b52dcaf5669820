"""Planning a next run from a finished one: the variance components of its primary comparisons
give the minimal detectable effect (MDE) of any design, hence the fewest seeds and items that
reach a target effect (:mod:`numtok_compare.crossed`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from numtok_compare.checks import check_number
from numtok_compare.crossed import VarianceComponents, items_needed, seeds_needed
from numtok_compare.design import Design
from numtok_compare.item_metrics import per_item_metric

__all__ = ["planning"]


def planning(
    design: Design,
    entries: Sequence[Mapping[str, Any]],
    items: Mapping[str, int],
    target_effect: float,
) -> dict[str, Any]:
    """For each arm − CE on the primary split, readout and tested metric (validation when the
    test splits were not scored): its variance components, the MDE of this run's design, and
    the fewest seeds (at this many items) and items (at this many seeds) whose MDE is at most
    ``target_effect`` (:func:`~numtok_compare.crossed.seeds_needed`, ``items_needed``;
    None: not reachable, for items when the seed component alone keeps the MDE above it); and
    both again at the components' 95 % confidence limits
    (:meth:`~numtok_compare.crossed.VarianceComponents.at_confidence_limits`), the range the
    run's own estimates allow (``seeds_needed_range``, ``items_needed_range``: [fewest, most]);
    ``items``: each split's number of items."""
    check_number("target_effect", target_effect, minimum=0.0, inclusive=False)
    metric = per_item_metric(design.metric)
    splits = {e["split"] for e in entries}
    split = design.splits[0] if design.splits[0] in splits else "validation"
    arms = []
    for e in entries:
        key = (e["split"], e["readout"], e["baseline_arm"], e["baseline"], e["metric"])
        if key != (split, design.readout, "ce", design.readout, metric) or not e["components"]:
            continue
        components = VarianceComponents(**e["components"])
        seeds, count = len(design.seeds), items[split]
        limits = components.at_confidence_limits(seeds, count)
        arms.append({
            "arm": e["arm"], "components": e["components"],
            "mde": components.minimal_detectable_effect(seeds, count),
            "seeds_needed": seeds_needed(components, target_effect, items=count),
            "items_needed": items_needed(components, target_effect, seeds=seeds),
            "seeds_needed_range": [seeds_needed(c, target_effect, items=count) for c in limits],
            "items_needed_range": [items_needed(c, target_effect, seeds=seeds) for c in limits],
            "items": count,
        })  # fmt: skip
    return {"target_effect": target_effect, "split": split, "metric": metric,
            "seeds": len(design.seeds), "arms": arms,
            "mde_above": [a["arm"] for a in arms if a["mde"] > target_effect]}  # fmt: skip
