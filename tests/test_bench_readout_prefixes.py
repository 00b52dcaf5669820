"""benchmarks/bench_readout_prefixes.py's counting on a tiny random Llama: exact scores every
prefix (the closed form of number_distribution's docstring, widest_level's widest level), a larger
tolerance never scores more nodes here and always stays within its bound on the unexplored mass,
and the oracle's fewest nodes never exceed what the rule scored."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from bench_readout_prefixes import (
    TOLERANCES,
    CountingScorer,
    OverLimitError,
    count_setting,
    fewest_nodes,
    number_mass,
)

from numtok import NumberVocab
from numtok.readout.distribution import number_distribution, widest_level
from numtok.readout.scorers import CachedScorer

# Ids 0-9 are the digits "0".."9" (and, in the mixed vocabulary, 10-109 are "00".."99"); the
# last two ids are text.
PROMPTS = [[110, 111, 110], [111], [110, 3, 111, 111, 110]]


def tiny_llama(vocab_size: int) -> Any:
    """A 2-layer Llama, hidden size 16, its output layer scaled so that its next-token
    distributions are peaked (a tolerance then has something to prune)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(60.0)
    return model


def digit_vocab() -> NumberVocab:
    return NumberVocab.from_values({i: str(i) for i in range(10)}, vocab_size=112)


def mixed_vocab() -> NumberVocab:
    digits = {i: str(i) for i in range(10)}
    pairs = {10 + i: f"{i:02d}" for i in range(100)}
    return NumberVocab.from_values({**digits, **pairs}, vocab_size=112)


@pytest.fixture(scope="module")
def model() -> Any:
    return tiny_llama(112)


def by_level(scorers: list[CountingScorer]) -> torch.Tensor:
    """(P, levels) extend rows per prompt and level, over the groups' scorers."""
    levels = max(len(s.prompt_of) for s in scorers)
    return torch.cat(
        [
            torch.nn.functional.pad(s.nodes_by_level(), (0, levels - len(s.prompt_of)))
            for s in scorers
        ]
    )


@pytest.mark.parametrize("digits", [1, 2, 3])
def test_counts_match_the_closed_form_and_shrink_within_the_bound(model: Any, digits: int) -> None:
    vocab = digit_vocab()
    counted = {}
    for tolerance in TOLERANCES:
        distribution, scorers = count_setting(
            model, vocab, PROMPTS, digits, tolerance, record=tolerance == 0, row_limit=None,
            node_limit=None,
        )  # fmt: skip
        counted[tolerance] = (distribution, scorers)
        # The prompt pass: one start() row per prompt (the "1 +" of the closed form).
        assert sum(s.start_rows for s in scorers) == len(PROMPTS)
        s = torch.cat([number_mass(scorer.start_log_probs, vocab, digits) for scorer in scorers])
        assert bool((s > 0).all()) and bool((s <= 1 + 1e-12).all())
        assert bool((distribution.pruned <= tolerance * s * (1 + 1e-9) + 1e-15).all())

    # Exact, single-digit tokens: level k holds every k-digit string, 10**k prefixes per prompt,
    # 10 + 100 + ... + 10**digits in all, and its widest level is widest_level's 10**digits.
    exact = by_level(counted[0.0][1])
    per_level = [10**k for k in range(1, digits + 1)]
    assert exact.tolist() == [per_level] * len(PROMPTS)
    assert int(exact.sum(dim=1)[0]) == (10 ** (digits + 1) - 10) // 9
    assert max(per_level) == widest_level(vocab, digits) == 10**digits
    assert float(counted[0.0][0].pruned.abs().max()) == 0.0

    # A larger tolerance scores no more nodes per prompt here, and the largest scores fewer than
    # exact, so the check is not empty. Not a theorem of the rule: level k's allowance is
    # k/digits of the budget less what the levels above left out, which a larger tolerance can
    # make smaller (a two-level tree can score 3 nodes at 0.01 and 6 at 0.0119); the tolerances
    # here are at least 3x apart.
    nodes = {t: by_level(scorers).sum(dim=1) for t, (_, scorers) in counted.items()}
    for smaller, larger in itertools.pairwise(TOLERANCES):
        assert bool((nodes[larger] <= nodes[smaller]).all()), (smaller, larger)
    if digits > 1:
        assert int(nodes[TOLERANCES[-1]].sum()) < int(nodes[0.0].sum())

    # The oracle, from the exact tree: never more nodes than the rule scored for the mass it left
    # out, nor (a looser bound) for tolerance · s.
    trees = [tree for scorer in counted[0.0][1] for tree in scorer.trees()]
    assert [sum(len(p) for _, p in tree) for tree in trees] == exact.sum(dim=1).tolist()
    for tolerance in TOLERANCES[1:]:
        distribution, scorers = counted[tolerance]
        for prompt, tree in enumerate(trees):
            s_prompt = float(tree[0][1].sum())
            cap = sum(len(p) for _, p in tree)
            bound, same = fewest_nodes(
                tree, [tolerance * s_prompt, float(distribution.pruned[prompt])], cap
            )
            assert same is not None and bound is not None
            assert bound <= same <= int(nodes[tolerance][prompt])


def test_exact_with_two_digit_tokens_matches_widest_level(model: Any) -> None:
    # "0".."9" and "00".."99", 2 digits: the first level holds all 110 tokens, the second a digit
    # after each single digit, 100; widest_level counts the same.
    vocab = mixed_vocab()
    _, scorers = count_setting(
        model, vocab, PROMPTS, 2, 0.0, record=False, row_limit=None, node_limit=None
    )
    assert by_level(scorers).tolist() == [[110, 100]] * len(PROMPTS)
    assert widest_level(vocab, 2) == 110


def test_a_limit_stops_before_the_call_that_passes_it(model: Any) -> None:
    vocab = digit_vocab()
    calls = []

    class Spy(CachedScorer):
        def extend(self, parents: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
            calls.append(len(parents))
            return super().extend(parents, tokens)

    inner = Spy(model, PROMPTS, pad_id=0, batch_size=None)
    scorer = CountingScorer(inner, vocab, node_limit=len(PROMPTS) * 10 + 5)
    with pytest.raises(OverLimitError, match="level 2"):
        number_distribution(scorer, vocab, max_digits=2)
    assert calls == [len(PROMPTS) * 10] and scorer.nodes == len(PROMPTS) * 10
    scorer = CountingScorer(Spy(model, PROMPTS, pad_id=0, batch_size=None), vocab, row_limit=29)
    with pytest.raises(OverLimitError, match="level 1 would score 30 prefixes"):
        number_distribution(scorer, vocab, max_digits=2)
