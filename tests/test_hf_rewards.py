"""number_reward: the number a completion ends with against the reference, bounded in [0, 1]
and decreasing with the distance; strings and conversations; clear errors; and a real
GRPOTrainer step on the tiny model, whose logged reward is the function's on its completions."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

from numtok.hf import number_reward

from _hf_tiny import build_model, build_tokenizer


def test_the_reward_of_exact_near_far_and_missing_numbers() -> None:
    reward = number_reward("answer")
    completions = ["so it is 42", "43", "The answer: 84", "no idea", "-42", "4.2e1"]
    scores = reward(completions, answer=["42"] * 6)
    assert scores == pytest.approx([1.0, 1 / (1 + 1 / 42), 0.5, 0.0, 1 / 3, 1.0])
    assert reward.__name__ == "number_reward"  # what TRL logs it as


def test_scale_references_and_conversations() -> None:
    fixed = number_reward("target", scale=2.0)
    conversation = [[{"role": "assistant", "content": "x = 5"}]]
    assert fixed(conversation, target=[3]) == [0.5]
    assert number_reward()(["0.5"], answer=["#### 0"]) == [pytest.approx(1 / 1.5)]


def test_a_nearer_number_always_earns_more() -> None:
    reward = number_reward()
    distances = [0, 1, 2, 5, 10, 100, 1e6]
    scores = reward([str(7 + d) for d in distances], answer=[7] * len(distances))
    assert scores == sorted(scores, reverse=True) and 0 < scores[-1] < 1e-5 and scores[0] == 1


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match=r"column 'answer'.*passed: \['solution'\]"):
        number_reward()(["1"], solution=["1"])
    with pytest.raises(ValueError, match="must be a finite number or a text that ends with one"):
        number_reward()(["1"], answer=["none"])
    with pytest.raises(ValueError, match="scale must be a finite number > 0"):
        number_reward(scale=0)
    with pytest.raises(TypeError, match="a completion must be a string or a conversation"):
        number_reward()([3], answer=["3"])


def test_a_grpo_trainer_step(tmp_path: Path) -> None:
    # TRL's routes need TRL and datasets: absent where TRL cannot install (make test-versions'
    # floors, whose transformers is below TRL's own floor).
    datasets = pytest.importorskip("datasets")
    trl = pytest.importorskip("trl")

    tokenizer = build_tokenizer()
    tokenizer.padding_side = "left"
    reward = number_reward("answer")
    seen: list[tuple[list[Any], list[Any]]] = []

    def number_reward_seen(completions: list[Any], **columns: Any) -> list[float]:
        seen.append((completions, columns["answer"]))
        return reward(completions, **columns)

    data = datasets.Dataset.from_list(
        [{"prompt": "a+b=", "answer": "12"}, {"prompt": "z=", "answer": "44"}]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TRL's and transformers' deprecation notes
        args = trl.GRPOConfig(
            output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2,
            max_completion_length=4, max_steps=1, use_cpu=True, bf16=False, report_to="none",
            logging_steps=1, save_strategy="no", learning_rate=1e-3, seed=0,
        )  # fmt: skip
        trainer = trl.GRPOTrainer(
            model=build_model(tokenizer),
            reward_funcs=[number_reward_seen],
            args=args,
            train_dataset=data,
            processing_class=tokenizer,
        )
        trainer.train()
    completions, answers = seen[0]
    expected = sum(reward(completions, answer=answers)) / len(completions)
    logged = trainer.state.log_history[0]["rewards/number_reward_seen/mean"]
    assert logged == pytest.approx(expected)
