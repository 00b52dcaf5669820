"""What every comparison reads of a trained arm besides :func:`numtok.predict_numbers`: a causal
LM's greedy answers (:func:`generate_answers`), a regression head's predictions
(:func:`head_predictions`).

A task's prompts all begin alike: the chat template's system turn and the opening of the user's
turn (17 of SmolLM2's 30-32 arithmetic prompt tokens), or a question's first words. A causal
decoder's states at those positions depend on those tokens alone, so they are the same in every
row: the decoder runs over them once, for one row, its keys and values are repeated for the B rows
(:func:`prefix_cache`), and each row's own tokens attend to them at their own positions. That is
the maths of running each row whole, so only the rounding differs; greedy decoding then runs ~45 %
fewer prompt tokens through the decoder.

Under ``torchrun`` each process scores its :class:`Share` of a split, whole batches, and the
shares' scores joined in order (:func:`joined_shares`) are one process's.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from numtok import NumberPredictions
from numtok.readout import cache_argument, returned_cache, shared_prefix_length
from numtok_compare.regression_head import RegressionHead
from numtok_compare.runner.batches import Encoded, prompt_batch, training_batch

__all__ = [
    "WHOLE",
    "Share",
    "causal_lm_of",
    "generate_answers",
    "head_predictions",
    "joined_shares",
    "prefix_cache",
    "storable",
]

T = TypeVar("T")


@dataclass(frozen=True)
class Share:
    """The items of a split one process scores: the ``index``-th of ``count`` contiguous runs
    of whole batches (:data:`WHOLE`: every item). Each batch is then one that a single process
    scoring every item reads too, padding and all, so a share's answers are that process's."""

    index: int = 0
    count: int = 1

    def of(self, items: Sequence[T], batch_size: int) -> Sequence[T]:
        """This share of ``items`` scored ``batch_size`` at a time: the batches dealt out in
        order, as evenly as whole batches go (a share is empty when the split has fewer batches
        than there are shares).

        >>> [list(Share(index, 3).of(range(10), 2)) for index in range(3)]
        [[0, 1], [2, 3, 4, 5], [6, 7, 8, 9]]
        """
        batches = -(-len(items) // batch_size)
        first, end = (batches * k // self.count for k in (self.index, self.index + 1))
        return items[first * batch_size : end * batch_size]


WHOLE = Share()


def joined_shares(scores: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The scores of a split's shares, in the shares' order, as one scoring of all its items:
    lists (one entry per item) joined, dicts joined key by key. Any other value must be the same
    in every share, else a ValueError: a value of the whole split (a time, say) is not the sum
    of its shares'."""

    def joined(values: Sequence[Any], where: str) -> Any:
        first = values[0]
        if all(isinstance(value, list) for value in values):
            return [item for value in values for item in value]
        if all(isinstance(value, dict) and value.keys() == first.keys() for value in values):
            return {key: joined([value[key] for value in values], f"{where}[{key!r}]")
                    for key in first}  # fmt: skip
        if all(value == first for value in values):
            return first
        raise ValueError(f"the shares' scores cannot be joined: they differ at score{where}")

    result: dict[str, Any] = joined(scores, "")
    return result


def causal_lm_of(model: Any) -> Any:
    """The causal LM itself: the base model under a LoRA adapter (peft's ``get_base_model()``),
    else ``model``."""
    get_base_model = getattr(model, "get_base_model", None)
    return get_base_model() if callable(get_base_model) else model


def storable(values: Sequence[float | None]) -> list[float | None]:
    """Answers as JSON holds them: no number (None or NaN) is None, and a text beyond float64's
    range (``"1e999"``, read as ±inf) the largest float of its sign, whose error dwarfs every
    other answer's as inf's would."""
    return [
        None if v is None or math.isnan(v) else max(-sys.float_info.max, min(sys.float_info.max, v))
        for v in values
    ]


def readout_bounds(read: NumberPredictions) -> dict[str, list[float | None]]:
    """How far each distribution readout of ``read`` may lie from the exact one, per item:
    ``expected`` its ``mean_bound``; ``median`` and ``mode`` 0 where nothing was pruned, else
    None (no bound); None where the readout has no answer
    (:mod:`numtok_compare.readout_error` reads them)."""
    exact = [0.0 if pruned == 0 else None for pruned in read.pruned.tolist()]
    return {"expected": storable(read.mean_bound.tolist()), "median": exact, "mode": exact}


def prefix_cache(decoder: Any, prefix: torch.Tensor, rows: int) -> Any:
    """The decoder's key/value cache over ``prefix`` (S,) token ids, repeated for ``rows``
    rows."""
    cache = returned_cache(decoder(input_ids=prefix[None], use_cache=True))
    cache.batch_repeat_interleave(rows)
    return cache


@torch.no_grad()
def generate_answers(
    model: Any, tokenizer: Any, examples: Sequence[Encoded], batch_size: int, new_tokens: int
) -> list[str]:
    """Each prompt's greedy continuation of up to ``new_tokens`` tokens, decoded. The S leading
    tokens a batch's prompts share run once (:func:`prefix_cache`); the rest is left-padded after
    them, so a row reads ``prefix, padding, its own tokens`` and the padding is masked (positions
    count the real tokens only)."""
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
def head_predictions(
    head: RegressionHead,
    examples: Sequence[Encoded],
    batch_size: int,
    pad_id: int,
    scale: tuple[float, float],
) -> list[float]:
    """The head's prediction for each example's prompt, mapped back from the standardised scale
    (``scale``: the training answers' mean and standard deviation). The answers only mark where
    each prompt ends: the head reads the hidden state before them."""
    device = next(head.parameters()).device
    mean, std = scale
    values: list[float] = []
    for start in range(0, len(examples), batch_size):
        batch = training_batch(examples[start : start + batch_size], pad_id)
        predicted = head.predict(**{k: v.to(device) for k, v in batch.items()})
        values += (predicted.double() * std + mean).tolist()
    return values
