"""Batches: a function of (seed, step), and packing that changes nothing but the speed."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from numtok_compare.scratch.batches import TrainingSet, pack
from numtok_compare.scratch.model import ModelConfig, Transformer
from numtok_compare.scratch.tokenizer import CharTokenizer

QUESTIONS = [
    ("What is -150 take away -13?", "-137"),
    ("1+1", "2"),
    ("Sum 4315.5 and -0.1.", "4315.4"),
    ("What is the difference between 6694.233969 and 4?", "6690.233969"),
    ("-21 + -214.1", "-235.1"),
    ("Calculate -0.023 - 13.", "-13.023"),
    ("Add together -2944961 and 163.72.", "-2944797.28"),
]


@pytest.fixture(scope="module")
def training() -> TrainingSet:
    return TrainingSet(QUESTIONS * 7, CharTokenizer())  # 49 examples


def test_each_epoch_is_a_permutation_and_steps_are_reproducible(training: TrainingSet) -> None:
    batch = 5
    per_epoch = len(training) // batch  # 9 full steps, then one that straddles two epochs
    first_epoch = [training.batch_indices(0, s, batch) for s in range(per_epoch)]
    seen = [int(i) for indices in first_epoch for i in indices]
    assert len(set(seen)) == len(seen) == per_epoch * batch
    straddling = training.batch_indices(0, per_epoch, batch)
    assert set(straddling[:4].tolist()) == set(range(len(training))) - set(seen)
    fresh = TrainingSet(QUESTIONS * 7, CharTokenizer())
    assert (fresh.batch_indices(0, 3, batch) == first_epoch[3]).all()
    assert not (training.batch_indices(1, 3, batch) == first_epoch[3]).all()


def test_packing_keeps_every_token_once_and_respects_capacity(training: TrainingSet) -> None:
    examples = training.examples[:7]
    packed = pack(examples, capacity=64, pad_id=0)
    rows, width = packed.inputs.shape
    assert width <= max(64, max(len(x) for x, _ in examples))
    assert rows < len(examples)  # several examples share rows
    real = packed.labels != -100
    assert int(real.sum()) == sum(int((labels != -100).sum()) for _, labels in examples)
    # Positions restart at 0 at the start of every example.
    assert int((packed.positions == 0).sum()) - int((packed.inputs == 0).sum()) >= len(examples)


def test_packed_batch_gives_the_loss_and_gradient_of_separate_examples(
    training: TrainingSet,
) -> None:
    torch.manual_seed(0)
    model = Transformer(ModelConfig(len(CharTokenizer()), d_model=32, n_layers=2, n_heads=2))
    examples = training.examples[:7]

    def gradient_of(loss: torch.Tensor) -> torch.Tensor:
        model.zero_grad()
        loss.backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    packed = pack(examples, capacity=64, pad_id=0)
    logits = model(packed.inputs, positions=packed.positions, allowed=packed.allowed)
    packed_loss = F.cross_entropy(logits.flatten(0, 1), packed.labels.flatten(), reduction="sum")
    packed_gradient = gradient_of(packed_loss)

    separate_loss = sum(
        F.cross_entropy(model(inputs[None])[0], labels, reduction="sum")
        for inputs, labels in examples
    )
    assert isinstance(separate_loss, torch.Tensor)
    torch.testing.assert_close(packed_loss, separate_loss, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(packed_gradient, gradient_of(separate_loss), rtol=1e-4, atol=1e-5)
