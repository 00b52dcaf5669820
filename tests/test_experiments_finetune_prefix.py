"""The fine-tuning harness runs the tokens a batch's prompts share once
(numtok_compare.finetune.prefix): on a tiny random Llama in float64 its answer logits, their
gradients (full fine-tuning and LoRA), the head's prompt states and the greedy answers are those
of running every row whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import numtok.readout.decoding
from numtok.readout.decoding import predict_numbers
from numtok.readout.distribution import FAST_TOLERANCE
from numtok_compare.finetune.arm import Trained, answer_logits, load_model, prompt_states
from numtok_compare.finetune.config import FinetuneConfig
from numtok_compare.finetune.evaluate import generate_answers, score_split
from numtok_compare.finetune.examples import IGNORE_INDEX, encode, prompt_batch, training_batch
from numtok_compare.finetune.prefix import decoder_states, shared_prefix_length

from _hf_tiny import build_tokenizer

#: Prompts "What is …?\n" share their first 8 tokens (the digit tokenizer reads characters);
#: their lengths differ, so the right-padded rows differ in length too.
SHARED = [("What is 7 + 30?", "37"), ("What is 123 - 23?", "100"), ("What is 5 + 5?", "10")]
#: No common first token: the rows run whole.
UNSHARED = [("What is 7 + 30?", "37"), ("1+1=", "2")]


def float64_model(tiny_llama_dir: Path, adaptation: str) -> Any:
    config = FinetuneConfig(
        model=str(tiny_llama_dir), adaptation=adaptation, lora_rank=2, threads=1
    )
    model = load_model(tiny_llama_dir, config, seed=0).double()
    torch.manual_seed(1)
    for name, parameter in model.named_parameters():
        if "lora_B" in name:  # zero at initialisation: A's gradients would be zero too
            parameter.data.normal_(std=0.3)
    return model


def whole_rows_logits(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The reference: every row through the whole causal LM, logits where the next label is an
    answer token."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    where = batch["labels"][:, 1:] != IGNORE_INDEX
    answer_positions: torch.Tensor = logits[:, :-1][where]
    return answer_positions


@given(st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=6), min_size=1, max_size=5))
def test_the_shared_prefix_is_the_longest_that_leaves_every_row_a_token(
    rows: list[list[int]],
) -> None:
    length = shared_prefix_length(rows)
    shortest = min(len(row) for row in rows)
    assert 0 <= length <= shortest - 1
    assert all(row[:length] == rows[0][:length] for row in rows)
    if length < shortest - 1:
        assert len({row[length] for row in rows}) > 1


def test_shared_prefix_examples() -> None:
    assert shared_prefix_length([[1, 2, 3, 4], [1, 2, 5]]) == 2
    assert shared_prefix_length([[1, 2, 3], [1, 2, 3]]) == 2
    assert shared_prefix_length([[1, 2, 3]]) == 2
    assert shared_prefix_length([[7], [7, 8]]) == 0


def batch_of(questions: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
    tokenizer = build_tokenizer()
    examples = [encode(tokenizer, question, answer) for question, answer in questions]
    return training_batch(examples, tokenizer.pad_token_id)


@pytest.mark.parametrize("adaptation", ["full", "lora"])
@pytest.mark.parametrize("questions", [SHARED, UNSHARED], ids=["shared", "unshared"])
def test_answer_logits_and_gradients_are_those_of_whole_rows(
    tiny_llama_dir: Path, adaptation: str, questions: list[tuple[str, str]]
) -> None:
    model = float64_model(tiny_llama_dir, adaptation)
    batch = batch_of(questions)
    _, shared = decoder_states(model.model.model if adaptation == "lora" else model.model,
                               batch["input_ids"], batch["attention_mask"])  # fmt: skip
    assert shared == (8 if questions is SHARED else 0)
    trainable = [p for p in model.parameters() if p.requires_grad]

    def gradients(logits: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
        return list(torch.autograd.grad(F.cross_entropy(logits, labels), trainable))

    logits, labels = answer_logits(model, batch)
    reference = whole_rows_logits(model, batch)
    next_labels = batch["labels"][:, 1:]
    assert labels.tolist() == next_labels[next_labels != IGNORE_INDEX].tolist()
    torch.testing.assert_close(logits, reference, rtol=1e-10, atol=1e-10)
    # LlamaRMSNorm normalises in float32 even in a float64 model, so the gradients agree to
    # float32's rounding (~2e-8 of the largest entry here); the prefix's keys and values cut off
    # from the graph would be off by ~1.
    for got, want in zip(gradients(logits, labels), gradients(reference, labels), strict=True):
        largest = float(want.abs().max())
        assert largest > 0
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6 * largest)


@pytest.mark.parametrize("questions", [SHARED, UNSHARED], ids=["shared", "unshared"])
def test_the_heads_prompt_states_are_those_of_whole_rows(
    tiny_llama_dir: Path, questions: list[tuple[str, str]]
) -> None:
    model = float64_model(tiny_llama_dir, "full")
    batch = batch_of(questions)
    hidden = model.model(input_ids=batch["input_ids"]).last_hidden_state  # right padding
    prompt_lengths = [len(build_tokenizer()(f"{q}\n")["input_ids"]) for q, _ in questions]
    expected = hidden[torch.arange(len(questions)), torch.tensor(prompt_lengths) - 1]
    torch.testing.assert_close(prompt_states(model, batch), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("questions", [SHARED, UNSHARED], ids=["shared", "unshared"])
def test_greedy_answers_are_those_of_whole_prompts(
    tiny_llama_dir: Path, questions: list[tuple[str, str]]
) -> None:
    """Against ``generate`` on the whole left-padded prompts: the same tokens, every row."""
    tokenizer = build_tokenizer()
    model = float64_model(tiny_llama_dir, "lora").eval()
    examples = [encode(tokenizer, question, answer) for question, answer in questions]
    whole = prompt_batch([e.prompt for e in examples], tokenizer.pad_token_id)
    generated = model.generate(
        **whole, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    expected = tokenizer.batch_decode(
        generated[:, whole["input_ids"].shape[1] :], skip_special_tokens=True
    )
    assert any(text for text in expected)
    assert generate_answers(model, tokenizer, examples, batch_size=3, new_tokens=6) == expected


def test_a_split_is_scored_by_every_readout_in_one_pass(
    tiny_llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """score_split with ``max_value``: the greedy texts are ``generate``'s (through the shared
    prompt pass), expected, median and mode those of the exact distribution within the
    unexplored mass it reports (mean: at most ``unexplored / (mass + unexplored)`` of 0..99)."""
    tokenizer = build_tokenizer()
    model = float64_model(tiny_llama_dir, "lora").eval()
    examples = [encode(tokenizer, question, answer) for question, answer in SHARED + UNSHARED]
    config = FinetuneConfig(model=str(tiny_llama_dir), max_value=99, max_digits=2, threads=1)
    trained = Trained(model, None, (0.0, 1.0))
    tolerances: list[float] = []
    distribution = numtok.readout.decoding.number_distribution

    def recording(*args: Any, **kwargs: Any) -> Any:
        tolerances.append(kwargs["tolerance"])
        return distribution(*args, **kwargs)

    monkeypatch.setattr(numtok.readout.decoding, "number_distribution", recording)
    scored = score_split(trained, tokenizer, config, examples)
    monkeypatch.undo()
    assert tolerances == [FAST_TOLERANCE]  # one pass over the split, read fast
    generated = generate_answers(model, tokenizer, examples, batch_size=3, new_tokens=8)
    assert scored["texts"] == generated and any(generated)
    prompts = [list(e.prompt) for e in examples]
    exact = predict_numbers(model, tokenizer, prompts, max_digits=2, max_value=99)
    fast = predict_numbers(
        model, tokenizer, prompts, max_digits=2, max_value=99,
        tolerance=FAST_TOLERANCE,
    )  # fmt: skip
    answers = scored["answers"]
    assert answers["expected"] == fast.mean.tolist()
    assert answers["median"] == fast.median.tolist()
    assert answers["mode"] == fast.mode.tolist()
    assert scored["unexplored"] == fast.pruned.tolist()
    moved = (fast.mean - exact.mean).abs()
    assert bool((moved <= fast.pruned / (fast.mass + fast.pruned) * 99 + 1e-9).all())


def test_the_readout_tolerance_is_the_configs(tiny_llama_dir: Path) -> None:
    """``readout_tolerance`` reaches the readouts: 0 scores them exactly (nothing unexplored),
    a large one leaves some mass unexplored, at most that share of each example's number mass
    (at most 1), and its means within the bound that mass puts on them."""
    tokenizer = build_tokenizer()
    model = float64_model(tiny_llama_dir, "lora").eval()
    examples = [encode(tokenizer, question, answer) for question, answer in SHARED + UNSHARED]
    trained = Trained(model, None, (0.0, 1.0))
    settings = {"model": str(tiny_llama_dir), "max_value": 99, "max_digits": 2, "threads": 1}
    prompts = [list(e.prompt) for e in examples]
    exact = predict_numbers(model, tokenizer, prompts, max_digits=2, max_value=99)
    scored = score_split(
        trained, tokenizer, FinetuneConfig(**settings, readout_tolerance=0), examples
    )
    assert scored["unexplored"] == [0.0] * len(examples)
    assert scored["answers"]["expected"] == exact.mean.tolist()
    loose = FinetuneConfig(**settings, readout_tolerance=0.5)
    read = score_split(trained, tokenizer, loose, examples)
    unexplored = torch.tensor(read["unexplored"], dtype=torch.float64)
    assert bool((unexplored > 0).any()) and bool((unexplored <= 0.5).all())
    fast = predict_numbers(model, tokenizer, prompts, max_digits=2, max_value=99, tolerance=0.5)
    assert read["answers"]["expected"] == fast.mean.tolist()
    moved = (fast.mean - exact.mean).abs()
    assert bool((moved <= unexplored / (fast.mass + unexplored) * 99 + 1e-9).all())


@pytest.mark.parametrize(
    ("tolerance", "error", "message"),
    [
        (-0.1, ValueError, r"readout_tolerance must be in \[0, 1\), got -0.1"),
        (1.0, ValueError, r"readout_tolerance must be in \[0, 1\), got 1.0"),
        ("0.1", TypeError, r"readout_tolerance must be a number in \[0, 1\), got '0.1'"),
        (True, TypeError, r"readout_tolerance must be a number in \[0, 1\), got True"),
    ],
)
def test_a_readout_tolerance_outside_0_to_1_is_refused(
    tolerance: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        FinetuneConfig(readout_tolerance=tolerance)
