"""The fine-tuning harness scores a batch's prompts with the tokens they share run once
(numtok_compare.runner.scoring): on a tiny random Llama in float64 the greedy answers are those of
running every prompt whole; the head arm reads each prompt's last hidden state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import numtok.readout.decoding
from numtok.readout import shared_prefix_length
from numtok.readout.decoding import predict_numbers
from numtok.readout.distribution import FAST_TOLERANCE
from numtok_compare.finetune.arm import Trained, load_model
from numtok_compare.finetune.config import FinetuneConfig
from numtok_compare.finetune.evaluate import score_split
from numtok_compare.finetune.examples import encode
from numtok_compare.regression_head import RegressionHead
from numtok_compare.runner.batches import prompt_batch, training_batch
from numtok_compare.runner.scoring import generate_answers

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


@pytest.mark.parametrize("questions", [SHARED, UNSHARED], ids=["shared", "unshared"])
def test_the_head_reads_each_prompts_last_hidden_state(
    tiny_llama_dir: Path, questions: list[tuple[str, str]]
) -> None:
    """ŷ_b = w·h_b + c at row b's last prompt token (right-padded rows of different lengths);
    the loss is the mean squared error to the targets, and a new head predicts 0 (the mean)."""
    model = float64_model(tiny_llama_dir, "full")
    batch = batch_of(questions)
    head = RegressionHead(model.model, model.config.hidden_size).double()
    assert head.predict(**batch).abs().max() == 0
    torch.manual_seed(2)
    head.head.weight.data.normal_()
    head.head.bias.data.fill_(0.5)
    hidden = model.model(input_ids=batch["input_ids"]).last_hidden_state  # right padding
    prompt_lengths = [len(build_tokenizer()(f"{q}\n")["input_ids"]) for q, _ in questions]
    states = hidden[torch.arange(len(questions)), torch.tensor(prompt_lengths) - 1]
    expected = states @ head.head.weight[0] + 0.5
    torch.testing.assert_close(head.predict(**batch), expected, rtol=1e-10, atol=1e-10)
    targets = torch.arange(len(questions), dtype=torch.float64)
    output = head(**batch, targets=targets)
    torch.testing.assert_close(output["loss"], ((expected - targets) ** 2).mean())


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
