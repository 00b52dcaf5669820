"""Every bad input gets a ValueError/TypeError that names the argument, what was expected and
what came, before any computation."""

from __future__ import annotations

import re
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
            r"'number'\), a settings object of numtok.maths.kinds \(DEL, SMMD, DIST2\) or a "
            r"callable, got 'wasserstein'",
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


# ------------------------------------------------------------------ tensors on two devices

META = torch.device("meta")  # tensors with a shape and no memory: nothing can compute on them


def _entry_points() -> dict[str, Any]:
    """Each public loss, called with its tensors (keyword ``moved``: the names of those that
    are put on the meta device), on the CPU otherwise."""
    from numtok import (
        cross_entropy_with_ntl,
        linear_cross_entropy_with_ntl,
        linear_number_token_loss,
        number_level_loss,
    )

    hidden, weight, bias = torch.randn(2, 3, 4), torch.randn(16, 4), torch.randn(16)
    weights, lse = torch.ones(2, 3), torch.randn(2, 3)
    head = {"hidden": hidden, "weight": weight, "bias": bias, "labels": LABELS}

    def call(function: Any, tensors: dict[str, torch.Tensor], moved: set[str]) -> Any:
        given = {name: t.to(META) if name in moved else t for name, t in tensors.items()}
        labels, rest = given.pop("labels"), given
        first = [rest.pop(name) for name in ("logits", "hidden", "weight") if name in rest]
        return function(*first, labels, VOCAB, **rest)

    return {
        "number_token_loss": lambda moved: call(
            number_token_loss,
            {"logits": LOGITS, "labels": LABELS, "loss_weights": weights},
            moved,
        ),
        "number_level_loss": lambda moved: call(
            number_level_loss,
            {"logits": LOGITS, "labels": LABELS, "loss_weights": weights},
            moved,
        ),
        "cross_entropy_with_ntl": lambda moved: call(
            cross_entropy_with_ntl,
            {"logits": LOGITS, "labels": LABELS, "loss_weights": weights},
            moved,
        ),
        "linear_cross_entropy_with_ntl": lambda moved: call(
            linear_cross_entropy_with_ntl, {**head, "loss_weights": weights}, moved
        ),
        "linear_number_token_loss": lambda moved: call(
            linear_number_token_loss, {**head, "lse": lse, "loss_weights": weights}, moved
        ),
    }


@pytest.mark.parametrize(
    ("entry", "moved", "message"),
    [
        ("number_token_loss", {"labels"}, "logits and labels must be on one device, got logits "
         "on cpu, labels on meta"),
        ("number_token_loss", {"loss_weights"}, "labels and loss_weights must be on one device, "
         "got labels on cpu, loss_weights on meta"),
        ("number_level_loss", {"logits"}, "logits and labels must be on one device, got logits "
         "on meta, labels on cpu"),
        ("cross_entropy_with_ntl", {"labels"}, "logits and labels must be on one device"),
        ("cross_entropy_with_ntl", {"loss_weights"}, "labels and loss_weights must be on one"),
        ("linear_cross_entropy_with_ntl", {"weight"}, "hidden, weight, bias and labels must be "
         "on one device, got hidden on cpu, weight on meta, bias on cpu, labels on cpu"),
        ("linear_cross_entropy_with_ntl", {"bias"}, "bias on meta"),
        ("linear_cross_entropy_with_ntl", {"labels"}, "labels on meta"),
        ("linear_cross_entropy_with_ntl", {"loss_weights"}, "loss_weights on meta"),
        ("linear_number_token_loss", {"hidden"}, "got hidden on meta, weight on cpu"),
        ("linear_number_token_loss", {"lse"}, "labels and lse must be on one device, got labels "
         "on cpu, lse on meta"),
    ],
)  # fmt: skip
def test_tensors_on_two_devices_are_refused(entry: str, moved: set[str], message: str) -> None:
    """Every loss refuses tensors on two devices with a ValueError naming each one's device,
    before anything computes (a kernel launches on the labels' device, the lookup tables come
    for the logits'): a tensor on the meta device stands for the other device, without a
    second one."""
    with pytest.raises(ValueError, match=re.escape(message)):
        _entry_points()[entry](moved)
