"""patch_model's default ``cross_entropy="auto"``: numtok's pass where the output layer is on the
CPU, the model's own loss with the number head beside it elsewhere (decided at each call), the
rule of every entry point that chooses (``numtok.hf._loss.auto_cross_entropy``, TRL's route
too). Off the CPU is simulated by that rule answering as it does on a GPU."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import numtok.hf.patch
from numtok.hf import patch_model
from numtok.hf._loss import auto_cross_entropy

from _hf_tiny import build_model, build_tokenizer, max_relative_difference
from test_hf_patch import batch_of, gradients
from test_hf_patch_model_loss import scaled_logits_model

NTL_WEIGHT = 0.7


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer()


@pytest.fixture
def off_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """``"auto"`` decides as for a CUDA output layer."""
    monkeypatch.setattr(
        numtok.hf.patch,
        "auto_cross_entropy",
        lambda device: auto_cross_entropy(torch.device("cuda")),
    )


def test_the_rule() -> None:
    assert auto_cross_entropy(torch.device("cpu")) == "numtok"
    assert auto_cross_entropy(torch.device("cuda", 1)) == "model"


def _step(tokenizer: Any, **settings: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    model = patch_model(build_model(tokenizer), tokenizer, ntl_weight=NTL_WEIGHT, **settings)
    outputs = model(**batch_of(tokenizer))
    return outputs, gradients(model, outputs.loss)


def _same(a: tuple[Any, dict[str, torch.Tensor]], b: tuple[Any, dict[str, torch.Tensor]]) -> None:
    torch.testing.assert_close(a[0].loss, b[0].loss, rtol=1e-6, atol=0)
    assert max_relative_difference(a[1], b[1]) < 1e-5


def test_on_the_cpu_auto_is_numtoks_logits_free_pass(tokenizer: Any) -> None:
    chosen = _step(tokenizer)
    assert chosen[0].logits is None  # numtok's logits-free pass built none
    _same(chosen, _step(tokenizer, cross_entropy="numtok"))


@pytest.mark.usefixtures("off_the_cpu")
def test_off_the_cpu_auto_is_the_models_own_loss_and_the_number_head(tokenizer: Any) -> None:
    chosen = _step(tokenizer)
    assert chosen[0].logits is not None  # the model's own forward built them
    _same(chosen, _step(tokenizer, cross_entropy="model"))
    # The same value as numtok's pass: the two routes compute one loss.
    _same(chosen, _step(tokenizer, cross_entropy="numtok"))


@pytest.mark.usefixtures("off_the_cpu")
def test_reweigh_keeps_numtoks_pass_everywhere(tokenizer: Any) -> None:
    outputs, _ = _step(tokenizer, reweigh=True)
    assert outputs.logits is None  # the model's own loss hands out no log-sum-exp


def test_a_model_the_model_route_refuses_trains_on_the_cpu(tokenizer: Any) -> None:
    model = patch_model(scaled_logits_model(tokenizer), tokenizer)
    model(**batch_of(tokenizer)).loss.backward()


@pytest.mark.usefixtures("off_the_cpu")
def test_off_the_cpu_the_models_refusal_is_raised_naming_the_fix(tokenizer: Any) -> None:
    # Checked when patched, not refused then: the model may stay on the CPU.
    model = patch_model(scaled_logits_model(tokenizer), tokenizer)
    match = (
        r"cross_entropy='auto' computes the cross-entropy with the model's own loss off the CPU "
        r"\(here \w+\).*logits_scaling=4\.0.*Pass cross_entropy='numtok'"
    )
    with pytest.raises(ValueError, match=match):
        model(**batch_of(tokenizer))
