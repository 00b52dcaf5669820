"""The paired difference of two arms on a crossed seed × item design: one interval, its verdict,
its power, and an equivalence test.

Every seed of both arms answers the same I test items, so a per-item score (an absolute error, a
log error, a squared error, 0/1 for a correct answer) is ``a[s, i]`` for the arm and ``b[s, i]``
for the baseline, over S seeds and I items. The metric compared is the mean over seeds and items,
and the difference of the arms' metrics is the mean of ``d[s, i] = a[s, i] − b[s, i]``. Only
metrics that are such means are supported (accuracy, MAE, mean log error, MSE); RMSE and Pearson's
r are not means of per-item values: compare MSE instead of RMSE. An unparsed answer must already
have a score (by a rule stated where it is scored): NaN is refused.

**The model.** ``d[s, i] = μ + α_s + β_i + γ_si`` with independent centred effects of variances
σ²_seed (the seed: initial weights and batch order), σ²_item (items that favour one arm) and
σ²_resid (the seed × item interaction, confounded with noise: one score per cell). The estimate
``d̄ = mean(d)`` has ``E d̄ = μ`` and

    Var(d̄) = σ²_seed/S + σ²_item/I + σ²_resid/(S·I).

**The mean squares** of the two-way layout without replication, with ``d̄_s.`` a seed's mean over
items and ``d̄_.i`` an item's mean over seeds:

    MS_seed  = I/(S−1) · Σ_s (d̄_s. − d̄)²                        df S−1,     E = σ²_resid + I·σ²_seed
    MS_item  = S/(I−1) · Σ_i (d̄_.i − d̄)²                        df I−1,     E = σ²_resid + S·σ²_item
    MS_resid = Σ_si (d[s,i] − d̄_s. − d̄_.i + d̄)² / ((S−1)(I−1))  df (S−1)(I−1), E = σ²_resid

(the expected mean squares follow from ``d̄_s. − d̄ = α_s − ᾱ + γ̄_s. − γ̄`` and its item twin).
Solving for the components gives the ANOVA estimators
``σ̂²_seed = (MS_seed − MS_resid)/I``, ``σ̂²_item = (MS_item − MS_resid)/S``,
``σ̂²_resid = MS_resid``, and substituting them into Var(d̄):

    Var(d̄) = (E MS_seed − σ²_resid)/(S·I) + (E MS_item − σ²_resid)/(S·I) + σ²_resid/(S·I)
            = (E MS_seed + E MS_item − E MS_resid) / (S·I),

so ``SE² = (MS_seed + MS_item − MS_resid)/(S·I)`` is unbiased. Its Satterthwaite degrees of freedom
are ``ν = (MS_seed + MS_item − MS_resid)² / (MS_seed²/(S−1) + MS_item²/(I−1) +
MS_resid²/((S−1)(I−1)))``. With one seed (or one item) ``MS_seed`` (``MS_item``) has no degree of
freedom: no interval and no verdict, said so in the result's ``reason``.

**The interval** is not ``d̄ ± t(ν)·SE``: with 3–4 seeds and a large seed share the estimated ν is
too large exactly when ``MS_seed`` came out small, and that interval covers only about 92 %
(``docs/crossed-coverage-rows.json``, column ``satterthwaite``). It is the generalized (fiducial)
interval of the same decomposition (Weerahandi 1993; Hannig, Iyer & Patterson 2006): each
expected mean square is replaced by its generalized pivot ``MS_k / W_k``, ``W_k ~ χ²(df_k)/df_k``
independent, so that

    V* = max(0, MS_seed/W_seed + MS_item/W_item − MS_resid/W_resid) / (S·I),

and the interval is ``d̄ ± h`` with ``h`` the ``confidence`` quantile of ``|Z|·√V*``,
``Z ~ N(0, 1)``: the root of ``E_W[erf(h/√(2V*))] = confidence``, Z integrated exactly and the
expectation over W taken at :data:`FIDUCIAL_POINTS` points of a scrambled Sobol sequence seeded
with :data:`FIDUCIAL_SEED` (the same data give the same interval every time). Its error is under
0.01 % of ``h`` (checked against 2^22 plain Monte Carlo draws and against 2^16 points); the
16,384 plain draws used before numtok-compare 0.1 left 1-2 % (issue 60).
With one dominant mean square ``h`` is the t interval with its df (exact for seeds alone:
``d̄_s.`` are then i.i.d.); in between it is wider than Satterthwaite's where Satterthwaite
undercovers. Its coverage over 3–8 seeds, 100–2,000 items and seed shares 0–100 % is in
``docs/statistics.md`` (``compare/studies/crossed_coverage.py``).

**The verdict** comes from that one interval: "better" or "worse" (the arm against the baseline,
given whether a higher score is better) when it excludes 0, "not shown" when it holds 0, and
"no verdict" with fewer than two seeds or items.

**The minimal detectable effect** at power P is ``(t(1 − α/2, ν) + t(P, ν))·SE`` (reported with
ν where ν ≥ 1 only: below it the t quantiles explode and say nothing): the usual
approximation that treats SE as known but takes both quantiles from the design's own ν, not
z's 2.80. **Planning**: :meth:`VarianceComponents.minimal_detectable_effect` evaluates the same
formula for another design (S', I') from the components (negative estimates read as 0), with ν
from the expected mean squares ``σ²_resid + I'·σ²_seed``, ``σ²_resid + S'·σ²_item`` and
``σ²_resid``; :func:`seeds_needed` and :func:`items_needed` search the smallest design whose MDE
reaches a target. The components are estimates, the seed one on S − 1 degrees of freedom, so a
plan is given again at their confidence limits
(:meth:`VarianceComponents.at_confidence_limits`): with 3 seeds "149 seeds" may be tens or
thousands.

**The MDE's power.** The formula is the t test's textbook approximation, which treats SE as
known. The verdict is read from the generalized interval, wider than ``t(ν)·SE`` with few seeds,
so an effect of the MDE is found less often than 80 %: simulated, 62–71 % with 3 seeds, 74–78 %
with 6 and 78–80 % with 8 (``docs/statistics.md``). Read it as a lower bound on what a design can
detect.

**Items nested in seeds** (``nested=True``: every seed draws its own I items, as the arithmetic
runs from scratch do): ``d[s, i] = μ + α_s + ε_si``, the item effects inside ε. A seed's mean
``d̄_s.`` is then i.i.d. over seeds with variance ``σ²_seed + σ²_ε/I``, so the interval is the
paired-seed t interval ``d̄ ± t(1 − α/2, S − 1)·SE`` with ``SE² = Σ_s (d̄_s. − d̄)²/(S(S − 1))``,
exact for normal seed means; its MDE takes the same S − 1 degrees of freedom, and there are no
components to plan with (``components`` is None).

**Equivalence** within a margin m > 0 set before the run (two one-sided tests at level α): the
``1 − 2α`` interval of the same kind inside ``(−m, m)`` is "equivalent"; entirely outside
``[−m, m]`` is "different" (a difference larger than the margin, one-sided level α); otherwise
"undecided".
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import special, stats
from scipy.stats import qmc

__all__ = [
    "FIDUCIAL_POINTS",
    "FIDUCIAL_SEED",
    "CrossedDifference",
    "Equivalence",
    "MeanSquares",
    "VarianceComponents",
    "crossed_difference",
    "equivalence",
    "generalized_half_widths",
    "items_needed",
    "mean_squares",
    "satterthwaite_df",
    "seeds_needed",
]

Array = NDArray[np.float64]
Verdict = Literal["better", "worse", "not shown", "no verdict"]
EquivalenceVerdict = Literal["equivalent", "different", "undecided", "no verdict"]

#: Quasi-random points of ``(W_seed, W_item, W_resid)`` behind every generalized interval; Z is
#: integrated exactly. The half-width is within 0.01 % of its limit (tests/test_crossed.py).
FIDUCIAL_POINTS = 2**12
#: The seed of the scrambled sequence: the same data give the same interval.
FIDUCIAL_SEED = 20_241_104

# ----------------------------------------------------------------------------------------------
# The decomposition


@dataclass(frozen=True)
class MeanSquares:
    """The two-way ANOVA mean squares of ``d[s, i]`` (module docstring) for S ``seeds`` and I
    ``items``."""

    seed: float
    item: float
    resid: float
    seeds: int
    items: int

    @property
    def variance_of_mean(self) -> float:
        """``(MS_seed + MS_item − MS_resid)/(S·I)``, the unbiased estimate of Var(d̄)."""
        return (self.seed + self.item - self.resid) / (self.seeds * self.items)

    @property
    def df(self) -> float:
        """Satterthwaite's degrees of freedom of :attr:`variance_of_mean` (``inf`` when every
        mean square is 0)."""
        return float(satterthwaite_df(self.seed, self.item, self.resid, self.seeds, self.items))


def satterthwaite_df(
    ms_seed: ArrayLike, ms_item: ArrayLike, ms_resid: ArrayLike, seeds: int, items: int
) -> Array:
    """``(MS_s + MS_i − MS_r)² / (MS_s²/(S−1) + MS_i²/(I−1) + MS_r²/((S−1)(I−1)))``; inf where
    the denominator is 0."""
    s, i, r = (np.asarray(v, dtype=np.float64) for v in (ms_seed, ms_item, ms_resid))
    denominator = s**2 / (seeds - 1) + i**2 / (items - 1) + r**2 / ((seeds - 1) * (items - 1))
    with np.errstate(divide="ignore", invalid="ignore"):
        df: Array = np.where(denominator > 0, (s + i - r) ** 2 / denominator, np.inf)
    return df


def mean_squares(differences: Array) -> tuple[Array, Array, Array]:
    """``(MS_seed, MS_item, MS_resid)`` of ``differences`` (..., S, I), each of shape (...),
    by the formulas of the module docstring; S ≥ 2 and I ≥ 2."""
    seeds, items = differences.shape[-2:]
    grand = differences.mean(axis=(-2, -1), keepdims=True)  # (..., 1, 1)
    by_seed = differences.mean(axis=-1, keepdims=True)  # (..., S, 1)
    by_item = differences.mean(axis=-2, keepdims=True)  # (..., 1, I)
    ms_seed = items * ((by_seed - grand) ** 2).sum(axis=(-2, -1)) / (seeds - 1)
    ms_item = seeds * ((by_item - grand) ** 2).sum(axis=(-2, -1)) / (items - 1)
    residual = differences - by_seed - by_item + grand  # (..., S, I)
    ms_resid = (residual**2).sum(axis=(-2, -1)) / ((seeds - 1) * (items - 1))
    return ms_seed, ms_item, ms_resid


@functools.cache
def _fiducial_inverses(seeds: int, items: int) -> Array:
    """``1/W_k`` for k = seed, item, resid at :data:`FIDUCIAL_POINTS` points (3, N):
    ``W_k = χ²(df_k)/df_k`` at the inverse CDF of a scrambled Sobol sequence (randomised
    quasi-Monte Carlo; seeded by :data:`FIDUCIAL_SEED`)."""
    sobol = qmc.Sobol(3, scramble=True, seed=FIDUCIAL_SEED)
    # A point at 0 would give W = 0; the sequence's smallest step is 2^-32.
    u = np.clip(sobol.random_base2(int(math.log2(FIDUCIAL_POINTS))), 2.0**-40, 1 - 2.0**-40)
    dfs = (seeds - 1, items - 1, (seeds - 1) * (items - 1))
    return np.stack([df / stats.chi2.ppf(u[:, k], df) for k, df in enumerate(dfs)])


def generalized_half_widths(
    ms_seed: ArrayLike,
    ms_item: ArrayLike,
    ms_resid: ArrayLike,
    seeds: int,
    items: int,
    confidence: float = 0.95,
) -> Array:
    """The half-width ``h`` of the generalized interval ``d̄ ± h`` (module docstring) for each
    triple of mean squares (broadcast together), vectorised for simulation studies: the root of
    ``mean_W[erf(h / √(2 V*))] = confidence``, where ``erf(h/√(2V*)) = P(|Z| ≤ h/√V*)``
    integrates Z exactly and the mean runs over the :data:`FIDUCIAL_POINTS` quasi-random points
    of ``W``. The left side is concave in h (a mixture of half-normal CDFs), so Newton's method
    from h = 0 rises to the root without overshooting it."""
    s, i, r = np.broadcast_arrays(
        *(np.asarray(v, dtype=np.float64) for v in (ms_seed, ms_item, ms_resid))
    )
    inv_seed, inv_item, inv_resid = _fiducial_inverses(seeds, items)
    flat = [v.reshape(-1, 1) for v in (s, i, r)]
    out = np.empty(flat[0].shape[0])
    chunk = 256  # rows of (chunk, FIDUCIAL_POINTS) at a time
    for start in range(0, out.size, chunk):
        rows = slice(start, start + chunk)
        v = flat[0][rows] * inv_seed + flat[1][rows] * inv_item - flat[2][rows] * inv_resid
        sd = np.sqrt(np.maximum(v, 0) / (seeds * items))  # (rows, N)
        with np.errstate(divide="ignore"):
            scale = np.where(sd > 0, 1 / (math.sqrt(2) * sd), np.inf)  # 1/(√2·sd)
        # d/dh erf(h·scale) = (2/√π)·scale·exp(−(h·scale)²); a point with sd = 0 adds nothing.
        density_scale = 2 / math.sqrt(math.pi) * np.where(sd > 0, scale, 0)
        h = np.zeros(sd.shape[0])
        for _ in range(_NEWTON_STEPS):
            with np.errstate(invalid="ignore"):  # 0·inf where h = 0 and sd = 0: erf(inf) = 1
                x = np.nan_to_num(h[:, None] * scale, nan=np.inf, posinf=np.inf)
            gap = confidence - special.erf(x).mean(axis=1)
            slope = (np.exp(-(x**2)) * density_scale).mean(axis=1)
            step = np.where((gap > 0) & (slope > 0), gap / np.where(slope > 0, slope, 1), 0)
            h += step
            if np.all(step <= 1e-12 * np.maximum(h, 1e-300)):
                break
        out[rows] = h
    return out.reshape(s.shape)


#: Newton's steps at most; from h = 0 it converges to 1e-12 in about 10 (tests/test_crossed.py).
_NEWTON_STEPS = 100


# ----------------------------------------------------------------------------------------------
# Components, power and planning


@dataclass(frozen=True)
class VarianceComponents:
    """The ANOVA estimates ``σ̂²_seed = (MS_seed − MS_resid)/I``, ``σ̂²_item = (MS_item −
    MS_resid)/S`` and ``σ̂²_resid = MS_resid`` (a negative estimate is kept as estimated; planning
    reads it as 0)."""

    seed: float
    item: float
    resid: float

    @classmethod
    def of(cls, squares: MeanSquares) -> VarianceComponents:
        return cls(
            seed=(squares.seed - squares.resid) / squares.items,
            item=(squares.item - squares.resid) / squares.seeds,
            resid=squares.resid,
        )

    def at_confidence_limits(
        self, seeds: int, items: int, *, confidence: float = 0.95
    ) -> tuple[VarianceComponents, VarianceComponents]:
        """The components with the seed and item mean squares of the S ``seeds`` × I ``items``
        run they were estimated from at their lower and at their upper ``confidence`` limits:
        ``E[MS_k]`` between ``MS_k·df_k/χ²(1 − α/2, df_k)`` and ``MS_k·df_k/χ²(α/2, df_k)``
        with ``df_seed = S − 1`` and ``df_item = I − 1`` (``MS_seed = σ̂²_resid + I·σ̂²_seed``,
        ``MS_item = σ̂²_resid + S·σ̂²_item``); ``MS_resid``, on ``(S − 1)(I − 1)`` degrees of
        freedom, is kept as estimated. Planning figures computed at the two ends show what the
        run's own noise in its components allows: with 3 seeds the seed component rests on 2
        degrees of freedom, and its 95 % limits are 0.27 and 39.5 times its estimate's mean
        square."""
        _check_design(seeds, items)
        _check_level("confidence", confidence)
        tail = (1 - confidence) / 2
        squares = {"seed": (self.resid + items * self.seed, seeds - 1),
                   "item": (self.resid + seeds * self.item, items - 1)}  # fmt: skip

        def at(quantile: float) -> VarianceComponents:
            seed, item = (
                square * df / float(stats.chi2.ppf(quantile, df)) for square, df in squares.values()
            )
            return VarianceComponents(
                seed=(seed - self.resid) / items, item=(item - self.resid) / seeds, resid=self.resid
            )

        return at(1 - tail), at(tail)

    def _planned(self) -> tuple[float, float, float]:
        return max(self.seed, 0.0), max(self.item, 0.0), max(self.resid, 0.0)

    def variance_of_mean(self, seeds: int, items: int) -> float:
        """``σ²_seed/S + σ²_item/I + σ²_resid/(S·I)`` for S ``seeds`` and I ``items``."""
        seed, item, resid = self._planned()
        return seed / seeds + item / items + resid / (seeds * items)

    def minimal_detectable_effect(
        self, seeds: int, items: int, *, confidence: float = 0.95, power: float = 0.8
    ) -> float:
        """``(t(1 − α/2, ν) + t(power, ν))·√Var(d̄)`` for a design of S ``seeds`` and I
        ``items``, ν Satterthwaite's from the expected mean squares (module docstring)."""
        _check_design(seeds, items)
        seed, item, resid = self._planned()
        df = satterthwaite_df(resid + items * seed, resid + seeds * item, resid, seeds, items)
        return _mde(math.sqrt(self.variance_of_mean(seeds, items)), float(df), confidence, power)


@functools.lru_cache(maxsize=256)
def _t(p: float, df: float) -> float:
    """Student's t quantile at one (p, df) (``scipy.stats.t.ppf``), remembered: the nested
    designs of a report, and of a simulation of them, ask for the same few."""
    return float(stats.t.ppf(p, df))


def _mde(se: float, df: float, confidence: float, power: float) -> float:
    return (_t(1 - (1 - confidence) / 2, df) + _t(power, df)) * se


def _check_design(seeds: int, items: int) -> None:
    for name, value in (("seeds", seeds), ("items", items)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 2:
            raise ValueError(f"{name} must be an int of at least 2, got {value!r}")


def _check_level(name: str, value: float) -> None:
    if not 0 < value < 1:
        raise ValueError(f"{name} must be in (0, 1), got {value!r}")


def seeds_needed(
    components: VarianceComponents,
    target_effect: float,
    *,
    items: int,
    confidence: float = 0.95,
    power: float = 0.8,
    max_seeds: int = 1000,
) -> int | None:
    """The fewest seeds (2 … ``max_seeds``) whose MDE with ``items`` items is at most
    ``target_effect``; None if even ``max_seeds`` do not reach it."""
    return _fewest(
        lambda n: components.minimal_detectable_effect(
            n, items, confidence=confidence, power=power
        ),
        target_effect,
        max_seeds,
    )


def items_needed(
    components: VarianceComponents,
    target_effect: float,
    *,
    seeds: int,
    confidence: float = 0.95,
    power: float = 0.8,
    max_items: int = 10_000_000,
) -> int | None:
    """The fewest items (2 … ``max_items``) whose MDE with ``seeds`` seeds is at most
    ``target_effect``; None if even ``max_items`` do not reach it (the seed component alone,
    ``σ²_seed/S``, may keep it above the target for any number of items)."""
    return _fewest(
        lambda n: components.minimal_detectable_effect(
            seeds, n, confidence=confidence, power=power
        ),
        target_effect,
        max_items,
    )


def _fewest(mde: Callable[[int], float], target: float, largest: int) -> int | None:
    """The smallest n in [2, largest] with ``mde(n) ≤ target`` (``mde`` falls as n grows), by
    bisection."""
    if not target > 0:
        raise ValueError(f"target_effect must be positive, got {target!r}")
    if mde(largest) > target:
        return None
    low, high = 2, largest  # mde(high) ≤ target
    if mde(low) <= target:
        return low
    while high - low > 1:  # mde(low) > target ≥ mde(high)
        middle = (low + high) // 2
        low, high = (low, middle) if mde(middle) <= target else (middle, high)
    return high


# ----------------------------------------------------------------------------------------------
# The comparison


@dataclass(frozen=True)
class CrossedDifference:
    """The difference ``mean(arm) − mean(baseline)`` over S ``seeds`` and I ``items`` and its
    analysis (module docstring). ``se``, ``df``, ``low``, ``high``, ``mde``, ``squares`` and
    ``components`` are None when ``verdict`` is "no verdict"; ``mde`` and ``df`` also when the
    estimate of Var(d̄) is not positive (``MS_seed + MS_item ≤ MS_resid``, for example two arms
    that differ by the same amount on every item: no noise to size an effect by); ``reason``
    says why the verdict is what it is, in one sentence."""

    difference: float
    seeds: int
    items: int
    confidence: float
    verdict: Verdict
    reason: str
    se: float | None = None
    df: float | None = None
    low: float | None = None
    high: float | None = None
    mde: float | None = None
    squares: MeanSquares | None = None
    components: VarianceComponents | None = None


def _differences(arm: ArrayLike, baseline: ArrayLike) -> Array:
    """``arm − baseline`` as float64 (S, I), both checked."""
    arrays = []
    for name, value in (("arm", arm), ("baseline", baseline)):
        array = np.asarray(value, dtype=np.float64)
        if array.ndim != 2 or 0 in array.shape:
            raise ValueError(
                f"{name} must be a non-empty (seeds, items) array, got shape {array.shape}"
            )
        if not np.isfinite(array).all():
            raise ValueError(
                f"{name} holds {int((~np.isfinite(array)).sum())} values that are not finite "
                "(score unparsed answers by a stated rule before the analysis)"
            )
        arrays.append(array)
    if arrays[0].shape != arrays[1].shape:
        raise ValueError(
            f"arm and baseline must score the same seeds and items, got shapes "
            f"{arrays[0].shape} and {arrays[1].shape}"
        )
    difference: Array = arrays[0] - arrays[1]
    return difference


def _refusal(seeds: int, items: int, nested: bool) -> str | None:
    """Why a design gives no interval (None: it gives one). Items nested in seeds need no item
    component: one item per seed is enough."""
    if seeds < 2:
        return (
            "one seed: the seed component of the variance cannot be estimated, so no interval "
            "and no verdict (run at least 2 seeds; 3 or more for useful power)"
        )
    if items < 2 and not nested:
        return "one item: the item component of the variance cannot be estimated, so no verdict"
    return None


def _nested_half_width(d: Array, confidence: float) -> tuple[float, float]:
    """``(half width, SE)`` of the paired-seed t interval of items nested in seeds (module
    docstring): the seeds' means are the i.i.d. observations."""
    seed_means = d.mean(axis=1)
    seeds = len(seed_means)
    se = float(seed_means.std(ddof=1)) / math.sqrt(seeds)
    return _t(1 - (1 - confidence) / 2, seeds - 1) * se, se


def crossed_difference(
    arm: ArrayLike,
    baseline: ArrayLike,
    *,
    higher_is_better: bool,
    confidence: float = 0.95,
    power: float = 0.8,
    nested: bool = False,
) -> CrossedDifference:
    """The difference of two arms' mean per-item scores on a crossed seed × item design (or,
    ``nested``, items nested in seeds), its interval, verdict and MDE (module docstring).

    Args:
        arm: (S, I) per-item scores of the arm, seed by seed, on the same items as ``baseline``.
        baseline: (S, I) the arm compared with (seed s of both shares initial weights and data).
        higher_is_better: True for a score such as 0/1 correctness, False for an error.
        confidence: of the interval.
        power: at which the MDE is computed.
        nested: each seed's items are its own (item i of two seeds are different items): the
            paired-seed t interval over the seeds' means.

    Example:
        >>> result = crossed_difference(
        ...     [[1.0, 2.0, 3.0], [2.0, 2.0, 4.0]], [[2.0, 3.0, 3.5], [2.5, 3.5, 4.5]],
        ...     higher_is_better=False)
        >>> round(result.difference, 4), result.verdict
        (-0.8333, 'not shown')
    """
    _check_level("confidence", confidence)
    _check_level("power", power)
    d = _differences(arm, baseline)
    seeds, items = d.shape
    estimate = float(d.mean())
    refusal = _refusal(seeds, items, nested)
    if refusal is not None:
        return CrossedDifference(estimate, seeds, items, confidence, "no verdict", refusal)
    squares = None
    if nested:
        half, se = _nested_half_width(d, confidence)
        df = float(seeds - 1)
    else:
        ms_seed, ms_item, ms_resid = (float(v) for v in mean_squares(d))
        squares = MeanSquares(ms_seed, ms_item, ms_resid, seeds, items)
        half = float(
            generalized_half_widths(
                squares.seed, squares.item, squares.resid, seeds, items, confidence
            )
        )
        se, df = math.sqrt(max(squares.variance_of_mean, 0.0)), squares.df
    low, high = estimate - half, estimate + half
    if low > 0 or high < 0:
        verdict: Verdict = "better" if (high < 0) != higher_is_better else "worse"
        reason = f"the {confidence:.0%} interval excludes 0"
    else:
        verdict, reason = "not shown", f"the {confidence:.0%} interval holds 0"
    # Below one degree of freedom the t quantiles say nothing (t(0.975, 0.1) is about 1.7e12):
    # no df and no MDE, where the interval itself still comes from the mean squares.
    sized = se > 0 and df >= 1
    return CrossedDifference(
        difference=estimate,
        seeds=seeds,
        items=items,
        confidence=confidence,
        verdict=verdict,
        reason=reason,
        se=se,
        df=df if sized else None,
        low=low,
        high=high,
        mde=_mde(se, df, confidence, power) if sized else None,
        squares=squares,
        components=None if squares is None else VarianceComponents.of(squares),
    )


@dataclass(frozen=True)
class Equivalence:
    """Two one-sided tests at level ``alpha`` within ``±margin`` (module docstring): ``low`` and
    ``high`` bound the ``1 − 2·alpha`` generalized interval (None with "no verdict")."""

    difference: float
    margin: float
    alpha: float
    verdict: EquivalenceVerdict
    reason: str
    low: float | None = None
    high: float | None = None


def equivalence(
    arm: ArrayLike,
    baseline: ArrayLike,
    *,
    margin: float,
    alpha: float = 0.05,
    nested: bool = False,
) -> Equivalence:
    """Whether ``mean(arm) − mean(baseline)`` lies within ``±margin``: "equivalent" when the
    ``1 − 2α`` interval (``nested``: the paired-seed t interval of items nested in seeds) is
    inside ``(−margin, margin)``, "different" when it lies entirely outside
    ``[−margin, margin]``, else "undecided"; "no verdict" with one seed or (crossed) one item.

    Example:
        >>> same = [[1.0, 2.0, 3.0], [2.0, 2.0, 4.0], [1.5, 2.5, 3.0]]
        >>> shifted = [[1.01, 2.0, 3.0], [2.0, 2.02, 4.0], [1.5, 2.5, 3.01]]
        >>> equivalence(same, shifted, margin=0.5).verdict
        'equivalent'
    """
    if not (isinstance(margin, (int, float)) and math.isfinite(margin) and margin > 0):
        raise ValueError(f"margin must be a positive number, got {margin!r}")
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha!r}")
    d = _differences(arm, baseline)
    seeds, items = d.shape
    estimate = float(d.mean())
    refusal = _refusal(seeds, items, nested)
    if refusal is not None:
        return Equivalence(estimate, margin, alpha, "no verdict", refusal)
    if nested:
        half = _nested_half_width(d, 1 - 2 * alpha)[0]
    else:
        half = float(generalized_half_widths(*mean_squares(d), seeds, items, 1 - 2 * alpha))
    low, high = estimate - half, estimate + half
    level = f"the {1 - 2 * alpha:.0%} interval"
    if -margin < low and high < margin:
        verdict: EquivalenceVerdict = "equivalent"
        reason = f"{level} lies inside ±{margin:g}"
    elif low > margin or high < -margin:
        verdict, reason = "different", f"{level} lies outside ±{margin:g}"
    else:
        verdict, reason = "undecided", f"{level} crosses ±{margin:g}"
    return Equivalence(estimate, margin, alpha, verdict, reason, low, high)
