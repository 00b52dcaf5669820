"""numtok.readout.decoding: expected values per position (against a loop reference and ntloss's
predict_numbers) and per whole number in a generated sequence."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from numtok import NumberVocab
from numtok.numbers.spans import find_number_spans
from numtok.readout.decoding import ExpectedNumbers, expected_numbers, expected_span_values

torch.set_num_threads(1)

V = 19
NUMBERS = {i: str(i) for i in range(10)} | {10: "12", 11: "345", 12: "007"}


def _vocab() -> NumberVocab:
    return NumberVocab.from_values(NUMBERS, vocab_size=V, minus_ids=[13], decimal_point_ids=[14])


def test_expected_numbers_matches_a_loop_reference() -> None:
    vocab = _vocab()
    logits = 3 * torch.randn(2, 3, V, dtype=torch.float64)
    result = expected_numbers(logits, vocab)
    assert isinstance(result, ExpectedNumbers)
    assert result.value.shape == result.mass.shape == (2, 3)
    ids = sorted(NUMBERS)
    values = torch.tensor([float(NUMBERS[i]) for i in ids], dtype=torch.float64)
    for index in range(6):
        z = logits.reshape(6, V)[index]
        expected_value = (torch.softmax(z[ids], dim=0) * values).sum()
        expected_mass = torch.softmax(z, dim=0)[ids].sum()
        assert float(result.value.reshape(6)[index]) == pytest.approx(
            float(expected_value), rel=1e-12
        )
        assert float(result.mass.reshape(6)[index]) == pytest.approx(
            float(expected_mass), rel=1e-12
        )
    # The whole-number ids change nothing here.
    plain = NumberVocab.from_values(NUMBERS, vocab_size=V)
    assert torch.equal(expected_numbers(logits, plain).value, result.value)


def test_expected_numbers_equals_ntloss_predict_numbers(digit_tokenizer: Any) -> None:
    from ntloss import NTLossDotProduct

    from conftest import build_digit_tokenizer

    reference = NTLossDotProduct(tokenizer=build_digit_tokenizer())
    vocab = NumberVocab.from_tokenizer(digit_tokenizer)
    logits = 4 * torch.randn(2, 5, len(digit_tokenizer))
    expected_value, expected_mass = reference.predict_numbers(logits)
    got = expected_numbers(logits, vocab)
    torch.testing.assert_close(got.value, expected_value, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.mass, expected_mass, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_expected_numbers_low_precision(dtype: torch.dtype) -> None:
    vocab = _vocab()
    logits = torch.randn(4, V, dtype=torch.float64)
    got = expected_numbers(logits.to(dtype), vocab)
    expected = expected_numbers(logits.to(dtype).double(), vocab)
    assert got.value.dtype == got.mass.dtype == torch.float32
    torch.testing.assert_close(got.value.double(), expected.value, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.mass.double(), expected.mass, rtol=1e-5, atol=1e-6)


def test_expected_numbers_with_masked_logits() -> None:
    vocab = _vocab()
    logits = torch.randn(3, V)
    logits[0, :13] = -math.inf  # no number token possible at all
    logits[1, 13:] = -math.inf  # only number tokens possible
    result = expected_numbers(logits, vocab)
    assert not bool(result.value.isnan().any())
    assert float(result.mass[0]) == 0.0 and float(result.mass[1]) == pytest.approx(1.0)


def test_expected_span_values_of_certain_logits_are_the_numbers() -> None:
    vocab = _vocab()
    ids = torch.tensor([[13, 10, 11, 14, 12, 15], [3, 16, 9, 9, 15, 15]])  # -12345.007, 3, 99
    logits = torch.full((2, 6, V), -math.inf, dtype=torch.float64)
    logits.scatter_(-1, ids[..., None], 0.0)
    spans = find_number_spans(ids, vocab)
    assert spans.values.tolist() == [-12345.007, 3.0, 99.0]
    assert expected_span_values(logits, spans, vocab).tolist() == spans.values.tolist()


def test_expected_span_values_match_a_loop_reference_and_gradcheck() -> None:
    vocab = _vocab()
    ids = torch.tensor([[13, 10, 11, 14, 12, 15], [3, 16, 9, 9, 15, 15]])
    logits = torch.randn(2, 6, V, dtype=torch.float64, requires_grad=True)
    spans = find_number_spans(ids, vocab)
    got = expected_span_values(logits, spans, vocab)
    token_value = expected_numbers(logits.detach(), vocab).value  # (2, 6)
    expected = [
        -(token_value[0, 1] * 10**3 + token_value[0, 2] + token_value[0, 4] * 1e-3),
        token_value[1, 0],
        token_value[1, 2] * 10 + token_value[1, 3],
    ]
    torch.testing.assert_close(got.detach(), torch.stack(expected), rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda z: expected_span_values(z, spans, vocab), (logits,))


def test_generated_sequence_with_a_real_tokenizer(gpt2_tokenizer: Any) -> None:
    vocab = NumberVocab.from_tokenizer(gpt2_tokenizer)
    ids = torch.tensor(
        [gpt2_tokenizer("The answer is -1234.5", add_special_tokens=False)["input_ids"]]
    )
    # A "generation" whose steps were certain: its expected numbers are the numbers it wrote.
    logits = torch.full((*ids.shape, vocab.vocab_size), -30.0)
    logits.scatter_(-1, ids[..., None], 30.0)
    spans = find_number_spans(ids, vocab)
    assert expected_span_values(logits, spans, vocab).tolist() == pytest.approx([-1234.5])


def test_bad_input() -> None:
    vocab = _vocab()
    ids = torch.tensor([[1, 2, 15]])
    spans = find_number_spans(ids, vocab)
    with pytest.raises(TypeError, match=r"vocab must be a NumberVocab \(.*\), got dict"):
        expected_numbers(torch.zeros(1, V), {})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="logits must be floating point"):
        expected_numbers(torch.zeros(1, V, dtype=torch.long), vocab)
    with pytest.raises(TypeError, match=r"logits must be a torch\.Tensor, got list"):
        expected_numbers([0.0] * V, vocab)  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match=r"logits have 18 columns but the NumberVocab was built for vocab_size=19"
    ):
        expected_numbers(torch.zeros(1, V - 1), vocab)
    with pytest.raises(ValueError, match=r"for the token ids the spans were found in, \(1, 3\)"):
        expected_span_values(torch.zeros(1, 4, V), spans, vocab)
    with pytest.raises(TypeError, match="spans must be NumberSpans"):
        expected_span_values(torch.zeros(1, 3, V), ids, vocab)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="vocab must be a NumberVocab"):
        expected_span_values(torch.zeros(1, 3, V), spans, {})  # type: ignore[arg-type]
