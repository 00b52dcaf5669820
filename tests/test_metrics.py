"""numtok.readout.metrics: numeric_metrics against numpy references, the paper's conventions for
unparseable answers, bad input, and the Hugging Face compute_metrics adapter."""

from __future__ import annotations

import math
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from numtok.readout.metrics import (
    CLIP_LIMIT,
    NumericMetrics,
    argmax_logits,
    make_compute_metrics,
    numeric_metrics,
)

FIELDS = [
    "count",
    "parsed",
    "unparseable",
    "unparseable_rate",
    "exact_accuracy",
    "mae",
    "rmse",
    "r2",
    "median_absolute_error",
    "pearson",
    "spearman",
    "within_1_percent",
    "clipped_mae",
    "log_mae",
]


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks with ties averaged, written independently of the library (O(n²), fine here)."""
    return np.array([(x < v).sum() + ((x == v).sum() + 1) / 2 for v in x], dtype=float)


def _reference(p: np.ndarray, r: np.ndarray, count: int) -> dict[str, float]:
    """numpy reference over the parsed pairs (p, r); rates over all ``count`` predictions."""
    err = np.abs(p - r)
    slog = lambda v: np.sign(v) * np.log1p(np.abs(v))  # noqa: E731
    return {
        "exact_accuracy": float((err == 0).sum() / count),
        "mae": float(err.mean()),
        "rmse": float(np.sqrt((err**2).mean())),
        "r2": float(1 - ((p - r) ** 2).sum() / ((r - r.mean()) ** 2).sum()),
        "median_absolute_error": float(np.median(err)),
        "pearson": float(np.corrcoef(p, r)[0, 1]),
        "spearman": float(np.corrcoef(_average_ranks(p), _average_ranks(r))[0, 1]),
        "within_1_percent": float((err <= 0.01 * np.abs(r)).sum() / count),
        "clipped_mae": float(np.abs(np.clip(p, -CLIP_LIMIT, CLIP_LIMIT) - r).mean()),
        "log_mae": float(np.abs(slog(p) - slog(r)).mean()),
    }


def test_matches_a_numpy_reference_with_unparseable_predictions() -> None:
    generator = np.random.default_rng(0)
    references = generator.integers(-50, 50, size=200).astype(float)
    # Mostly near the reference, some exact, some ties, some wild, a fifth unparseable.
    noise = generator.choice([0, 0, 1, -3, 0.5, 1e12], size=200)
    values = references + noise
    texts = [f"The answer is {v:g}." for v in values]
    unparseable = generator.random(200) < 0.2
    predictions = ["I do not know" if u else t for u, t in zip(unparseable, texts, strict=True)]
    metrics = numeric_metrics(predictions, list(references))

    parsed = ~unparseable
    p = np.array([float(f"{v:g}") for v in values])[parsed]
    expected = _reference(p, references[parsed], count=200)
    assert metrics.count == 200
    assert metrics.parsed == int(parsed.sum())
    assert metrics.unparseable == int(unparseable.sum())
    assert metrics.unparseable_rate == pytest.approx(unparseable.mean())
    for name, value in expected.items():
        assert getattr(metrics, name) == pytest.approx(value, rel=1e-12, abs=1e-12), name


def test_paper_conventions_on_a_small_example() -> None:
    metrics = numeric_metrics(
        ["x = 4", "It is 10.", "no idea", "3 + 4 = 8", "-2"], [4, "10", 7, "7", -2.0]
    )
    assert (metrics.count, metrics.parsed, metrics.unparseable) == (5, 4, 1)
    assert metrics.exact_accuracy == 3 / 5  # the unparseable answer counts as wrong
    assert metrics.mae == 1 / 4  # ... and is left out of the error metrics
    assert metrics.within_1_percent == 3 / 5
    assert metrics.median_absolute_error == 0.0


def test_references_are_numbers_or_strings_read_with_last_number() -> None:
    as_numbers = numeric_metrics(["1", "22"], [1, 20])
    as_strings = numeric_metrics(["1", "22"], ["#### 1", "so 3 + 17 = 20"])
    assert as_numbers == as_strings


def test_tolerance() -> None:
    predictions, references = ["0.30000000000000004", "1.05", "2"], [0.3, 1.0, 3]
    assert numeric_metrics(predictions, references).exact_accuracy == 0.0
    assert numeric_metrics(predictions, references, tolerance=1e-9).exact_accuracy == 1 / 3
    assert numeric_metrics(predictions, references, tolerance=0.051).exact_accuracy == 2 / 3
    assert numeric_metrics(predictions, references, tolerance=1).exact_accuracy == 1.0


def test_within_one_percent_and_zero_references() -> None:
    metrics = numeric_metrics(["0", "0.001", "101", "102", "-99"], [0, 0, 100, 100, -100])
    assert metrics.within_1_percent == 3 / 5  # 0 is within 1 % of 0 only exactly


def test_clipped_and_log_mae_tame_runaway_predictions() -> None:
    metrics = numeric_metrics(["100000000000000000000", "5"], [5, 5])
    assert metrics.mae == pytest.approx(1e20 / 2)
    assert metrics.clipped_mae == pytest.approx((CLIP_LIMIT - 5) / 2)
    assert metrics.log_mae == pytest.approx((math.log1p(1e20) - math.log1p(5)) / 2)
    negative = numeric_metrics(["-3"], [3])
    assert negative.log_mae == pytest.approx(2 * math.log1p(3))


def test_predictions_beyond_float64_are_infinite_not_unparseable() -> None:
    metrics = numeric_metrics(["1e999", "5", "6"], [4, 5, 6])
    assert metrics.parsed == 3
    assert metrics.mae == math.inf and metrics.log_mae == math.inf
    assert metrics.clipped_mae == pytest.approx((CLIP_LIMIT - 4) / 3)
    assert metrics.median_absolute_error == 0.0
    assert metrics.spearman == pytest.approx(-0.5)  # ranks (3, 1, 2) against (1, 2, 3)
    assert math.isnan(metrics.pearson)


def test_undefined_metrics_are_nan() -> None:
    nothing = numeric_metrics(["?", "no"], [1, 2])
    assert (nothing.parsed, nothing.exact_accuracy, nothing.unparseable_rate) == (0, 0.0, 1.0)
    for name in ("mae", "rmse", "r2", "median_absolute_error", "pearson", "spearman"):
        assert math.isnan(getattr(nothing, name)), name
    for name in ("clipped_mae", "log_mae"):
        assert math.isnan(getattr(nothing, name)), name
    one = numeric_metrics(["3"], [3])
    assert one.mae == 0.0 and one.exact_accuracy == 1.0
    assert math.isnan(one.r2) and math.isnan(one.pearson) and math.isnan(one.spearman)
    constant_references = numeric_metrics(["1", "2"], [5, 5])
    assert math.isnan(constant_references.r2) and math.isnan(constant_references.pearson)


def test_huge_values_do_not_overflow_the_correlations() -> None:
    metrics = numeric_metrics(["1e200", "2e200", "3e200"], [1e200, 2e200, 3.5e200])
    assert metrics.pearson == pytest.approx(float(np.corrcoef([1, 2, 3], [1, 2, 3.5])[0, 1]))
    assert metrics.spearman == 1.0
    assert metrics.r2 == pytest.approx(
        1 - 0.25 / ((1 - 6.5 / 3) ** 2 + (2 - 6.5 / 3) ** 2 + (3.5 - 6.5 / 3) ** 2)
    )


def test_as_dict_has_every_field_as_float() -> None:
    metrics = numeric_metrics(["1", "x"], [1, 2])
    as_dict = metrics.as_dict()
    assert list(as_dict) == FIELDS
    assert all(type(v) is float for v in as_dict.values())
    assert as_dict["count"] == 2.0 and as_dict["unparseable"] == 1.0
    assert isinstance(metrics, NumericMetrics)


@given(st.lists(st.integers(-(10**6), 10**6), min_size=1, max_size=30))
def test_perfect_answers_score_perfectly(values: list[int]) -> None:
    metrics = numeric_metrics([f"The answer is {v:,}." for v in values], values)
    assert metrics.exact_accuracy == 1.0 and metrics.within_1_percent == 1.0
    assert metrics.mae == 0.0 and metrics.rmse == 0.0 and metrics.log_mae == 0.0
    if len(set(values)) > 1:
        assert metrics.r2 == 1.0
        assert metrics.pearson == pytest.approx(1.0) and metrics.spearman == pytest.approx(1.0)


# ------------------------------------------------------------------ bad input


def test_numbers_and_none_score_like_the_texts_that_spell_them() -> None:
    texts = numeric_metrics(["3", "it is 2.5", "no idea", "-1"], [3, 2, 7, 0], tolerance=0.5)
    numbers = numeric_metrics([3, 2.5, None, -1.0], [3, 2, 7, 0], tolerance=0.5)
    assert numbers == texts and numbers.unparseable == 1
    assert numeric_metrics([math.nan, 1.0], [1, 1]).unparseable == 1


@pytest.mark.parametrize(
    ("predictions", "references", "error", "message"),
    [
        (["1", "2"], [1], ValueError, "same length, got 2 predictions and 1 references"),
        ([], [], ValueError, "at least one prediction, got empty lists"),
        (["1"], [math.inf], ValueError, r"references\[0\] must be finite, got inf"),
        (["1", "2"], [1, math.nan], ValueError, r"references\[1\] must be finite, got nan"),
        (["1"], ["1e999"], ValueError, r"references\[0\] must be finite"),
        (["1"], ["seven"], ValueError, r"references\[0\] has no number in it: 'seven'"),
        (["1"], [None], TypeError, r"references\[0\] must be a number or a str, got NoneType"),
        (["1"], [True], TypeError, r"references\[0\] must be a number or a str, got bool"),
        ([True], [1], TypeError, r"predictions\[0\] must be a str .*, a number or None, got bool"),
        ([b"1"], [1], TypeError, r"predictions\[0\] must be a str .*, a number or None, got bytes"),
        ("12", ["1", "2"], TypeError, "sequences of answers, not one str"),
    ],
)
def test_bad_input(predictions: Any, references: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        numeric_metrics(predictions, references)


@pytest.mark.parametrize(
    ("tolerance", "error"), [(-1, ValueError), (math.nan, ValueError), ("0", TypeError)]
)
def test_bad_tolerance(tolerance: Any, error: type) -> None:
    with pytest.raises(error, match="tolerance must be"):
        numeric_metrics(["1"], [1], tolerance=tolerance)


# ------------------------------------------------------------------ Hugging Face adapter


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_compute_metrics_on_generated_ids(gpt2_tokenizer: Any) -> None:
    from transformers import EvalPrediction

    tok = gpt2_tokenizer
    generated = [_ids(tok, "x = 12"), _ids(tok, "-3"), _ids(tok, "no"), _ids(tok, " 1,250")]
    answers = [_ids(tok, "12"), _ids(tok, "-4"), _ids(tok, "7"), _ids(tok, "1250")]
    width = max(map(len, generated + answers))
    pad = lambda rows, fill: [r + [fill] * (width - len(r)) for r in rows]  # noqa: E731
    # Generation pads with a special token, which decoding skips.
    predictions = np.array(pad(generated, tok.eos_token_id))
    labels = np.array(pad(answers, -100))
    compute_metrics = make_compute_metrics(tok, shift_labels=False)
    result = compute_metrics(EvalPrediction(predictions=predictions, label_ids=labels))
    expected = numeric_metrics(["x = 12", "-3", "no", "1,250"], [12, -4, 7, 1250]).as_dict()
    assert result == pytest.approx(expected, nan_ok=True)
    assert result["exact_accuracy"] == 0.5
    # A plain (predictions, labels) pair and predictions padded with -100 work the same.
    padded_with_ignore = np.where(predictions == tok.eos_token_id, -100, predictions)
    assert compute_metrics((padded_with_ignore, labels)) == pytest.approx(expected, nan_ok=True)


def test_compute_metrics_teacher_forced_causal_lm(digit_tokenizer: Any) -> None:
    tok = digit_tokenizer
    sequence = _ids(tok, "1+2=3")
    prompt_length = len(_ids(tok, "1+2="))
    labels = torch.tensor([[-100] * prompt_length + sequence[prompt_length:]])
    # The model's logits at t predict token t + 1; it predicts "5" where "3" is due.
    vocab_size = len(tok)
    logits = torch.zeros(1, len(sequence), vocab_size)
    logits[0, prompt_length - 1, _ids(tok, "5")[0]] = 10.0
    token_ids = argmax_logits((logits, "other outputs"), labels)
    assert token_ids.shape == (1, len(sequence))
    compute_metrics = make_compute_metrics(tok, shift_labels=True)
    result = compute_metrics((token_ids.numpy(), labels.numpy()))
    assert result["parsed"] == 1.0 and result["exact_accuracy"] == 0.0 and result["mae"] == 2.0
    # Logits themselves are reduced with argmax.
    assert compute_metrics((logits.numpy(), labels.numpy())) == result


def test_compute_metrics_bad_input(digit_tokenizer: Any) -> None:
    with pytest.raises(TypeError, match="tokenizer must have a batch_decode"):
        make_compute_metrics(object(), shift_labels=False)
    with pytest.raises(TypeError, match="shift_labels must be a bool"):
        make_compute_metrics(digit_tokenizer, shift_labels=1)
    with pytest.raises(TypeError, match="ignore_index must be an int, got None"):
        make_compute_metrics(digit_tokenizer, shift_labels=True, ignore_index=None)  # type: ignore[arg-type]
    compute_metrics = make_compute_metrics(digit_tokenizer, shift_labels=True)
    with pytest.raises(TypeError, match="EvalPrediction or a"):
        compute_metrics(42)
    with pytest.raises(ValueError, match="same shape"):
        compute_metrics((np.zeros((1, 4), dtype=int), np.zeros((1, 5), dtype=int)))
    with pytest.raises(TypeError, match="needs token ids"):
        compute_metrics((np.zeros((1, 4)), np.zeros((1, 4))))


def test_metrics_module_does_not_import_transformers() -> None:
    code = "import sys, numtok.readout.metrics; assert 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_constant_answer_has_no_correlation_even_when_its_mean_rounds() -> None:
    """1.6133873515772308 repeated has a mean that differs from it in the last place: its
    deviations are ~1e-16, not 0, and Pearson's r came out 3.6e-17 instead of undefined."""
    constant = [1.6133873515772308] * 1000
    scores = [float(i % 12) for i in range(1000)]
    assert math.isnan(numeric_metrics(constant, scores).pearson)
    assert math.isnan(numeric_metrics(scores, [5.0] * 1000).pearson)
