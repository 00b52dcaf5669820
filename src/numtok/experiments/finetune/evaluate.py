"""Scoring a fine-tuned arm: the answers it generates (greedy, the last number of the text, as
the paper reads them), and for rJokes the numbers read out of its distribution and the regression
head's predictions.

Arithmetic: exact accuracy, MAE, log-MAE, the share within 1 % and the share of answers that
hold a number (:func:`numtok.numeric_metrics`). rJokes: RMSE, MAE and Pearson's r of each
readout — ``greedy`` (the generated text), ``expected`` and ``median`` of the distribution over
the scale's scores, 0 to :data:`~numtok.experiments.finetune.data.HIGHEST_SCORE`
(:func:`numtok.predict_numbers` with ``max_value``; a score of more than ``max_digits`` digits
is not read), and ``head`` for the regression head; beside them the metrics of constant
answers, the training jokes' mean, median and mode score (:func:`constant_reference`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from numtok._causal_lm_scorers import cache_argument
from numtok.decoding import predict_numbers
from numtok.experiments.finetune.data import HIGHEST_SCORE
from numtok.experiments.finetune.examples import Encoded, prompt_batch, training_batch
from numtok.experiments.finetune.prefix import prefix_cache, shared_prefix_length
from numtok.experiments.finetune.train import Trained, causal_lm_of, prompt_states
from numtok.metrics import numeric_metrics

__all__ = [
    "ARITHMETIC_METRICS",
    "JOKE_METRICS",
    "constant_reference",
    "generate_answers",
    "score_arm",
]

#: What each task reports, per split and readout.
ARITHMETIC_METRICS = ("exact_accuracy", "mae", "log_mae", "within_1_percent", "parsed_share")
JOKE_METRICS = ("rmse", "mae", "pearson")


@torch.no_grad()
def generate_answers(
    model: Any, tokenizer: Any, examples: Sequence[Encoded], batch_size: int, new_tokens: int
) -> list[str]:
    """Each prompt's greedy continuation of up to ``new_tokens`` tokens, decoded. The S leading
    tokens a batch's prompts share run once (:func:`~numtok.experiments.finetune.prefix.
    prefix_cache`); the rest is left-padded after them, so a row reads ``prefix, padding, its
    own tokens`` and the padding is masked (positions count the real tokens only)."""
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    texts: list[str] = []
    for start in range(0, len(examples), batch_size):
        prompts = [e.prompt for e in examples[start : start + batch_size]]
        shared = shared_prefix_length(prompts)
        own = prompt_batch([prompt[shared:] for prompt in prompts], pad)
        prefix = torch.tensor(prompts[0][:shared], dtype=torch.long)
        input_ids = torch.cat([prefix.expand(len(prompts), -1), own["input_ids"]], dim=1)
        attention_mask = torch.cat(
            [torch.ones((len(prompts), shared), dtype=torch.long), own["attention_mask"]], dim=1
        )
        cached: dict[str, Any] = {}
        if shared:
            decoder = causal_lm_of(model).model
            cached[cache_argument(model)] = prefix_cache(decoder, prefix.to(device), len(prompts))
        generated = model.generate(
            input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
            max_new_tokens=new_tokens, do_sample=False, pad_token_id=pad,
            eos_token_id=tokenizer.eos_token_id, **cached,
        )  # fmt: skip
        new = generated[:, input_ids.shape[1] :]
        texts += tokenizer.batch_decode(new, skip_special_tokens=True)
    return texts


def _arithmetic_metrics(texts: Sequence[str], examples: Sequence[Encoded]) -> dict[str, float]:
    scored = numeric_metrics(list(texts), [e.value for e in examples])
    return {
        "exact_accuracy": scored.exact_accuracy,
        "mae": scored.mae,
        "log_mae": scored.log_mae,
        "within_1_percent": scored.within_1_percent,
        "parsed_share": scored.parsed / scored.count,
    }


def _joke_metrics(
    predictions: Sequence[float | str], examples: Sequence[Encoded]
) -> dict[str, float]:
    scored = numeric_metrics(list(predictions), [e.value for e in examples])
    return {
        "rmse": scored.rmse,
        "mae": scored.mae,
        "pearson": scored.pearson,
        "parsed_share": scored.parsed / scored.count,
    }


def constant_reference(
    task: str, train: Sequence[Encoded], splits: Mapping[str, Sequence[Encoded]]
) -> dict[str, dict[str, dict[str, Any]]]:
    """rJokes: per evaluation split, the metrics of answering every joke with one constant, the
    training jokes' mean (least squared error on them), median (least absolute error) or mode
    score (:func:`numtok.experiments.rjokes.report.constant_predictions`; Pearson undefined). An
    arm that does not beat them shows nothing it learnt from the jokes themselves. Arithmetic:
    ``{}``."""
    if task != "rjokes":
        return {}
    from numtok.experiments.rjokes.report import constant_predictions

    scores = [int(e.value) for e in train]
    return {
        split: constant_predictions(scores, [int(e.value) for e in examples])
        for split, examples in splits.items()
    }


@torch.no_grad()
def _head_predictions(
    trained: Trained, examples: Sequence[Encoded], batch_size: int, pad_id: int
) -> list[float]:
    assert trained.head is not None
    device = next(trained.model.parameters()).device
    mean, std = trained.score_scale
    values: list[float] = []
    for start in range(0, len(examples), batch_size):
        batch = training_batch(examples[start : start + batch_size], pad_id)
        states = prompt_states(trained.model, {k: v.to(device) for k, v in batch.items()})
        values += (trained.head(states).squeeze(-1).double() * std + mean).tolist()
    return values


def score_arm(
    trained: Trained,
    tokenizer: Any,
    task: str,
    splits: Mapping[str, Sequence[Encoded]],
    *,
    batch_size: int,
    new_tokens: int,
    max_digits: int,
) -> tuple[dict[str, dict[str, dict[str, float]]], dict[str, dict[str, list[Any]]]]:
    """``(metrics[split][readout][metric], predictions[split][readout])`` of one trained arm."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    metrics: dict[str, dict[str, dict[str, float]]] = {}
    predictions: dict[str, dict[str, list[Any]]] = {}
    for split, examples in splits.items():
        if trained.head is not None:
            values = _head_predictions(trained, examples, batch_size, pad)
            predictions[split] = {"head": values}
            metrics[split] = {"head": _joke_metrics(values, examples)}
            continue
        texts = generate_answers(trained.model, tokenizer, examples, batch_size, new_tokens)
        predictions[split] = {"greedy": texts}
        if task == "arithmetic":
            metrics[split] = {"greedy": _arithmetic_metrics(texts, examples)}
            continue
        metrics[split] = {"greedy": _joke_metrics(texts, examples)}
        read = predict_numbers(
            trained.model, tokenizer, [list(e.prompt) for e in examples],
            max_digits=max_digits, max_value=HIGHEST_SCORE,
        )  # fmt: skip
        for readout, numbers in (("expected", read.mean), ("median", read.median)):
            values = numbers.tolist()
            predictions[split][readout] = values
            metrics[split][readout] = _joke_metrics(values, examples)
    return metrics, predictions
