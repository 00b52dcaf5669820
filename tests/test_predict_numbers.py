"""predict_numbers on tiny Hugging Face causal LMs, against probabilities computed one unpadded
sequence at a time: Llama (rotary positions) and GPT-2 (absolute positions, where a padding
mistake would move every position)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from numtok import NumberVocab
from numtok.readout.decoding import predict_numbers

from _hf_tiny import build_model, build_tokenizer
from test_predict_numbers_cached import (
    CACHE_LAYERS,
    FALLBACK,
    expected_table,
    mixed_vocab,
    tiny_model,
)
from test_predict_numbers_cached import (
    PROMPTS as CACHED_PROMPTS,
)

PROMPTS = ["a+b=", "what is x? ", "z="]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer()


def sharpened(model: Any) -> Any:
    """Larger weights than the init, so that the next-token distributions are far from flat."""
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(4.0)
    return model.eval()


def llama(tokenizer: Any) -> Any:
    return sharpened(build_model(tokenizer, seed=3))


def gpt2(tokenizer: Any) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_embd=16, n_layer=2, n_head=2)
    torch.manual_seed(4)
    return sharpened(GPT2LMHeadModel(config))


@torch.no_grad()
def one_at_a_time(model: Any, prompt: list[int], vocab: NumberVocab) -> torch.Tensor:
    """P(v) for v < 100: each spelling (v, and 0v for v < 10) scored as its own batch of one."""
    digit_id = dict(zip(vocab.digits, vocab.ids.tolist(), strict=True))
    table = torch.zeros(100, dtype=torch.float64)

    def next_probabilities(sequence: list[int]) -> torch.Tensor:
        logits = model(input_ids=torch.tensor([sequence])).logits[0, -1]
        return torch.softmax(logits.double(), dim=0)

    for first in "0123456789":
        p1 = next_probabilities(prompt)[digit_id[first]]
        after_one = next_probabilities([*prompt, digit_id[first]])
        table[int(first)] += p1 * (1 - after_one[vocab.ids].sum())
        for second in "0123456789":
            p2 = after_one[digit_id[second]]
            after_two = next_probabilities([*prompt, digit_id[first], digit_id[second]])
            table[int(first + second)] += p1 * p2 * (1 - after_two[vocab.ids].sum())
    return table


@pytest.mark.parametrize("build", [llama, gpt2], ids=["llama", "gpt2"])
def test_matches_sequences_scored_one_at_a_time(build: Any, tokenizer: Any) -> None:
    model = build(tokenizer)
    vocab = NumberVocab.from_tokenizer(tokenizer)
    # A batch of 7 mixes prompts of different lengths and depths of the tree: padding is tested.
    result = predict_numbers(model, tokenizer, PROMPTS, batch_size=7)
    for row, prompt in enumerate(PROMPTS):
        ids = tokenizer(prompt)["input_ids"]
        expected = one_at_a_time(model, ids, vocab)
        torch.testing.assert_close(result.probabilities[row], expected, rtol=1e-5, atol=1e-8)
        values = torch.arange(100, dtype=torch.float64)
        mass = expected.sum()
        assert float(result.mass[row]) == pytest.approx(float(mass), rel=1e-5)
        assert float(result.number[row]) == pytest.approx(float(expected @ values / mass), 1e-5)
        assert float(result.number[row]) == float(result.mean[row])
    assert bool((result.mass > 0.01).all()), "the test needs models that write numbers"


def test_readouts_and_token_id_prompts(tokenizer: Any) -> None:
    model = llama(tokenizer)
    vocab = NumberVocab.from_tokenizer(tokenizer)
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    by_text = predict_numbers(model, tokenizer, PROMPTS, readout="median")
    by_ids = predict_numbers(model, vocab, ids, readout="mode")
    torch.testing.assert_close(by_text.probabilities, by_ids.probabilities)
    assert torch.equal(by_text.number, by_text.median)
    assert torch.equal(by_ids.number, by_ids.mode)
    assert torch.equal(by_ids.mode, by_ids.probabilities.argmax(dim=1).double())
    assert model.training is False
    model.train()
    predict_numbers(model, vocab, ids[:1], max_digits=1)
    assert model.training is True, "the model's mode is put back"


def test_bad_input(tokenizer: Any) -> None:
    model = llama(tokenizer)
    vocab = NumberVocab.from_tokenizer(tokenizer)
    with pytest.raises(TypeError, match="prompts must be a list of strings"):
        predict_numbers(model, tokenizer, "a+b=")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one prompt"):
        predict_numbers(model, tokenizer, [])
    with pytest.raises(TypeError, match=r"prompts\[1\] must be a string or a non-empty list"):
        predict_numbers(model, tokenizer, ["a=", 7])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="a NumberVocab cannot tokenize text"):
        predict_numbers(model, vocab, ["a="])
    with pytest.raises(ValueError, match=r"max_digits must be between 1 and 5.*got 0"):
        predict_numbers(model, tokenizer, ["a="], max_digits=0)
    with pytest.raises(ValueError, match="readout must be one of"):
        predict_numbers(model, tokenizer, ["a="], readout="mean")
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        predict_numbers(model, tokenizer, ["a="], batch_size=0)
    letters_only = NumberVocab.from_values({5: "5"}, vocab_size=len(tokenizer) + 3)
    with pytest.raises(ValueError, match="expects vocab_size"):
        predict_numbers(model, letters_only, [[3, 4]])


def test_a_tokenizer_without_number_tokens_is_refused() -> None:
    from tokenizers import pre_tokenizers

    from conftest import _fast_tokenizer

    tokenizer = _fast_tokenizer(["<pad>", "<unk>", *"abc="], pre_tokenizers.Split("", "isolated"))
    model = build_model(tokenizer)
    with pytest.raises(ValueError, match="number token"):
        predict_numbers(model, tokenizer, ["a="])


@pytest.mark.skipif(CACHE_LAYERS, reason="transformers 4.56 and later: the cache serves")
def test_before_cache_layers_the_readout_falls_back_exactly() -> None:
    """Before transformers 4.56 (a tuple from 4.46's models, a DynamicCache without layers from
    4.48's) predict_numbers says once that it scores every sequence whole, and is exact."""
    model = tiny_model("llama", seed=8)
    vocab = mixed_vocab()
    with pytest.warns(UserWarning, match=FALLBACK) as caught:
        result = predict_numbers(model, vocab, CACHED_PROMPTS, max_digits=2)
    assert len([w for w in caught if FALLBACK in str(w.message)]) == 1
    for row, prompt in enumerate(CACHED_PROMPTS):
        expected = expected_table(model, vocab, prompt, 2)
        torch.testing.assert_close(result.probabilities[row], expected, rtol=1e-5, atol=1e-9)
