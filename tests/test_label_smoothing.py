"""numtok.losses.smoothing: Gaussian label smoothing against a plain float64 reference, σ → 0
recovering cross-entropy, its minimiser, gradients and bad input."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from numtok import NumberVocab
from numtok.losses.smoothing import GaussianLabelSmoothingLoss, gaussian_label_smoothing_ce

torch.set_num_threads(1)

V = 23
DIGITS = {i: str(i) for i in range(10)}
# Digits, 2-digit and 3-digit chunks: each length is its own group, on its own scale.
CHUNKS = DIGITS | {10: "12", 11: "07", 12: "99", 13: "123", 14: "500", 15: "007"}


def reference_gaussian_ce(
    logits: torch.Tensor,
    labels: torch.Tensor,
    number_tokens: dict[int, str],
    *,
    sigma: float,
    reduction: str = "mean",
    num_items_in_batch: int | None = None,
    shift: bool = False,
    ignore_index: int = -100,
) -> torch.Tensor:
    """``-Σ_v q_v log softmax(z)_v`` per position with the soft target built by loops."""
    logits = logits.double()
    if shift:
        labels = torch.cat([labels[..., 1:], torch.full_like(labels[..., :1], ignore_index)], -1)
    flat_logits = logits.reshape(-1, logits.shape[-1])
    losses = []
    for z, y in zip(flat_logits, labels.reshape(-1).tolist(), strict=True):
        if y == ignore_index:
            losses.append(torch.zeros((), dtype=torch.float64))
            continue
        q = torch.zeros(logits.shape[-1], dtype=torch.float64)
        if y in number_tokens:
            length = len(number_tokens[y])
            target = int(number_tokens[y]) / 10 ** (length - 1)
            for j, digits in number_tokens.items():
                if len(digits) == length:
                    value = int(digits) / 10 ** (length - 1)
                    q[j] = math.exp(-((value - target) ** 2) / (2 * sigma**2))
            q = q / q.sum()
        else:
            q[y] = 1.0
        log_p = torch.log_softmax(z, dim=0)
        losses.append(-(q * torch.where(q > 0, log_p, 0.0)).sum())
    per_position = torch.stack(losses).reshape(labels.shape)
    if reduction == "none":
        return per_position
    if reduction == "sum":
        return per_position.sum()
    count = int((labels != ignore_index).sum())
    return per_position.sum() / (num_items_in_batch or max(count, 1))


def _inputs(seed: int = 0, shape: tuple[int, ...] = (3, 7)) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(*shape, V, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, V, shape, generator=generator)
    labels[0, :2] = -100
    return logits, labels


@pytest.mark.parametrize("number_tokens", [DIGITS, CHUNKS], ids=["digits", "chunks"])
@pytest.mark.parametrize("sigma", [0.3, 1.0, 4.0])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_matches_the_reference(number_tokens: dict[int, str], sigma: float, reduction: str) -> None:
    vocab = NumberVocab.from_values(number_tokens, vocab_size=V)
    logits, labels = _inputs()
    for options in ({}, {"shift": True}, {"num_items_in_batch": 5}):
        got = gaussian_label_smoothing_ce(
            logits, labels, vocab, sigma=sigma, reduction=reduction, **options
        )
        expected = reference_gaussian_ce(
            logits, labels, number_tokens, sigma=sigma, reduction=reduction, **options
        )
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_small_sigma_is_cross_entropy(reduction: str) -> None:
    vocab = NumberVocab.from_values(CHUNKS, vocab_size=V)
    logits, labels = _inputs(1, (4, 9))
    got = gaussian_label_smoothing_ce(logits, labels, vocab, sigma=1e-3, reduction=reduction)
    expected = F.cross_entropy(logits.transpose(1, 2), labels, reduction=reduction)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    # A real smoothing at σ = 1: the neighbours get e**-0.5 of the label's weight.
    smoothed = gaussian_label_smoothing_ce(logits, labels, vocab, sigma=1.0, reduction="sum")
    assert abs(float(smoothed) - float(expected.sum())) > 1e-2


def test_the_gaussian_target_is_the_minimiser() -> None:
    # At logits = log q on the label's group (and -inf elsewhere), the loss is the entropy of q
    # and its gradient vanishes.
    vocab = NumberVocab.from_values(CHUNKS, vocab_size=V)
    sigma, label, group = 1.5, 13, [13, 14, 15]  # "123" among the 3-digit chunks
    scaled = torch.tensor([1.23, 5.00, 0.07], dtype=torch.float64)
    q = torch.softmax(-((scaled - 1.23) ** 2) / (2 * sigma**2), dim=0)
    logits = torch.full((1, V), -math.inf, dtype=torch.float64)
    logits[0, group] = q.log()
    logits.requires_grad_()
    loss = gaussian_label_smoothing_ce(logits, torch.tensor([label]), vocab, sigma=sigma)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(float(-(q * q.log()).sum()), rel=1e-12)
    assert logits.grad is not None
    assert float(logits.grad.abs().max()) < 1e-12


def test_monotone_in_the_distance_of_the_predicted_digit() -> None:
    vocab = NumberVocab.from_values(DIGITS, vocab_size=V)
    losses = []
    for digit in range(5, 10):  # label 5, predictions 5, 6, ..., 9
        logits = torch.zeros(1, V)
        logits[0, digit] = 8.0
        losses.append(float(gaussian_label_smoothing_ce(logits, torch.tensor([5]), vocab)))
    assert losses == sorted(losses) and len(set(losses)) == len(losses)


def test_text_positions_are_plain_cross_entropy() -> None:
    vocab = NumberVocab.from_values(DIGITS, vocab_size=V)
    logits, _ = _inputs(2)
    labels = torch.randint(10, V, (3, 7))
    got = gaussian_label_smoothing_ce(logits, labels, vocab, sigma=2.0, reduction="none")
    torch.testing.assert_close(
        got, F.cross_entropy(logits.transpose(1, 2), labels, reduction="none")
    )


def test_gradcheck() -> None:
    vocab = NumberVocab.from_values(CHUNKS, vocab_size=V)
    logits, labels = _inputs(3, (2, 3))
    logits.requires_grad_()
    assert torch.autograd.gradcheck(
        lambda z: gaussian_label_smoothing_ce(z, labels, vocab, sigma=0.7, reduction="none"),
        (logits,),
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_low_precision_logits(dtype: torch.dtype) -> None:
    vocab = NumberVocab.from_values(CHUNKS, vocab_size=V)
    logits, labels = _inputs(4)
    low = logits.to(dtype).requires_grad_()
    got = gaussian_label_smoothing_ce(low, labels, vocab, shift=True)
    expected = reference_gaussian_ce(low.detach(), labels, CHUNKS, sigma=1.0, shift=True)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
    got.backward()
    assert low.grad is not None and low.grad.dtype == dtype


def test_masked_logits_and_all_ignored() -> None:
    vocab = NumberVocab.from_values(DIGITS, vocab_size=V)
    logits = torch.randn(2, 5, V)
    logits[..., 15:] = -math.inf  # a masked stretch of the vocabulary
    logits.requires_grad_()
    labels = torch.tensor([[1, 2, 12, 9, -100], [0, 0, 3, 4, 5]])
    loss = gaussian_label_smoothing_ce(logits, labels, vocab)
    loss.backward()
    assert bool(loss.isfinite()) and logits.grad is not None
    assert not bool(logits.grad.isnan().any())
    nothing = gaussian_label_smoothing_ce(logits, torch.full((2, 5), -100), vocab)
    assert float(nothing.detach()) == 0.0 and nothing.requires_grad


def test_module_equals_function() -> None:
    vocab = NumberVocab.from_values(CHUNKS, vocab_size=V)
    logits, labels = _inputs(5)
    module = GaussianLabelSmoothingLoss(vocab, sigma=0.5, reduction="sum", shift=True)
    expected = gaussian_label_smoothing_ce(
        logits, labels, vocab, sigma=0.5, reduction="sum", shift=True
    )
    assert torch.equal(module(logits, labels), expected)
    assert set(module.state_dict()) == {"ids", "scaled_values", "groups", "position_of_id"}
    assert "sigma=0.5" in repr(module)
    # Moving the module to bfloat16 keeps the value table exact (1.23 is not a bfloat16).
    moved = module.to(torch.bfloat16)
    assert moved.scaled_values.dtype == torch.float64
    torch.testing.assert_close(
        moved(logits.to(torch.bfloat16), labels).double(),
        expected.to(torch.bfloat16).double(),
        rtol=1e-2,
        atol=1e-2,
    )


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"sigma": 0}, ValueError, "sigma must be a finite number > 0 .*got 0"),
        ({"sigma": -1.0}, ValueError, "got -1.0"),
        ({"sigma": math.inf}, ValueError, "got inf"),
        ({"sigma": True}, TypeError, "sigma must be a number > 0, got True"),
        ({"sigma": "1"}, TypeError, "sigma must be a number > 0, got '1'"),
        ({"reduction": "avg"}, ValueError, "reduction must be one of"),
        ({"ignore_index": 1.5}, TypeError, "ignore_index must be an int"),
    ],
)
def test_bad_settings(options: dict[str, Any], error: type, message: str) -> None:
    vocab = NumberVocab.from_values(DIGITS, vocab_size=V)
    logits, labels = _inputs()
    with pytest.raises(error, match=message):
        gaussian_label_smoothing_ce(logits, labels, vocab, **options)
    with pytest.raises(error, match=message):
        GaussianLabelSmoothingLoss(vocab, **options)


def test_bad_tensors() -> None:
    vocab = NumberVocab.from_values(DIGITS, vocab_size=V)
    logits, labels = _inputs()
    with pytest.raises(TypeError, match="vocab must be a NumberVocab"):
        gaussian_label_smoothing_ce(logits, labels, {1: 1})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="logits have 22 columns but"):
        gaussian_label_smoothing_ce(logits[..., :-1], labels, vocab)
    with pytest.raises(ValueError, match=r"labels must be token ids in \[0, 23\)"):
        gaussian_label_smoothing_ce(logits, labels + V, vocab)
    with pytest.raises(TypeError, match="labels must be an integer tensor"):
        gaussian_label_smoothing_ce(logits, labels.double(), vocab)
