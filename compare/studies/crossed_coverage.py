"""The coverage of :mod:`numtok_compare.crossed`'s interval, by simulation, next to
Satterthwaite's t interval and the seed × item bootstrap of ``seed_item_bootstrap.py`` beside this
script: a study of the harness's statistics, not part of the harness (docs/statistics.md).

**The data** of a cell: R replications of ``d[s, i] = μ + α_s + β_i + γ_si`` over S seeds and I
items, the effects independent with the variances that make ``Var(d̄) = 1`` and give the
seeds a share ``seed_share`` of it, the rest split between the interaction (``interaction_share``)
and the items. The seed effects are normal; the item and interaction effects are normal, or
(``effects``) a centred and scaled lognormal (σ = 1: skewness 6.2) or χ²₁ (skewness 2.8, excess
kurtosis 12; the WAS − head squared-error differences of the diamonds test have 3.4 and 14):

    σ²_seed = seed_share·S,   σ²_item = (1 − seed_share)(1 − interaction_share)·I,
    σ²_resid = (1 − seed_share)·interaction_share·S·I.

The arms' own scores do not matter: every interval here depends on the data only through ``d``
(the bootstrap through the arms' means, which for a mean metric is also ``d``; see
:func:`bootstrap_intervals`).

**A row** (:func:`coverage_row`, at a ``confidence`` of 95 % unless it says otherwise): the share
of replications whose interval holds μ (coverage),
its Monte Carlo standard error ``√(c(1 − c)/R)``, the share whose interval excludes 0 (with μ = 0
the false-positive rate of a verdict, else its power) and the mean interval width, for the
generalized interval (``coverage``, ``rejection_rate``, ``mean_width``), for ``d̄ ± t(0.975, ν)·SE``
with Satterthwaite's ν (``satterthwaite_*``) and, when asked, for the bootstrap (``bootstrap_*``).

Run ``python compare/studies/crossed_coverage.py --out docs/crossed-coverage-rows.json`` for
the table of docs/statistics.md (a few minutes on one core).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from numtok_compare.crossed import (
    VarianceComponents,
    generalized_half_widths,
    mean_squares,
    satterthwaite_df,
)

from seed_item_bootstrap import Resamples, draw_resamples

__all__ = [
    "BOOTSTRAP_REPLICATES",
    "Cell",
    "bootstrap_intervals",
    "coverage_row",
    "full_grid",
    "main",
    "power_cells",
    "simulate",
    "skewed_grid",
]

Array = NDArray[np.float64]

#: The bootstrap's replicates, as the fine-tuning reports draw them.
BOOTSTRAP_REPLICATES = 2000
#: The two-sided level at which the learnability gate reads its one-sided 5 % test with
#: Bonferroni over 13 candidates (the diamonds test's): 1 − 2·0.05/13.
GATE_CONFIDENCE = 1 - 0.1 / 13


@dataclass(frozen=True)
class Cell:
    """One design and one truth: S ``seeds``, I ``items``, the variance shares (module
    docstring) and the true difference μ."""

    seeds: int
    items: int
    seed_share: float
    interaction_share: float
    difference: float = 0.0
    effects: str = "normal"

    @property
    def components(self) -> VarianceComponents:
        """The true components, scaled so that ``Var(d̄) = 1``."""
        rest = 1 - self.seed_share
        return VarianceComponents(
            seed=self.seed_share * self.seeds,
            item=rest * (1 - self.interaction_share) * self.items,
            resid=rest * self.interaction_share * self.seeds * self.items,
        )


def _standardised(effects: str, rng: np.random.Generator, shape: tuple[int, ...]) -> Array:
    """Draws of mean 0 and variance 1 from the ``effects`` distribution (module docstring)."""
    if effects == "normal":
        return rng.standard_normal(shape)
    if effects == "lognormal":  # exp(N(0, 1)): mean e^½, variance (e − 1)e
        return (rng.lognormal(0.0, 1.0, shape) - math.exp(0.5)) / math.sqrt((math.e - 1) * math.e)
    if effects == "chi2":  # χ²₁: mean 1, variance 2
        return (rng.chisquare(1, shape) - 1) / math.sqrt(2)
    raise ValueError(f"effects must be 'normal', 'lognormal' or 'chi2', got {effects!r}")


def simulate(cell: Cell, replications: int, rng: np.random.Generator) -> Array:
    """(R, S, I) replications of ``d`` for ``cell`` (module docstring)."""
    truth = cell.components
    shape = (replications, cell.seeds, cell.items)
    seed = math.sqrt(truth.seed) * rng.standard_normal((replications, cell.seeds, 1))
    item = math.sqrt(truth.item) * _standardised(cell.effects, rng, (replications, 1, cell.items))
    resid = math.sqrt(truth.resid) * _standardised(cell.effects, rng, shape)
    data: Array = cell.difference + seed + item + resid
    return data


def bootstrap_intervals(differences: Array, resamples: Resamples) -> tuple[Array, Array]:
    """``(low, high)``, each (R,), of :func:`numtok_compare.bootstrap.seed_item_difference`'s
    95 % interval for each of the R data sets ``differences`` (R, S, I) of a mean metric.

    For a metric that is the mean of per-item values over the items drawn (MAE, accuracy with
    every answer parsed), replicate b's difference is ``Δ_b = Σ_s (c_bs/S)·Σ_i w_bi·d[s, i]/I``
    with ``c_bs`` how often seed s was drawn and ``w_bi`` how often item i (``Σ_i w_bi = I``):
    one matrix product for every data set at once. tests/test_crossed.py checks it against
    ``seed_item_difference`` itself."""
    replications, seeds, items = differences.shape
    draws = resamples.seed_draws
    seed_counts = np.stack([np.bincount(row, minlength=seeds) for row in draws]) / seeds  # (B, S)
    columns = differences.transpose(2, 0, 1).reshape(items, replications * seeds)  # (I, R·S)
    per_seed = (resamples.item_counts @ columns).reshape(-1, replications, seeds) / items
    replicate = np.einsum("brs,bs->br", per_seed, seed_counts)  # (B, R)
    low, high = np.percentile(replicate, [2.5, 97.5], axis=0)
    return low, high


def _chunks(total: int, size: int) -> Iterator[int]:
    while total > 0:
        yield min(size, total)
        total -= size


def coverage_row(
    cell: Cell,
    replications: int,
    *,
    seed: int = 0,
    bootstrap: bool = False,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """The row of ``cell`` over ``replications`` data sets drawn from ``default_rng(seed)``
    (module docstring), its intervals at ``confidence``; the bootstrap's columns (95 % alone)
    only when ``bootstrap``."""
    rng = np.random.default_rng(seed)
    resamples = draw_resamples(cell.seeds, cell.items, replicates=BOOTSTRAP_REPLICATES)
    chunk = max(1, 2_000_000 // (cell.seeds * cell.items))
    totals: dict[str, list[Array]] = {}

    def add(name: str, low: Array, high: Array) -> None:
        held = (low <= cell.difference) & (cell.difference <= high)
        rejected = (low > 0) | (high < 0)
        totals.setdefault(name, []).append(np.stack([held, rejected, high - low]))

    for size in _chunks(replications, chunk):
        d = simulate(cell, size, rng)  # (n, S, I)
        estimate = d.mean(axis=(1, 2))
        ms_seed, ms_item, ms_resid = mean_squares(d)
        half = generalized_half_widths(
            ms_seed, ms_item, ms_resid, cell.seeds, cell.items, confidence
        )
        add("", estimate - half, estimate + half)
        variance = np.maximum(ms_seed + ms_item - ms_resid, 0) / (cell.seeds * cell.items)
        df = np.maximum(satterthwaite_df(ms_seed, ms_item, ms_resid, cell.seeds, cell.items), 1e-6)
        t_half = stats.t.ppf(1 - (1 - confidence) / 2, df) * np.sqrt(variance)
        add("satterthwaite_", estimate - t_half, estimate + t_half)
        if bootstrap:
            add("bootstrap_", *bootstrap_intervals(d, resamples))
    row: dict[str, Any] = {**asdict(cell), "confidence": confidence, "replications": replications}
    for name, parts in totals.items():
        held, rejected, width = np.concatenate(parts, axis=1)
        coverage = float(held.mean())
        row[f"{name}coverage"] = coverage
        row[f"{name}coverage_mc_se"] = math.sqrt(coverage * (1 - coverage) / replications)
        row[f"{name}rejection_rate"] = float(rejected.mean())
        row[f"{name}mean_width"] = float(width.mean())
    return row


SEEDS = (3, 4, 6, 8)
ITEMS = (100, 500, 2000)
SEED_SHARES = (0.0, 0.5, 0.75, 0.9, 1.0)
INTERACTION_SHARES = (0.0, 0.5, 1.0)


def full_grid() -> list[Cell]:
    """Every (seeds, items, seed share, interaction share) of the study, μ = 0; at a seed share
    of 1 the interaction share does not matter and is 0.5 alone."""
    return [
        Cell(seeds, items, share, interaction)
        for seeds in SEEDS
        for items in ITEMS
        for share in SEED_SHARES
        for interaction in INTERACTION_SHARES
        if share < 1 or interaction == 0.5
    ]


def power_cells() -> list[Cell]:
    """The cells whose power at the MDE is simulated (μ set to the MDE their components give):
    the seeds 90 % of the variance, and half seeds, half items and interaction (the shares of
    the diamonds test's differences), at 3, 4, 6 and 8 seeds; the interaction alone at 8 seeds;
    and the diamonds-like shares with lognormal effects at 3 and 6 seeds."""
    first = [Cell(3, 100, 0.9, 0.0), Cell(3, 2000, 0.5, 0.5), Cell(8, 500, 0.0, 1.0)]
    by_seeds = [
        Cell(seeds, items, share, interaction)
        for seeds in (4, 6, 8)
        for items, share, interaction in ((100, 0.9, 0.0), (2000, 0.5, 0.5))
    ]
    skewed = [Cell(seeds, 100, 0.75, 0.5, effects="lognormal") for seeds in (3, 6)]
    return first + by_seeds + skewed


def skewed_grid() -> list[Cell]:
    """The cells with skewed item and interaction effects, μ = 0: 3 and 6 seeds, 100 and 2,000
    items, seed shares 0-0.9, the rest shared equally by the items and the interaction."""
    return [
        Cell(seeds, items, share, 0.5, effects=effects)
        for effects in ("lognormal", "chi2")
        for seeds in (3, 6)
        for items in (100, 2000)
        for share in (0.0, 0.5, 0.75, 0.9)
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replications", type=int, default=4000)
    parser.add_argument("--bootstrap-replications", type=int, default=1000)
    parser.add_argument("--out", type=Path, help="write the rows here as JSON")
    args = parser.parse_args(argv)
    rows = []
    started = time.perf_counter()
    header = "seeds items seed_share inter  coverage  fpr    width | satt.  | boot.  fpr"
    print(header)
    for number, cell in enumerate(full_grid()):
        row = coverage_row(cell, args.replications, seed=number)
        with_bootstrap = cell.items in (100, 2000) and cell.interaction_share == 0.5
        if with_bootstrap:
            boot = coverage_row(cell, args.bootstrap_replications, seed=number, bootstrap=True)
            row.update({k: v for k, v in boot.items() if k.startswith("bootstrap_")})
            row["bootstrap_replications"] = args.bootstrap_replications
        rows.append(row)
        boot_text = (
            f"{row['bootstrap_coverage']:.3f} {row['bootstrap_rejection_rate']:.3f}"
            if with_bootstrap
            else ""
        )
        print(
            f"{cell.seeds:5d} {cell.items:5d} {cell.seed_share:10.2f} {cell.interaction_share:5.2f}"
            f"  {row['coverage']:.3f}  {row['rejection_rate']:.3f}  {row['mean_width']:.2f}"
            f" | {row['satterthwaite_coverage']:.3f} | {boot_text}",
            flush=True,
        )
    for cell in power_cells():
        mde = cell.components.minimal_detectable_effect(cell.seeds, cell.items)
        at_mde = replace(cell, difference=mde)
        row = coverage_row(at_mde, args.replications, seed=len(rows))
        rows.append(row)
        print(f"power at the MDE {mde:.3f} of {cell}: {row['rejection_rate']:.3f}")
    print("skewed: effects seeds items seed_share  coverage at 95 %, 90 %, the gate's level")
    for number, cell in enumerate(skewed_grid()):
        levels = [coverage_row(cell, args.replications, seed=10_000 + number, confidence=level)
                  for level in (0.95, 0.90, GATE_CONFIDENCE)]  # fmt: skip
        rows += levels
        print(
            f"{cell.effects:9s} {cell.seeds:5d} {cell.items:5d} {cell.seed_share:10.2f}  "
            + "  ".join(f"{row['coverage']:.3f}" for row in levels),
            flush=True,
        )
    print(f"{time.perf_counter() - started:.0f} s")
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
