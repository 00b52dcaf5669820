"""Agreement with the authors' package, ntloss 0.3.2, on a digit tokenizer (test-only dependency),
and the multi-digit case where ntloss is blind and numtok is not."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from numtok import NumberVocab, number_token_loss

from conftest import build_digit_tokenizer, build_llama3_style_tokenizer

ntloss = pytest.importorskip("ntloss", minversion="0.3.2")


def _batch(tokenizer: Any, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    vocab_size = len(tokenizer)
    logits = 3 * torch.randn(4, 11, vocab_size, generator=generator)
    labels = torch.randint(vocab_size, (4, 11), generator=generator)
    digit_ids = torch.tensor(tokenizer.convert_tokens_to_ids(list("0123456789")))
    make_digit = torch.rand(4, 11, generator=generator) < 0.6
    labels = torch.where(make_digit, digit_ids[labels % 10], labels)
    labels[0, :3] = -100
    weights = torch.rand(4, 11, generator=generator)
    return logits, labels, weights


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        ({"kind": "was"}, lambda tok, rw: ntloss.NTLoss(tok, reweigh=rw)),
        (
            {"kind": "was", "squash_factor": 3.0},
            lambda tok, rw: ntloss.NTLoss(tok, reweigh=rw, squash_factor=3.0),
        ),
        ({"kind": "mse"}, lambda tok, rw: ntloss.NTLossDotProduct(tok, reweigh=rw)),
    ],
    ids=["was", "was-squash", "mse"],
)
@pytest.mark.parametrize("reweigh", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_values_and_gradients_equal_ntloss(
    ours: dict[str, Any],
    theirs: Any,
    reweigh: bool,
    reduction: str,
    weighted: bool,
) -> None:
    digit_tokenizer = build_digit_tokenizer()  # a private copy: ntloss calls add_tokens on it
    vocab = NumberVocab.from_tokenizer(digit_tokenizer, multi_digit=False, prefixed=False)
    reference = theirs(digit_tokenizer, reweigh)
    logits, labels, weights = _batch(digit_tokenizer, seed=len(reduction) + 7 * weighted)
    loss_weights = weights if weighted else None

    theirs_logits = logits.clone().requires_grad_()
    expected = reference(theirs_logits, labels, loss_weights=loss_weights, reduction=reduction)
    (expected_grad,) = torch.autograd.grad(expected.sum(), theirs_logits)

    ours_logits = logits.clone().requires_grad_()
    actual = number_token_loss(
        ours_logits,
        labels,
        vocab,
        reweigh=reweigh,
        loss_weights=loss_weights,
        reduction=reduction,
        **ours,
    )
    (actual_grad,) = torch.autograd.grad(actual.sum(), ours_logits)

    assert float(expected.detach().abs().sum()) > 0, "the comparison must not be trivial"
    # 1e-5 relative to each tensor's scale: single gradient entries that cancel to ~1e-7 differ
    # by float32 rounding in both packages alike (both are as far from a float64 evaluation).
    torch.testing.assert_close(
        actual, expected, rtol=1e-5, atol=1e-5 * float(expected.detach().abs().max())
    )
    grad_scale = float(expected_grad.abs().max())
    torch.testing.assert_close(actual_grad, expected_grad, rtol=1e-5, atol=1e-5 * grad_scale)


def test_ntloss_is_blind_to_chunk_tokens_numtok_is_not() -> None:
    """Label "123" predicted as "999" with a 1-3-digit tokenizer: ntloss's default gives 0 (it
    sees only single digits), numtok gives the 3-digit-scale distance |9.99 - 1.23|. ntloss also
    re-adds the digits to the caller's tokenizer, which changes how it splits numbers."""
    tokenizer = build_llama3_style_tokenizer()  # a private copy: ntloss modifies it
    ours = NumberVocab.from_tokenizer(tokenizer)
    assert tokenizer.tokenize("12345") == ["123", "45"]
    logits = torch.full((1, 1, len(tokenizer)), -30.0)
    logits[0, 0, tokenizer.convert_tokens_to_ids("999")] = 30.0
    labels = torch.tensor([[tokenizer.convert_tokens_to_ids("123")]])
    assert float(ntloss.NTLoss(tokenizer, reweigh=False)(logits, labels)) == 0.0
    assert float(number_token_loss(logits, labels, ours)) == pytest.approx(8.76, rel=1e-5)
    assert tokenizer.tokenize("12345") == list("12345"), "ntloss changed the tokenizer"
