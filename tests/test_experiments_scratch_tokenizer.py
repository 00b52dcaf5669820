"""The from-scratch tokenizers (built with ``tokenizers``, used as Hugging Face tokenizers), the
example layout, the batches that keep the answer columns, and the small Llama's settings."""

from __future__ import annotations

import pytest

from numtok import NumberVocab
from numtok_compare.runner.batches import Encoded, answer_batch, training_batch
from numtok_compare.scratch.config import ExperimentConfig
from numtok_compare.scratch.tokenizer import character_tokenizer, encode_example, word_tokenizer


def _tokens(tokenizer: object, ids: tuple[int, ...]) -> list[str]:
    return tokenizer.convert_ids_to_tokens(list(ids))  # type: ignore[attr-defined, no-any-return]


def test_digits_are_the_only_number_tokens() -> None:
    for tokenizer in (character_tokenizer(), word_tokenizer(["a b 12 c"], max_words=5)):
        vocab = NumberVocab.from_tokenizer(tokenizer, multi_digit=False, prefixed=False)
        assert _tokens(tokenizer, tuple(vocab.ids.tolist())) == list("0123456789")
        assert vocab.values.tolist() == list(range(10))


def test_example_layout_puts_the_separator_after_the_prompt_and_eos_after_the_answer() -> None:
    tokenizer = character_tokenizer()
    example = encode_example(tokenizer, "What is 2+3?", "-5")
    assert _tokens(tokenizer, example.prompt) == [*"What is 2+3?", "<answer>"]
    assert _tokens(tokenizer, example.answer) == ["-", "5", "<eos>"]
    assert example.value == -5.0
    assert tokenizer.decode(example.answer, skip_special_tokens=True) == "-5"
    assert _tokens(tokenizer, encode_example(tokenizer, "café", "1").prompt)[3] == "<unk>"


def test_word_tokenizer() -> None:
    tokenizer = word_tokenizer(["The cat, the CAT 12!", "the dog's cat"], max_words=3)
    vocabulary = sorted(tokenizer.get_vocab(), key=tokenizer.get_vocab().get)
    # The special tokens, the digits, then "cat" and "the" 3 times each (ties alphabetically),
    # then "!", the first of the pieces seen once.
    assert vocabulary == ["<pad>", "<answer>", "<eos>", "<unk>", *"0123456789", "cat", "the", "!"]
    example = encode_example(tokenizer, "the cat 1 2 zebra", "10")
    assert _tokens(tokenizer, example.prompt) == ["the", "cat", "1", "2", "<unk>", "<answer>"]
    assert _tokens(tokenizer, example.answer) == ["1", "0", "<eos>"]
    cut = encode_example(tokenizer, "the cat the cat the cat", "3", max_prompt_tokens=4)
    assert _tokens(tokenizer, cut.prompt) == ["the", "cat", "the", "cat", "<answer>"]
    assert tokenizer.decode(example.answer, skip_special_tokens=True) == "10"
    with pytest.raises(ValueError, match="max_words must be a positive int, got 0"):
        word_tokenizer(["a"], max_words=0)


def test_the_answer_batch_keeps_the_columns_of_the_answers() -> None:
    examples = [Encoded((5, 6, 7, 1), (8, 2), 3.0), Encoded((5, 1), (8, 9, 2), 45.0)]
    kept = answer_batch(examples, pad_id=0)
    assert kept["input_ids"].tolist() == [[5, 6, 7, 1, 8, 2], [0, 5, 1, 8, 9, 2]]
    assert kept["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1]]
    assert kept["logits_to_keep"] == 4
    assert kept["labels"].tolist() == [[-100, -100, 8, 2], [-100, 8, 9, 2]]
    whole = training_batch(examples, pad_id=0)
    # The same labelled tokens, in the same order, as the right-padded rows.
    for row in range(2):
        labels = whole["labels"][row]
        assert labels[labels != -100].tolist() == [
            t for t in kept["labels"][row].tolist() if t != -100
        ]


def test_the_model_settings_are_checked() -> None:
    with pytest.raises(ValueError, match=r"d_model must be a multiple of 2 \* n_heads"):
        ExperimentConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="n_layers must be"):
        ExperimentConfig(n_layers=0)
