"""number_distribution against a brute-force enumeration written independently: every token
sequence that spells a number, its probability from a float64 softmax at each step."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from numtok import NumberVocab
from numtok.readout.distribution import number_distribution

Logits = Callable[[tuple[int, ...]], torch.Tensor]


def random_logits(vocab_size: int, *, scale: float) -> Logits:
    """Deterministic logits for every token sequence: a seeded draw keyed by the sequence."""

    def logits(sequence: tuple[int, ...]) -> torch.Tensor:
        key = 0
        for token in sequence:
            key = (key * 1_000_003 + token + 1) % 2**61
        generator = torch.Generator().manual_seed(key)
        return scale * torch.randn(vocab_size, generator=generator, dtype=torch.float64)

    return logits


class SequenceScorer:
    """A NextTokenScorer over a logits function: it keeps the sequences and scores them whole."""

    def __init__(self, prompts: Sequence[tuple[int, ...]], logits: Logits, dtype: torch.dtype):
        self.sequences = list(prompts)
        self.logits = logits
        self.dtype = dtype

    def _score(self) -> torch.Tensor:
        return torch.stack([self.logits(s) for s in self.sequences]).to(self.dtype)

    def start(self) -> torch.Tensor:
        return self._score()

    def extend(self, parents: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        self.sequences = [
            (*self.sequences[p], t) for p, t in zip(parents.tolist(), tokens.tolist(), strict=True)
        ]
        return self._score()


def brute_force(
    prompt: tuple[int, ...], vocab: NumberVocab, logits: Logits, max_digits: int
) -> dict[int, float]:
    """P(v) by walking every spelling, as the docstring of number_distribution defines it."""
    tokens = dict(zip(vocab.ids.tolist(), vocab.digits, strict=True))
    table: dict[int, float] = {}

    def walk(sequence: tuple[int, ...], digits: str, probability: float) -> None:
        p = torch.softmax(logits(prompt + sequence), dim=0).tolist()
        if sequence:
            continuing = sum(p[t] for t in tokens if t not in vocab.word_start_ids)
            table[int(digits)] = table.get(int(digits), 0.0) + probability * (1 - continuing)
        for token, text in tokens.items():
            if sequence and token in vocab.word_start_ids:
                continue
            if len(digits) + len(text) <= max_digits:
                walk((*sequence, token), digits + text, probability * p[token])

    walk((), "", 1.0)
    return table


def digit_vocab(vocab_size: int = 14) -> NumberVocab:
    return NumberVocab.from_values({i + 2: str(i) for i in range(10)}, vocab_size=vocab_size)


def mixed_vocab() -> NumberVocab:
    """Digits, the 2- and 3-digit tokens "12", "007", "45", and word-start tokens "▁3", "▁12"."""
    digits = {i: str(i) for i in range(10)}
    return NumberVocab.from_values(
        {**digits, 10: "12", 11: "007", 12: "45", 13: "3", 14: "12"},
        vocab_size=17,
        word_start_ids=(13, 14),
    )


@pytest.mark.parametrize("vocab", [digit_vocab(), mixed_vocab()], ids=["digits", "mixed"])
@pytest.mark.parametrize("max_digits", [1, 2, 3])
def test_matches_brute_force_enumeration(vocab: NumberVocab, max_digits: int) -> None:
    logits = random_logits(vocab.vocab_size, scale=2.0)
    prompts = [(0,), (1, 0, 1), (15 % vocab.vocab_size,)]
    result = number_distribution(
        SequenceScorer(prompts, logits, torch.float64), vocab, max_digits=max_digits
    )
    assert result.probabilities.shape == (3, 10**max_digits)
    for row, prompt in enumerate(prompts):
        expected = torch.zeros(10**max_digits, dtype=torch.float64)
        for value, probability in brute_force(prompt, vocab, logits, max_digits).items():
            expected[value] = probability
        torch.testing.assert_close(result.probabilities[row], expected, rtol=1e-12, atol=1e-15)
        mass = float(expected.sum())
        assert 0 < mass <= 1
        assert float(result.mass[row]) == pytest.approx(mass, rel=1e-12)
        values = torch.arange(10**max_digits, dtype=torch.float64)
        assert float(result.mean[row]) == pytest.approx(float(expected @ values) / mass)
        cumulative = torch.cumsum(expected, 0) / mass
        assert int(result.median[row]) == int((cumulative < 0.5).sum())
        assert int(result.mode[row]) == int(expected.argmax())


class RecordingScorer:
    """A scorer that appends to ``rows`` how many rows of logits each of its calls returns."""

    def __init__(self, scorer: Any, rows: list[int]) -> None:
        self.scorer = scorer
        self.rows = rows

    def start(self) -> torch.Tensor:
        return self._record(self.scorer.start())

    def extend(self, parents: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return self._record(self.scorer.extend(parents, tokens))

    def _record(self, logits: torch.Tensor) -> torch.Tensor:
        self.rows.append(logits.shape[0])
        return logits


@pytest.mark.parametrize("vocab", [digit_vocab(), mixed_vocab()], ids=["digits", "mixed"])
@pytest.mark.parametrize(("max_digits", "max_value"), [(1, 0), (1, 7), (2, 11), (2, 45), (3, 120)])
def test_a_largest_value_keeps_the_table_up_to_it_and_scores_less(
    vocab: NumberVocab, max_digits: int, max_value: int
) -> None:
    logits = random_logits(vocab.vocab_size, scale=2.0)
    prompts = [(0,), (1, 0, 1)]
    every: list[int] = []
    capped: list[int] = []
    full = number_distribution(
        RecordingScorer(SequenceScorer(prompts, logits, torch.float64), every),
        vocab,
        max_digits=max_digits,
    )
    result = number_distribution(
        RecordingScorer(SequenceScorer(prompts, logits, torch.float64), capped),
        vocab,
        max_digits=max_digits,
        max_value=max_value,
    )
    # P(v) does not depend on which other numbers are enumerated.
    expected = full.probabilities.clone()
    expected[:, max_value + 1 :] = 0
    torch.testing.assert_close(result.probabilities, expected, rtol=1e-12, atol=0)
    torch.testing.assert_close(result.mass, expected.sum(dim=1), rtol=1e-12, atol=0)
    values = torch.arange(10**max_digits, dtype=torch.float64)
    torch.testing.assert_close(result.mean, expected @ values / expected.sum(dim=1))
    assert bool((result.median <= max_value).all()) and bool((result.mode <= max_value).all())
    assert sum(capped) < sum(every)
    if vocab == digit_vocab() and (max_digits, max_value) == (2, 11):
        # The prompt, its ten digits, then 0-9 after "0" and 0-1 after "1": 23 instead of 111.
        assert (sum(capped), sum(every)) == (23 * len(prompts), 111 * len(prompts))


def test_float32_logits_agree_with_float64() -> None:
    vocab = mixed_vocab()
    logits = random_logits(vocab.vocab_size, scale=3.0)
    prompts = [(0,), (5, 6)]
    exact = number_distribution(SequenceScorer(prompts, logits, torch.float64), vocab)
    single = number_distribution(SequenceScorer(prompts, logits, torch.float32), vocab)
    torch.testing.assert_close(single.probabilities, exact.probabilities, rtol=1e-5, atol=1e-7)


def certain(spelling: Sequence[int], vocab_size: int, end: int) -> Logits:
    """A model that writes ``spelling`` after any prompt, then the token ``end``."""

    def logits(sequence: tuple[int, ...]) -> torch.Tensor:
        written = len(sequence) - 1  # every prompt here is one token long
        out = torch.full((vocab_size,), -math.inf, dtype=torch.float64)
        out[spelling[written] if written < len(spelling) else end] = 0.0
        return out

    return logits


def test_a_certain_number_is_read_exactly() -> None:
    vocab = digit_vocab()
    logits = certain([2 + 4, 2 + 2], vocab.vocab_size, end=0)  # "4" "2" then a non-number
    result = number_distribution(SequenceScorer([(1,)], logits, torch.float64), vocab)
    assert result.mass.tolist() == [1.0]
    assert result.mean.tolist() == result.median.tolist() == result.mode.tolist() == [42.0]


def test_longer_numbers_and_other_tokens_are_the_uncovered_mass() -> None:
    vocab = digit_vocab()
    three_digits = certain([3, 3, 3], vocab.vocab_size, end=0)  # "111"
    result = number_distribution(
        SequenceScorer([(1,)], three_digits, torch.float64), vocab, max_digits=2
    )
    assert result.mass.tolist() == [0.0]
    assert math.isnan(float(result.mean[0])) and math.isnan(float(result.median[0]))
    words = certain([], vocab.vocab_size, end=0)  # a non-number at once
    result = number_distribution(SequenceScorer([(1,)], words, torch.float64), vocab)
    assert result.mass.tolist() == [0.0]


def test_a_word_start_token_begins_a_second_number() -> None:
    vocab = mixed_vocab()
    # "1" then "▁3": the number is 1, the "▁3" starts another one.
    logits = certain([1, 13], vocab.vocab_size, end=15)
    result = number_distribution(SequenceScorer([(16,)], logits, torch.float64), vocab)
    assert result.mode.tolist() == [1.0] and result.mass.tolist() == [1.0]
    # "▁12" then "007" is 12007: five digits, beyond max_digits=4, so nothing is covered.
    logits = certain([14, 11], vocab.vocab_size, end=15)
    result = number_distribution(
        SequenceScorer([(16,)], logits, torch.float64), vocab, max_digits=4
    )
    assert result.mass.tolist() == [0.0]


def test_pruning_keeps_a_lower_bound_of_the_exact_table() -> None:
    vocab = digit_vocab()
    logits = random_logits(vocab.vocab_size, scale=3.0)
    prompts = [(0,), (1,)]
    exact = number_distribution(SequenceScorer(prompts, logits, torch.float64), vocab)
    pruned = number_distribution(
        SequenceScorer(prompts, logits, torch.float64), vocab, min_probability=0.02
    )
    assert bool((pruned.probabilities <= exact.probabilities + 1e-15).all())
    assert bool((pruned.mass < exact.mass).all())
    assert exact.pruned.tolist() == [0.0, 0.0]
    # What pruning lost lies under the pruned prefixes, whose probability bounds it.
    lost = exact.mass - pruned.mass
    assert bool((lost <= pruned.pruned + 1e-15).all()) and bool((pruned.pruned > 0).all())
    # 10-99 have one spelling each, so a kept one is complete; 0-9 also have "0v", maybe pruned.
    kept = pruned.probabilities[:, 10:] > 0
    assert bool(kept.any())
    torch.testing.assert_close(
        pruned.probabilities[:, 10:][kept], exact.probabilities[:, 10:][kept], rtol=1e-12, atol=0
    )


def number_mass(prompt: tuple[int, ...], vocab: NumberVocab, logits: Logits) -> float:
    """s: the float64 probability that the continuation starts with a number token."""
    return float(torch.softmax(logits(prompt), dim=0)[vocab.ids].sum())


@pytest.mark.parametrize("vocab", [digit_vocab(), mixed_vocab()], ids=["digits", "mixed"])
@pytest.mark.parametrize(("max_digits", "tolerance"), [(2, 1e-2), (3, 1e-3), (3, 1e-2)])
def test_a_tolerance_scores_fewer_prefixes_within_its_bound(
    vocab: NumberVocab, max_digits: int, tolerance: float
) -> None:
    """Against the exact table: what the fast one leaves out weighs at most ``pruned``, which is
    at most ``tolerance · s``, and the mean moves by at most ``pruned / (mass + pruned)`` of the
    values' range; it scores fewer prefixes."""
    logits = random_logits(vocab.vocab_size, scale=4.0)  # peaked, as a trained model's
    prompts = [(0,), (1, 0, 1), (15 % vocab.vocab_size,)]
    every: list[int] = []
    likely: list[int] = []
    exact = number_distribution(
        RecordingScorer(SequenceScorer(prompts, logits, torch.float64), every),
        vocab,
        max_digits=max_digits,
    )
    fast = number_distribution(
        RecordingScorer(SequenceScorer(prompts, logits, torch.float64), likely),
        vocab,
        max_digits=max_digits,
        tolerance=tolerance,
    )
    assert sum(likely) < sum(every) / 2
    assert bool((fast.pruned > 0).all()), "the tolerance must leave something out"
    bound = torch.tensor([tolerance * number_mass(p, vocab, logits) for p in prompts])
    assert bool((fast.pruned <= bound * (1 + 1e-12)).all())
    assert bool((fast.probabilities <= exact.probabilities * (1 + 1e-12) + 1e-300).all())
    lost = exact.mass - fast.mass
    assert bool((lost >= -1e-15).all()) and bool((lost <= fast.pruned * (1 + 1e-9)).all())
    spread = 10**max_digits - 1
    moved = (fast.mean - exact.mean).abs()
    assert bool((moved <= fast.pruned / (fast.mass + fast.pruned) * spread + 1e-9).all())
    assert bool((moved <= tolerance * spread * exact.mass.reciprocal()).all())


def test_a_zero_tolerance_is_the_exact_table() -> None:
    vocab = mixed_vocab()
    logits = random_logits(vocab.vocab_size, scale=4.0)
    exact = number_distribution(SequenceScorer([(0,)], logits, torch.float64), vocab, max_digits=2)
    zero = number_distribution(
        SequenceScorer([(0,)], logits, torch.float64), vocab, max_digits=2, tolerance=0.0
    )
    assert torch.equal(zero.probabilities, exact.probabilities)
    assert zero.pruned.tolist() == [0.0]


@pytest.mark.parametrize("max_prefixes", [1, 3])
def test_max_prefixes_caps_each_level_and_counts_the_rest_as_pruned(max_prefixes: int) -> None:
    vocab = digit_vocab()
    logits = random_logits(vocab.vocab_size, scale=1.0)  # flat: the cap decides
    prompts = [(0,), (1,)]
    rows: list[int] = []
    exact = number_distribution(SequenceScorer(prompts, logits, torch.float64), vocab, max_digits=3)
    capped = number_distribution(
        RecordingScorer(SequenceScorer(prompts, logits, torch.float64), rows),
        vocab,
        max_digits=3,
        max_prefixes=max_prefixes,
    )
    assert rows == [2] + [2 * max_prefixes] * 3
    lost = exact.mass - capped.mass
    assert bool((lost > 0).all()) and bool((lost <= capped.pruned * (1 + 1e-9)).all())
    # The most likely first digit b is kept: its one-token spelling "b" is in its table entry
    # (all of it with one prefix per level: "0b" needs the prefix "0", left out unless b = 0).
    for row, prompt in enumerate(prompts):
        first = torch.softmax(logits(prompt), dim=0)[vocab.ids]
        best = int(first.argmax())
        after = torch.softmax(logits((*prompt, int(vocab.ids[best]))), dim=0)[vocab.ids]
        spelled_once = float(first[best] * (1 - after.sum()))
        table = float(capped.probabilities[row, best])
        if max_prefixes == 1 and best != 0:
            assert table == pytest.approx(spelled_once, rel=1e-12)
        else:
            assert table >= spelled_once * (1 - 1e-12)


def test_bad_input() -> None:
    vocab = digit_vocab()
    logits = random_logits(vocab.vocab_size, scale=1.0)

    def scorer(dtype: torch.dtype = torch.float64) -> SequenceScorer:
        return SequenceScorer([(0,)], logits, dtype)

    for bad in (0, 6):
        with pytest.raises(ValueError, match=rf"max_digits must be between 1 and 5.*got {bad}"):
            number_distribution(scorer(), vocab, max_digits=bad)
    with pytest.raises(TypeError, match="max_digits must be an int, got '2'"):
        number_distribution(scorer(), vocab, max_digits="2")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"max_value must be an int or None, got 2\.5"):
        number_distribution(scorer(), vocab, max_value=2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_value must be a non-negative int, got -1"):
        number_distribution(scorer(), vocab, max_value=-1)
    for bad_probability in (-0.1, 1.0):
        with pytest.raises(ValueError, match="min_probability must be in"):
            number_distribution(scorer(), vocab, min_probability=bad_probability)
        with pytest.raises(
            ValueError, match=rf"tolerance must be in \[0, 1\), got {bad_probability}"
        ):
            number_distribution(scorer(), vocab, tolerance=bad_probability)
    with pytest.raises(TypeError, match=r"tolerance must be a number in .*got '0\.1'"):
        number_distribution(scorer(), vocab, tolerance="0.1")  # type: ignore[arg-type]
    for bad_count in (0, 2.0, True):
        with pytest.raises(
            ValueError, match=f"max_prefixes must be a positive int or None, got {bad_count}"
        ):
            number_distribution(scorer(), vocab, max_prefixes=bad_count)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be a NumberVocab"):
        number_distribution(scorer(), {1: "1"})  # type: ignore[arg-type]
    fractions = NumberVocab.from_values({2: 0.5, 3: 1.5}, vocab_size=14)
    with pytest.raises(ValueError, match=r"token id 2 has the value '0\.5'"):
        number_distribution(scorer(), fractions)
    wider = digit_vocab(vocab_size=20)
    with pytest.raises(ValueError, match="logits have 14 columns but the NumberVocab expects"):
        number_distribution(scorer(), wider)

    class FlatScorer(SequenceScorer):
        def start(self) -> torch.Tensor:
            return super().start()[0]

    with pytest.raises(ValueError, match=r"start\(\) must return logits of shape"):
        number_distribution(FlatScorer([(0,)], logits, torch.float64), vocab)

    class ShortScorer(SequenceScorer):
        def extend(self, parents: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
            return super().extend(parents, tokens)[:-1]

    with pytest.raises(ValueError, match=r"logits of shape \(10, V\), one row per sequence"):
        number_distribution(ShortScorer([(0,)], logits, torch.float64), vocab)
