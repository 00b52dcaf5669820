"""Scoring a fine-tuned arm: the answers it gives each example of a split, by every readout.

* ``greedy``: the generated text's last number, as the paper reads answers (None: no number);
* ``expected``, ``median`` and ``mode``: the mean, median and mode of the model's distribution
  over the numbers 0 to ``max_value`` (:func:`numtok.predict_numbers`; only with
  ``config.max_value``), read with ``config.readout_tolerance`` (by default
  :data:`numtok.readout.distribution.FAST_TOLERANCE`; no limit on the prefixes: the bound holds, a
  flat distribution costs what it costs) and with the greedy text
  from the same prompt pass: one pass over a split scores every readout.
  Each item's unexplored mass (``pruned``) is kept beside the answers (``unexplored``);
* ``head``: the regression head's prediction (the ``head`` arm's only readout).

The metrics are computed from these answers (:mod:`numtok_compare.item_metrics`), per item,
so that the report's crossed seed × item analysis reads them. The constant answers every arm
must beat are the training answers' mean (least squared error on them), median (least absolute
error) and mode (most often exactly right): :func:`numtok_compare.stats.constant_answers`.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

import torch

from numtok import last_number, predict_numbers
from numtok.readout import cache_argument
from numtok_compare.finetune.arm import Trained
from numtok_compare.finetune.config import FinetuneConfig
from numtok_compare.finetune.examples import Encoded, prompt_batch, training_batch
from numtok_compare.finetune.models import causal_lm_of
from numtok_compare.finetune.prefix import prefix_cache, shared_prefix_length

__all__ = ["generate_answers", "score_split"]


@torch.no_grad()
def generate_answers(
    model: Any, tokenizer: Any, examples: Sequence[Encoded], batch_size: int, new_tokens: int
) -> list[str]:
    """Each prompt's greedy continuation of up to ``new_tokens`` tokens, decoded. The S leading
    tokens a batch's prompts share run once (:func:`~numtok_compare.finetune.prefix.
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


@torch.no_grad()
def _head_predictions(
    trained: Trained, examples: Sequence[Encoded], batch_size: int, pad_id: int
) -> list[float | None]:
    assert trained.head is not None
    device = next(trained.model.parameters()).device
    mean, std = trained.score_scale
    values: list[float] = []
    for start in range(0, len(examples), batch_size):
        batch = training_batch(examples[start : start + batch_size], pad_id)
        predicted = trained.head.predict(**{k: v.to(device) for k, v in batch.items()})
        values += (predicted.double() * std + mean).tolist()
    return _storable(values)


def score_split(
    trained: Trained, tokenizer: Any, config: FinetuneConfig, examples: Sequence[Encoded]
) -> dict[str, Any]:
    """``{"answers": {readout: [value or None per example]}, "texts": [greedy text, ...]}`` of
    one trained arm on one split (the head arm: ``head`` answers, no texts); with
    ``config.max_value``, also ``"unexplored": [pruned mass per example]``."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if trained.head is not None:
        head = _head_predictions(trained, examples, config.eval_batch_size, pad)
        return {"answers": {"head": head}, "texts": []}
    if config.max_value is None:
        texts = generate_answers(
            trained.model, tokenizer, examples, config.eval_batch_size, config.max_new_tokens
        )
        return {"answers": {"greedy": _storable([last_number(t) for t in texts])}, "texts": texts}
    read = predict_numbers(
        trained.model, tokenizer, [list(e.prompt) for e in examples],
        max_digits=config.max_digits, max_value=config.max_value,
        tolerance=config.readout_tolerance,
        new_tokens=config.max_new_tokens,
    )  # fmt: skip
    texts = tokenizer.batch_decode([list(t) for t in read.greedy], skip_special_tokens=True)
    answers = {
        "greedy": _storable([last_number(t) for t in texts]),
        "expected": _storable(read.mean.tolist()),
        "median": _storable(read.median.tolist()),
        "mode": _storable(read.mode.tolist()),
    }
    return {"answers": answers, "texts": texts, "unexplored": read.pruned.tolist()}


def _storable(values: Sequence[float | None]) -> list[float | None]:
    """Answers as JSON holds them: no number (None or NaN) is None, and a text beyond float64's
    range (``"1e999"``, read as ±inf) the largest float of its sign, whose error dwarfs every
    other answer's as inf's would."""
    return [
        None if v is None or math.isnan(v) else max(-sys.float_info.max, min(sys.float_info.max, v))
        for v in values
    ]
