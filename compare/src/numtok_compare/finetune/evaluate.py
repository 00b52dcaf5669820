"""Scoring a fine-tuned arm: the answers it gives each example of a split, by every readout.

* ``greedy``: the generated text's last number, as the paper reads answers (None: no number);
* ``expected``, ``median`` and ``mode``: the mean, median and mode of the model's distribution
  over the numbers 0 to ``max_value`` (:func:`numtok.predict_numbers`; only with
  ``config.max_value``), read with ``config.readout_tolerance`` (by default
  :data:`numtok.readout.distribution.FAST_TOLERANCE`; no limit on the prefixes: the bound holds, a
  flat distribution costs what it costs) and with the greedy text
  from the same prompt pass: one pass over a split scores every readout.
  Each item's unexplored mass (``pruned``) is kept beside the answers (``unexplored``), and how
  far each answer may lie from the exact readout (``bounds``,
  :func:`~numtok_compare.runner.scoring.readout_bounds`); with ``config.readout_samples`` the
  numbers are drawn instead, and each expected answer's standard error is kept
  (``standard_errors``);
* ``head``: the regression head's prediction (the ``head`` arm's only readout).

The metrics are computed from these answers (:mod:`numtok_compare.item_metrics`), per item,
so that the report's crossed seed × item analysis reads them. The constant answers every arm
must beat are the training answers' mean (least squared error on them), median (least absolute
error) and mode (most often exactly right): :func:`numtok_compare.stats.constant_answers`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from numtok import last_number, predict_numbers
from numtok_compare.finetune.arm import Trained
from numtok_compare.finetune.config import FinetuneConfig
from numtok_compare.runner.batches import Encoded
from numtok_compare.runner.scoring import (
    generate_answers,
    head_predictions,
    readout_bounds,
    storable,
)

__all__ = ["score_split"]


def score_split(
    trained: Trained, tokenizer: Any, config: FinetuneConfig, examples: Sequence[Encoded]
) -> dict[str, Any]:
    """``{"answers": {readout: [value or None per example]}, "texts": [greedy text, ...]}`` of
    one trained arm on ``examples`` (the head arm: ``head`` answers, no texts); with
    ``config.max_value``, also ``"unexplored": [pruned mass per example]`` and ``"bounds"``
    (:func:`~numtok_compare.runner.scoring.readout_bounds`)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if trained.head is not None:
        head = storable(
            head_predictions(trained.head, examples, config.eval_batch_size, pad,
                             trained.score_scale)
        )  # fmt: skip
        return {"answers": {"head": head}, "texts": []}
    if config.max_value is None:
        texts = generate_answers(
            trained.model, tokenizer, examples, config.eval_batch_size, config.max_new_tokens
        )
        return {"answers": {"greedy": storable([last_number(t) for t in texts])}, "texts": texts}
    if not examples:  # a process's share of a split with fewer batches than processes
        nothing: dict[str, list[float | None]] = {
            readout: [] for readout in ("greedy", "expected", "median", "mode")
        }
        if config.readout_samples is not None:
            return {"answers": nothing, "texts": [], "standard_errors": {"expected": []}}
        return {"answers": nothing, "texts": [], "unexplored": [],
                "bounds": {readout: [] for readout in nothing if readout != "greedy"}}  # fmt: skip
    sampled = config.readout_samples is not None
    read = predict_numbers(
        trained.model, tokenizer, [list(e.prompt) for e in examples],
        max_digits=config.max_digits, max_value=config.max_value,
        tolerance=0.0 if sampled else config.readout_tolerance,
        samples=config.readout_samples, new_tokens=config.max_new_tokens,
    )  # fmt: skip
    texts = tokenizer.batch_decode([list(t) for t in read.greedy], skip_special_tokens=True)
    answers = {
        "greedy": storable([last_number(t) for t in texts]),
        "expected": storable(read.mean.tolist()),
        "median": storable(read.median.tolist()),
        "mode": storable(read.mode.tolist()),
    }
    if sampled:
        errors = storable(read.mean_standard_error.tolist())
        return {"answers": answers, "texts": texts, "standard_errors": {"expected": errors}}
    return {"answers": answers, "texts": texts, "unexplored": read.pruned.tolist(),
            "bounds": readout_bounds(read)}  # fmt: skip
