"""``mean_bound``: how far the exact mean can lie from a pruned table's mean.

Against an independent reference: the exact table (nothing pruned) on random models, whose mean
must lie within the bound whatever the pruning (``tolerance``, ``min_probability``,
``max_prefixes``, ``max_value``); and :func:`mean_bound` itself against a brute-force maximum over
every way the unexplored mass could be placed (each prefix's share at 0 or full, at its lowest
or largest number: the vertices of the box, where a linear-fractional maximum lies)."""

from __future__ import annotations

import itertools

import pytest
import torch

from numtok import NumberVocab
from numtok.readout.distribution import Unexplored, mean_bound, number_distribution

from test_readout import SequenceScorer, digit_vocab, mixed_vocab, random_logits

PRUNINGS = [
    {"tolerance": 1e-3},
    {"tolerance": 3e-2},
    {"tolerance": 0.2},
    {"min_probability": 0.01},
    {"max_prefixes": 2},
    {"tolerance": 3e-2, "max_value": 450},
]


@pytest.mark.parametrize("vocab", [digit_vocab(), mixed_vocab()], ids=["digits", "mixed"])
@pytest.mark.parametrize(
    "pruning", PRUNINGS, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items())
)
@pytest.mark.parametrize("scale", [1.0, 4.0], ids=["flat", "peaked"])
def test_the_exact_mean_lies_within_the_bound(
    vocab: NumberVocab, pruning: dict[str, float], scale: float
) -> None:
    logits = random_logits(vocab.vocab_size, scale=scale)
    prompts = [(0,), (1, 0, 1), (5,), (7, 3)]
    max_value = int(pruning.get("max_value", 999))
    exact = number_distribution(
        SequenceScorer(prompts, logits, torch.float64), vocab, max_digits=3, max_value=max_value
    )
    fast = number_distribution(
        SequenceScorer(prompts, logits, torch.float64), vocab, max_digits=3, **pruning
    )
    assert exact.mean_bound.tolist() == [0.0] * len(prompts)
    assert bool((fast.pruned > 0).any()), "the pruning must leave something out"
    read = ~torch.isnan(fast.mean)  # a prompt with no mass explored has no mean and no bound
    assert bool(read.any()) and bool(torch.isnan(fast.mean_bound[~read]).all())
    moved = (fast.mean - exact.mean).abs()[read]
    assert bool((moved <= fast.mean_bound[read] * (1 + 1e-9) + 1e-12).all()), (
        moved,
        fast.mean_bound,
    )
    # Never looser than the range bound pruned / (mass + pruned) · max_value ...
    loose = fast.pruned / (fast.mass + fast.pruned) * max_value
    assert bool((fast.mean_bound[read] <= loose[read] * (1 + 1e-12)).all())
    # ... and 0 exactly where nothing was left out.
    assert bool(((fast.mean_bound == 0) == (fast.pruned == 0))[read].all())


def brute_force_bound(
    mass: float, mean: float, low: list[int], high: list[int], p: list[float]
) -> float:
    """max |m* − m| over every prefix's mass at 0 or full and at its lowest or largest number."""
    best = 0.0
    for placed in itertools.product(*[(None, lo, hi) for lo, hi in zip(low, high, strict=True)]):
        weight = sum(q for q, at in zip(p, placed, strict=True) if at is not None)
        total = sum(q * at for q, at in zip(p, placed, strict=True) if at is not None)
        best = max(best, abs((mass * mean + total) / (mass + weight) - mean))
    return best


@pytest.mark.parametrize("seed", range(20))
def test_mean_bound_is_the_largest_move_over_every_placement(seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    prompts = 3
    count = 7
    prompt = torch.randint(0, prompts, (count,), generator=generator)
    low = torch.randint(0, 900, (count,), generator=generator)
    high = low + torch.randint(0, 100, (count,), generator=generator)
    probability = torch.rand(count, generator=generator, dtype=torch.float64) * 0.2
    mass = torch.rand(prompts, generator=generator, dtype=torch.float64) * 0.9 + 0.05
    mean = torch.rand(prompts, generator=generator, dtype=torch.float64) * 999
    bound = mean_bound(mass, mean, Unexplored(prompt, low, high, probability))
    for row in range(prompts):
        mine = prompt == row
        expected = brute_force_bound(
            float(mass[row]), float(mean[row]), low[mine].tolist(), high[mine].tolist(),
            probability[mine].tolist(),
        )  # fmt: skip
        assert float(bound[row]) == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_a_prompt_with_nothing_left_out_or_no_mass() -> None:
    unexplored = Unexplored(
        torch.tensor([1]), torch.tensor([10]), torch.tensor([19]), torch.tensor([0.1]).double()
    )
    mass = torch.tensor([0.5, 0.0]).double()
    mean = torch.tensor([3.0, torch.nan]).double()
    bound = mean_bound(mass, mean, unexplored)
    assert bound[0].item() == 0.0 and torch.isnan(bound[1])
