"""Every bad input gets a ValueError/TypeError that names the argument, what was expected and
what came, before any computation."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from numtok import NumberTokenLoss, NumberVocab, number_token_loss

VOCAB = NumberVocab.from_values({2 + d: str(d) for d in range(10)}, vocab_size=16)
LOGITS = torch.randn(2, 3, 16)
LABELS = torch.tensor([[2, 3, -100], [0, 11, 15]])


@pytest.mark.parametrize(
    ("logits", "labels", "settings", "error", "message"),
    [
        (LOGITS.long(), LABELS, {}, TypeError, r"logits must be floating point .* got torch.int64"),
        (
            LOGITS,
            LABELS.float(),
            {},
            TypeError,
            "labels must be an integer tensor .* got torch.float32",
        ),
        (
            LOGITS,
            LABELS.bool(),
            {},
            TypeError,
            "labels must be an integer tensor .* got torch.bool",
        ),
        (LOGITS.numpy(), LABELS, {}, TypeError, "logits must be a torch.Tensor, got ndarray"),
        (LOGITS, [[2, 3]], {}, TypeError, "labels must be a torch.Tensor, got list"),
        (
            LOGITS,
            LABELS[:, :2],
            {},
            ValueError,
            r"labels have shape \(2, 2\), logits have shape \(2, 3, 16\)",
        ),
        (
            torch.randn(2, 3, 17),
            LABELS,
            {},
            ValueError,
            r"logits have 17 columns but the NumberVocab was built for vocab_size=16; .*"
            r"NumberVocab.from_tokenizer\(tokenizer, vocab_size=17\)",
        ),
        (
            LOGITS,
            LABELS.clone().fill_(16),
            {},
            ValueError,
            r"labels must be token ids in \[0, 16\) or ignore_index=-100, got 16",
        ),
        (LOGITS, LABELS.clone().fill_(-1), {}, ValueError, r"or ignore_index=-100, got -1"),
        (LOGITS, LABELS, {"ignore_index": -1}, ValueError, r"or ignore_index=-1, got -100"),
        (
            LOGITS,
            LABELS,
            {"loss_weights": torch.ones(2, 4)},
            ValueError,
            r"loss_weights must have the labels' shape \(2, 3\), got \(2, 4\)",
        ),
        (
            LOGITS,
            LABELS,
            {"loss_weights": -torch.ones(2, 3)},
            ValueError,
            "loss_weights must be >= 0, got a minimum of -1",
        ),
        (
            LOGITS,
            LABELS,
            {"loss_weights": [1.0]},
            TypeError,
            "loss_weights must be a torch.Tensor or None",
        ),
        (
            LOGITS,
            LABELS,
            {"num_items_in_batch": 0},
            ValueError,
            "num_items_in_batch must be > 0, got 0",
        ),
        (
            LOGITS,
            LABELS,
            {"num_items_in_batch": 2.5},
            TypeError,
            "num_items_in_batch must be an int or a tensor, got 2.5",
        ),
        (
            LOGITS,
            LABELS,
            {"num_items_in_batch": torch.ones(2)},
            ValueError,
            r"num_items_in_batch must be a single number, got a tensor of shape \(2,\)",
        ),
        (
            torch.randn(16),
            torch.tensor(3),
            {"shift": True},
            ValueError,
            "shift=True needs labels with a sequence dimension",
        ),
    ],
)
def test_bad_tensors(
    logits: Any, labels: Any, settings: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        number_token_loss(logits, labels, VOCAB, **settings)


@pytest.mark.parametrize(
    ("settings", "error", "message"),
    [
        (
            {"kind": "wasserstein"},
            ValueError,
            r"kind must be one of \('was', 'mse', 'mae', 'huber', 'del', 'smmd', 'dist2', "
            r"'number'\), a settings object of numtok.kinds \(DEL, SMMD, DIST2\) or a callable, "
            r"got 'wasserstein'",
        ),
        (
            {"reduction": "avg"},
            ValueError,
            r"reduction must be one of \('mean', 'sum', 'none'\), got 'avg'",
        ),
        (
            {"squash_factor": 1.0},
            ValueError,
            "squash_factor must be a finite number > 1 .* got 1.0",
        ),
        (
            {"squash_factor": 0.5},
            ValueError,
            "squash_factor must be a finite number > 1 .* got 0.5",
        ),
        ({"squash_factor": float("inf")}, ValueError, "squash_factor must be a finite number > 1"),
        ({"squash_factor": "3"}, TypeError, "squash_factor must be a number > 1 or None, got '3'"),
        (
            {"squash_factor": 3.0, "kind": "mse"},
            ValueError,
            "squash_factor applies to kind='was' only",
        ),
        ({"reweigh": 1}, TypeError, "reweigh must be a bool, got 1"),
        ({"shift": "yes"}, TypeError, "shift must be a bool, got 'yes'"),
        ({"ignore_index": -100.0}, TypeError, "ignore_index must be an int, got -100.0"),
        (
            {"kind": lambda p, t: (p - t).abs().mean()},
            ValueError,
            r"kind must be a callable .* it returned \(\)",
        ),
    ],
)
def test_bad_settings_fail_in_the_function_and_at_module_construction(
    settings: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        number_token_loss(LOGITS, LABELS, VOCAB, **settings)
    with pytest.raises(error, match=message):
        NumberTokenLoss(VOCAB, **settings)


def test_vocab_must_be_a_number_vocab() -> None:
    with pytest.raises(TypeError, match=r"vocab must be a NumberVocab .* got dict"):
        number_token_loss(LOGITS, LABELS, {2: "0"})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="vocab must be a NumberVocab"):
        NumberTokenLoss("tokenizer")  # type: ignore[arg-type]


def test_module_checks_its_inputs_too() -> None:
    module = NumberTokenLoss(VOCAB)
    with pytest.raises(ValueError, match="logits have 17 columns"):
        module(torch.randn(2, 3, 17), LABELS)
