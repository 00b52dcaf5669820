"""Numeric metrics over generated text, as the paper scores models: the last number of each
generation is its answer; unparseable answers count as wrong for accuracy and are left out of the
error metrics, and their number is reported beside them.

:func:`numeric_metrics` works on lists of strings; :func:`make_compute_metrics` adapts it to the
Hugging Face ``Trainer``'s ``compute_metrics`` hook (read by duck typing, transformers is not
imported).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from numtok._common.validation import check_bool, check_int, check_number
from numtok.numbers.text import last_number

__all__ = [
    "CLIP_LIMIT",
    "NumericMetrics",
    "argmax_logits",
    "make_compute_metrics",
    "numeric_metrics",
]

#: Predictions are clipped to ±CLIP_LIMIT for ``clipped_mae`` (the paper's choice), so that one
#: generation with twenty extra digits does not decide the mean.
CLIP_LIMIT = 1e10


@dataclass(frozen=True)
class NumericMetrics:
    """Scores of numeric answers; see :func:`numeric_metrics` for the definitions.

    Rates and accuracies are over *all* predictions (an unparseable prediction is wrong and not
    within 1 %); error metrics are over the ``parsed`` predictions only, and ``nan`` when they are
    undefined (no parsed prediction; R², Pearson and Spearman also for fewer than two of them or
    constant values).
    """

    count: int
    parsed: int
    unparseable: int
    unparseable_rate: float
    exact_accuracy: float
    mae: float
    rmse: float
    r2: float
    median_absolute_error: float
    pearson: float
    spearman: float
    within_1_percent: float
    clipped_mae: float
    log_mae: float

    def as_dict(self) -> dict[str, float]:
        """Every field as a float, e.g. for a logger or ``Trainer.compute_metrics``."""
        return {name: float(value) for name, value in asdict(self).items()}


def _reference_value(index: int, reference: object) -> float:
    """A reference is a finite number, or a string whose last number is finite."""
    if isinstance(reference, str):
        value = last_number(reference)
        if value is None:
            raise ValueError(f"references[{index}] has no number in it: {reference!r}")
    elif isinstance(reference, (int, float)) and not isinstance(reference, bool):
        value = float(reference)
    else:
        raise TypeError(
            f"references[{index}] must be a number or a str, got {type(reference).__name__}"
        )
    if not math.isfinite(value):
        raise ValueError(f"references[{index}] must be finite, got {reference!r}")
    return value


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else math.nan


def _ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing their average rank (as Spearman's coefficient needs)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for position in range(start, end + 1):
            ranks[order[position]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def _pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """``Σ (x-x̄)(y-ȳ) / sqrt(Σ (x-x̄)² Σ (y-ȳ)²)``; ``nan`` for fewer than two pairs or a
    constant side."""
    # A constant side has no correlation; testing the values themselves, not their deviations
    # from a mean rounded in the last place, keeps it undefined (not ~1e-17).
    if len(x) < 2 or min(x) == max(x) or min(y) == max(y):
        return math.nan
    mean_x, mean_y = _mean(x), _mean(y)
    dx = [a - mean_x for a in x]
    dy = [b - mean_y for b in y]
    # The coefficient is scale-free: divide each side by its largest deviation first, so that
    # squares of huge predictions (1e200) cannot overflow.
    scale_x, scale_y = max(map(abs, dx)), max(map(abs, dy))
    if not (0 < scale_x < math.inf and 0 < scale_y < math.inf):
        return math.nan
    dx = [a / scale_x for a in dx]
    dy = [b / scale_y for b in dy]
    spread = math.sqrt(math.fsum(a * a for a in dx) * math.fsum(b * b for b in dy))
    return max(-1.0, min(1.0, math.fsum(a * b for a, b in zip(dx, dy, strict=True)) / spread))


def _r2(p: Sequence[float], r: Sequence[float]) -> float:
    """``1 - Σ(p-r)² / Σ(r-r̄)²``; ``nan`` for no pairs or constant references."""
    mean_r = _mean(r)
    deviations = [b - mean_r for b in r]
    # Scale-free like the correlations: divide by the largest deviation before squaring.
    scale = max(map(abs, deviations), default=0.0)
    if not 0 < scale < math.inf:
        return math.nan
    residual = math.fsum(((a - b) / scale) ** 2 for a, b in zip(p, r, strict=True))
    return 1 - residual / math.fsum((d / scale) ** 2 for d in deviations)


def _slog(x: float) -> float:
    return math.copysign(math.log1p(abs(x)), x)


def _prediction_value(index: int, prediction: object) -> float | None:
    """A generated text's last number, a number as it is (NaN: none), or None (no answer)."""
    if isinstance(prediction, str):
        return last_number(prediction)
    if prediction is None:
        return None
    if isinstance(prediction, (int, float)) and not isinstance(prediction, bool):
        return None if math.isnan(prediction) else float(prediction)
    raise TypeError(
        f"predictions[{index}] must be a str (generated text), a number or None, "
        f"got {type(prediction).__name__}"
    )


def numeric_metrics(
    predictions: Sequence[str | float | None],
    references: Sequence[str | float],
    *,
    tolerance: float = 0.0,
) -> NumericMetrics:
    """Score generated answers against reference numbers.

    Each prediction is a generated text, read with :func:`numtok.numbers.text.last_number` (the
    last number in the text), or a number (a readout such as
    :func:`numtok.readout.decoding.predict_numbers`), where ``None`` or NaN means no answer; a
    reference is a number or a string read like a text. With ``P`` the parsed
    predictions ``p_i`` and their references ``r_i`` (``n = |P|``) and ``count`` all predictions:

    * ``exact_accuracy = #{|p_i - r_i| <= tolerance} / count`` (unparseable: wrong);
    * ``within_1_percent = #{|p_i - r_i| <= 0.01·|r_i|} / count`` (unparseable: not within);
    * ``mae = Σ|p-r|/n``, ``rmse = sqrt(Σ(p-r)²/n)``, ``median_absolute_error``;
    * ``r2 = 1 - Σ(p-r)² / Σ(r-r̄)²`` (``nan`` if the references in ``P`` are constant);
    * ``pearson`` and ``spearman`` (Pearson's r of the ranks, ties averaged) between p and r;
    * ``clipped_mae``: ``mae`` with each ``p`` clipped to ``±1e10`` (the paper's choice);
    * ``log_mae = Σ|slog(p) - slog(r)|/n`` with ``slog(x) = sign(x)·log1p(|x|)``.

    A prediction beyond float64's range (``"1e999"``) is parsed as ``±inf``: it makes ``mae``,
    ``rmse`` and ``log_mae`` infinite, ``r2`` ``-inf`` and ``pearson`` ``nan``, while
    ``clipped_mae``, the rates, ``spearman`` and (unless such outputs are half or more) the
    median stay meaningful.

    Raises:
        TypeError: a prediction that is neither a str, a number nor None, a reference that is
            neither a number nor a str, a non-numeric tolerance.
        ValueError: different lengths, empty inputs, a reference without a number or not finite,
            a negative or non-finite tolerance.

    >>> m = numeric_metrics(["x = 4", "It is 10.", "no idea"], [4, "10", 7])
    >>> m.exact_accuracy, m.unparseable, m.mae
    (0.6666666666666666, 1, 0.0)
    """
    tolerance = check_number("tolerance", tolerance, minimum=0, inclusive=True)
    if isinstance(predictions, str) or isinstance(references, str):
        raise TypeError("predictions and references must be sequences of answers, not one str")
    if len(predictions) != len(references):
        raise ValueError(
            f"predictions and references must have the same length, got {len(predictions)} "
            f"predictions and {len(references)} references"
        )
    if not predictions:
        raise ValueError("numeric_metrics needs at least one prediction, got empty lists")
    values = [_prediction_value(i, p) for i, p in enumerate(predictions)]
    reference_values = [_reference_value(i, r) for i, r in enumerate(references)]
    pairs = [
        (value, reference)
        for value, reference in zip(values, reference_values, strict=True)
        if value is not None
    ]
    count, parsed = len(predictions), len(pairs)
    p = [value for value, _ in pairs]
    r = [reference for _, reference in pairs]
    errors = [abs(a - b) for a, b in pairs]
    squared = [e * e for e in errors]
    return NumericMetrics(
        count=count,
        parsed=parsed,
        unparseable=count - parsed,
        unparseable_rate=(count - parsed) / count,
        exact_accuracy=sum(e <= tolerance for e in errors) / count,
        mae=_mean(errors),
        rmse=math.sqrt(_mean(squared)) if pairs else math.nan,
        r2=_r2(p, r),
        median_absolute_error=statistics.median(errors) if pairs else math.nan,
        pearson=_pearson(p, r),
        spearman=_pearson(_ranks(p), _ranks(r)),
        within_1_percent=sum(e <= 0.01 * abs(b) for e, b in zip(errors, r, strict=True)) / count,
        clipped_mae=_mean([abs(min(max(a, -CLIP_LIMIT), CLIP_LIMIT) - b) for a, b in pairs]),
        log_mae=_mean([abs(_slog(a) - _slog(b)) for a, b in pairs]),
    )


def argmax_logits(logits: Any, labels: Any) -> torch.Tensor:
    """For ``Trainer(preprocess_logits_for_metrics=argmax_logits)``: keep the predicted token ids
    (B, T) instead of the logits (B, T, V), which the Trainer would otherwise gather in memory;
    with :func:`make_compute_metrics` ``(tokenizer, shift_labels=True)`` on a causal LM.

    Args:
        logits: (B, T, V) logits, or a tuple whose first item they are (the model's outputs).
        labels: unused (the Trainer passes them).

    Returns:
        (B, T) the argmax token ids.
    """
    if isinstance(logits, (tuple, list)):
        logits = logits[0]
    return torch.as_tensor(logits).argmax(dim=-1)


def _unpack(eval_prediction: Any) -> tuple[Any, Any]:
    predictions = getattr(eval_prediction, "predictions", None)
    label_ids = getattr(eval_prediction, "label_ids", None)
    if predictions is None or label_ids is None:
        try:
            predictions, label_ids = eval_prediction
        except (TypeError, ValueError):
            raise TypeError(
                "compute_metrics expects an EvalPrediction or a (predictions, label_ids) pair, "
                f"got {type(eval_prediction).__name__}"
            ) from None
    if isinstance(predictions, (tuple, list)) and not torch.is_tensor(predictions):
        predictions = predictions[0]  # (generated ids or logits, other model outputs...)
    return predictions, label_ids


def _token_rows(tensor: torch.Tensor, ignore_index: int) -> list[list[int]]:
    return [row[row != ignore_index].tolist() for row in tensor.reshape(-1, tensor.shape[-1])]


def make_compute_metrics(
    tokenizer: Any,
    *,
    shift_labels: bool,
    tolerance: float = 0.0,
    ignore_index: int = -100,
) -> Callable[[Any], dict[str, float]]:
    """A ``compute_metrics`` function for the Hugging Face ``Trainer``.

    It decodes predictions and labels with ``tokenizer.batch_decode(..., skip_special_tokens=
    True)`` (positions equal to ``ignore_index`` are dropped first) and returns
    :func:`numeric_metrics` ``(...).as_dict()``.

    ``shift_labels`` has no default, because the wrong choice gives metrics one token off
    without any error:

    * Teacher forcing with a causal LM (a plain ``Trainer``): ``shift_labels=True``, and
      ``Trainer(..., preprocess_logits_for_metrics=argmax_logits)`` so that the Trainer keeps
      token ids (B, T) instead of gathering the logits (B, T, V). The prediction at position t is
      compared with the label at t + 1, and only positions with a label are decoded. Logits
      (B, T, V) are also accepted and reduced with ``argmax``.
    * Generation (``Seq2SeqTrainer`` with ``predict_with_generate=True``), or an
      encoder-decoder under teacher forcing: predictions are already aligned with the labels;
      ``shift_labels=False``.

    Args:
        tokenizer: anything with ``batch_decode(list_of_id_lists, skip_special_tokens=True)``.
        shift_labels: align predictions at t with labels at t + 1 (causal LMs, teacher forcing);
            False for generated ids and encoder-decoders.
        tolerance: passed to :func:`numeric_metrics`.
        ignore_index: label value of positions that are not scored.

    Example:
        >>> from numtok import argmax_logits, make_compute_metrics
        >>> compute_metrics = make_compute_metrics(tokenizer, shift_labels=True)  # doctest: +SKIP
        >>> trainer = Trainer(..., compute_metrics=compute_metrics,
        ...                   preprocess_logits_for_metrics=argmax_logits)  # doctest: +SKIP
    """
    tolerance = check_number("tolerance", tolerance, minimum=0, inclusive=True)
    if not callable(getattr(tokenizer, "batch_decode", None)):
        raise TypeError(
            "tokenizer must have a batch_decode(ids, skip_special_tokens=True) method "
            f"(a Hugging Face tokenizer), got {type(tokenizer).__name__}"
        )
    check_bool("shift_labels", shift_labels)
    check_int("ignore_index", ignore_index)

    def compute_metrics(eval_prediction: Any) -> dict[str, float]:
        raw_predictions, raw_labels = _unpack(eval_prediction)
        predictions, labels = torch.as_tensor(raw_predictions), torch.as_tensor(raw_labels)
        if predictions.is_floating_point() and predictions.dim() == labels.dim() + 1:
            predictions = predictions.argmax(dim=-1)
        if predictions.is_floating_point() or labels.is_floating_point():
            raise TypeError(
                "compute_metrics needs token ids: predictions of shape (B, T) or logits of shape "
                f"(B, T, V) and integer labels (B, T); got predictions {tuple(predictions.shape)} "
                f"{predictions.dtype} and labels {tuple(labels.shape)} {labels.dtype}"
            )
        if shift_labels:
            if predictions.shape != labels.shape:
                raise ValueError(
                    "shift_labels=True needs predictions and labels of the same shape, got "
                    f"{tuple(predictions.shape)} and {tuple(labels.shape)}"
                )
            labels = labels[..., 1:]
            predictions = torch.where(labels == ignore_index, ignore_index, predictions[..., :-1])
        decoded_predictions = tokenizer.batch_decode(
            _token_rows(predictions, ignore_index), skip_special_tokens=True
        )
        decoded_labels = tokenizer.batch_decode(
            _token_rows(labels, ignore_index), skip_special_tokens=True
        )
        return numeric_metrics(decoded_predictions, decoded_labels, tolerance=tolerance).as_dict()

    return compute_metrics
