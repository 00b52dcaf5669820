"""NTL on TRL's ``SFTTrainer`` from 1.16 on, without ``compute_loss_func`` (which TRL 1.16
deprecates, and which makes it run the model twice per micro-batch: once with the full logits for
the loss, once more for its metrics).

TRL 1.16 computes every ``SFTTrainer`` loss from a fused LM head (``trl.trainer.utils.
add_fused_lm_head``): ``model(**inputs, fused_lm_head=True)`` runs the decoder, projects in tiles
only the positions whose label is not ``-100`` and returns per-token ``log_probs``, ``entropy``,
``is_top1`` and ``label_mask``, never the logits; ``compute_loss`` takes ``-Σ log_probs /
num_items_in_batch`` (times the processes, as the Trainer does) and logs the entropy and the
token accuracy from the same outputs. :func:`trl_route` keeps all of that and adds NTL:

* ``cross_entropy="model"``: TRL's head (the model's forward with ``fused_lm_head=True``) computes
  the cross-entropy and the metrics. The causal LM's forward (on the instance, over TRL's) captures
  the final hidden states (a hook on its decoder, :mod:`numtok.hf._hidden`) and computes ``Σ ntl /
  |P|`` from the number head (:func:`numtok.linear_number_token_loss`) while it runs — where FSDP2
  holds the output layer gathered; the wrapped ``compute_loss`` adds ``ntl_weight`` times it to
  TRL's loss, scaled as TRL scales its own. ``|P|`` is the optimizer step's count of number
  positions over its micro-batches and processes (:mod:`numtok.hf._step_counts`), so the mean is
  exact under gradient accumulation, as TRL's ``num_items_in_batch`` makes its cross-entropy.
* ``cross_entropy="numtok"``: in training calls the causal LM's forward computes CE + NTL with
  numtok's logits-free pass instead of TRL's head (:func:`numtok.losses.linear.
  linear_loss_and_row_terms`: the output layer bypassed, :mod:`numtok.hf._head`), with the
  entropy and top-1 of every position, and hands TRL the fields of its fused head's output:
  ``entropy``, ``is_top1`` and ``label_mask`` as TRL's kernel computes them, and ``log_probs``
  whose sum is ``-num_items_in_batch`` times the loss — at a position, its label's
  log-probability minus its share of ``ntl_weight · NTL`` (text positions: exactly the
  log-probability) — with the loss's gradient (:func:`_summing_to`). TRL's ``compute_loss``
  then divides, scales and logs as it always does. For ``loss_type="nll"`` without MoE auxiliary
  loss (DFT weighs each token by its probability: use ``"model"``).

Evaluation (``prediction_step`` calls ``compute_loss`` without gradients) adds NTL the same way,
with the micro-batch's own counts, and feeds ``eval_ce``/``eval_ntl``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from numtok.hf._head import OutputLayerBypass
from numtok.hf._hidden import HiddenStatesCapture
from numtok.hf._in_forward import check_whole_weight, install_forward, run_forward
from numtok.hf._loss import denominator_dtype, number_head_mean
from numtok.hf._model_facts import ModelFacts
from numtok.hf._step_counts import StepCounts, StepLink
from numtok.hf._zero3 import gathered
from numtok.losses.linear import linear_loss_and_row_terms
from numtok.maths.ntl import LossSpec
from numtok.numbers.vocab import NumberVocab

__all__ = ["trl_route"]


@dataclass
class _Step:
    """The micro-batch whose ``compute_loss`` is running: its labels (B, T), the trainer's
    ``num_items_in_batch``, and what the forward left: the counts, and either NTL to add to TRL's
    loss (``ntl``) or the detached terms of the loss it computed itself (``terms``)."""

    labels: torch.Tensor
    num_items_in_batch: torch.Tensor | int | None
    counts: StepCounts | None = None
    ntl: torch.Tensor | None = None
    terms: tuple[torch.Tensor, torch.Tensor] | None = None


@dataclass
class _NumtokCrossEntropy:
    """What the ``"numtok"`` cross-entropy needs: the bypass of the output layer and the type
    of TRL's fused-head output."""

    bypass: OutputLayerBypass
    output_type: type


@dataclass
class _TrlRoute:
    """The TRL route of one attached loss, checked: what the causal LM's patched forward and the
    wrapped ``compute_loss`` need, and the micro-batch being computed (None outside
    ``compute_loss``)."""

    causal_lm: Any  # whose forward TRL calls with fused_lm_head=True
    vocab: NumberVocab
    spec: LossSpec  # with the model's soft cap
    ntl_weight: float
    link: StepLink
    capture: HiddenStatesCapture
    head: torch.nn.Linear
    numtok: _NumtokCrossEntropy | None = None
    step: _Step | None = None

    def forward(self, own_forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """The causal LM's forward: TRL's; in a fused-head call of ``compute_loss`` it also
        computes NTL from the captured final hidden states, while the forward runs, or (numtok's
        cross-entropy, training calls) the whole loss."""
        step = self.step
        if step is None or not kwargs.get("fused_lm_head", False):
            return own_forward(*args, **kwargs)
        if self.numtok is not None and torch.is_grad_enabled():
            return self._numtok_loss(self.numtok, step, own_forward, args, kwargs)
        with self.capture.during_forward():
            outputs = own_forward(*args, **kwargs)
        step.ntl, step.counts = self._number_head(self.capture.take(), step)
        return outputs

    def _numtok_loss(
        self,
        numtok: _NumtokCrossEntropy,
        step: _Step,
        own_forward: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """TRL's fused-head output, computed by numtok's logits-free pass (module docstring)."""
        for name in ("fused_lm_head", "labels", "num_items_in_batch"):
            kwargs.pop(name, None)
        _, hidden, head = run_forward(
            own_forward, numtok.bypass, self.vocab.vocab_size, args, kwargs
        )
        assert head is not None, "a forward that records gradients bypasses the output layer"
        labels = step.labels.to(hidden.device)
        tables = self.vocab.tables(hidden.device)
        counts = self.link.counts(
            labels, step.num_items_in_batch, tables.position_of_id, denominator_dtype(hidden)
        )
        with gathered([head.weight, head.bias]):  # ZeRO-3: the layer's call released them
            out, rows = linear_loss_and_row_terms(
                hidden.to(head.dtype),
                head.weight.to(head.dtype),
                labels,
                tables,
                self.spec,
                self.ntl_weight,
                (counts.tokens / counts.numbers).expand(labels.shape),
                counts.tokens,
                bias=None if head.bias is None else head.bias.to(head.dtype),
            )
        step.counts, step.terms = counts, (out.ce, out.ntl)

        def next_token(values: torch.Tensor) -> torch.Tensor:
            return values.reshape(labels.shape)[..., :-1]  # (B, T - 1): t predicts t + 1

        mask = labels[..., 1:] != self.spec.ignore_index  # (B, T - 1)
        per_token = next_token(rows.ce + self.ntl_weight * rows.ntl)
        return numtok.output_type(
            loss=out.loss,
            log_probs=_summing_to(-per_token, out.loss, -counts.tokens, mask),
            entropy=torch.where(mask, next_token(rows.entropy), 0.0),
            is_top1=next_token(rows.is_top1) & mask,
            label_mask=mask,
        )

    def _number_head(self, hidden: torch.Tensor, step: _Step) -> tuple[torch.Tensor, StepCounts]:
        """``Σ ntl / |P|`` of the hidden states (B, T, H) and the step's labels."""
        weight, bias = self.head.weight, self.head.bias
        if type(weight).__name__ == "DTensor":  # a separately sharded head (FSDP2), as TRL does
            weight = weight.full_tensor()  # type: ignore[attr-defined]
            bias = None if bias is None else bias.full_tensor()  # type: ignore[attr-defined]
        instead = "pass compute_loss_func=loss_fn to the SFTTrainer instead"
        check_whole_weight(weight, self.vocab.vocab_size, instead)
        labels = step.labels.to(hidden.device)
        tables = self.vocab.tables(hidden.device)
        dtype = denominator_dtype(hidden)
        counts = self.link.counts(labels, step.num_items_in_batch, tables.position_of_id, dtype)
        ntl = number_head_mean(
            hidden,
            weight,
            bias,
            labels,
            self.vocab,
            tables,
            self.spec,
            counts.tokens,
            counts.numbers,
        )
        return ntl, counts

    def install(self, trainer: Any) -> None:
        """Patch the causal LM's forward and wrap ``trainer.compute_loss``, which adds NTL to
        TRL's loss (or hands on numtok's) and records the terms."""
        install_forward(
            self.causal_lm,
            self,
            "NTLossForTrainer.attach (TRL's fused LM head)",
            lambda own_forward: functools.partial(self.forward, own_forward),
        )
        compute_loss = trainer.compute_loss
        signature = inspect.signature(compute_loss)

        @functools.wraps(compute_loss)
        def compute_loss_with_ntl(*args: Any, **kwargs: Any) -> Any:
            arguments = signature.bind(*args, **kwargs).arguments
            inputs = arguments.get("inputs")
            if not isinstance(inputs, Mapping) or not isinstance(
                inputs.get("labels"), torch.Tensor
            ):
                return compute_loss(*args, **kwargs)
            labels = inputs["labels"]
            if "shift_labels" in inputs:
                raise ValueError(
                    "the batch holds shift_labels (context or sequence parallelism), which "
                    "NTLossForTrainer's TRL route does not read: pass compute_loss_func=loss_fn "
                    "to the SFTTrainer instead"
                )
            num_items_in_batch = arguments.get("num_items_in_batch")
            self.step = step = _Step(labels, num_items_in_batch)
            try:
                result = compute_loss(*args, **kwargs)
            finally:
                self.step = None
            if step.counts is None:
                raise ValueError(
                    "TRL's compute_loss did not call the model with its fused LM head "
                    "(fused_lm_head=True), so NTL was not computed: something replaced the "
                    "model's forward after attach(); attach the loss after every other patch"
                )
            # numtok's cross-entropy: the whole loss is TRL's already
            if step.terms is not None:
                self.link.record(*step.terms, step.counts)
                return result
            assert step.ntl is not None
            loss, outputs = result if arguments.get("return_outputs") else (result, None)
            scale = _loss_scale(trainer, num_items_in_batch)
            self.link.record(loss.detach() / scale, step.ntl.detach(), step.counts)
            loss = loss + (self.ntl_weight * scale) * step.ntl.to(loss.dtype)
            return (loss, outputs) if arguments.get("return_outputs") else loss

        trainer.compute_loss = compute_loss_with_ntl


def _summing_to(
    values: torch.Tensor, loss: torch.Tensor, factor: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """``values`` (detached, summing to ``factor · loss``), carrying ``loss``'s gradient: the
    sum's derivative by ``loss`` is ``factor``, spread evenly over the ``mask``'s positions
    (``loss - loss.detach()`` is 0 in value)."""
    spread = mask / mask.sum().clamp_min(1)
    return values + (loss - loss.detach()) * factor * spread


def _loss_scale(trainer: Any, num_items_in_batch: object) -> int:
    """What TRL multiplies its loss by: the processes sharing the step's token count (DDP
    averages the gradients over them), when ``num_items_in_batch`` counts every process's."""
    args = trainer.args
    if not getattr(args, "average_tokens_across_devices", False) or num_items_in_batch is None:
        return 1
    get_tp_size = getattr(trainer, "get_tp_size", None)
    tp_size = int(get_tp_size()) if callable(get_tp_size) else 1
    return int(trainer.accelerator.num_processes) // tp_size


def trl_route(
    trainer: Any,
    facts: ModelFacts,
    vocab: NumberVocab,
    spec: LossSpec,
    ntl_weight: float,
    link: StepLink,
    cross_entropy: str,
) -> _TrlRoute:
    """The route that adds ``ntl_weight · Σ ntl / |P|`` to TRL's fused-head loss, with TRL's
    cross-entropy (``"model"``) or numtok's (``"numtok"``) (see the module docstring), checked on
    the trainer and on the causal LM that ``facts`` describes; :meth:`_TrlRoute.install`
    installs it."""
    head = facts.output_layer()
    capture = facts.capture()
    capped = dataclasses.replace(spec, logit_softcap=facts.softcap)
    numtok = None
    if cross_entropy == "numtok":
        for setting, value, fine in (
            ("loss_type", getattr(trainer.args, "loss_type", "nll"), "nll"),
            ("aux_loss_enabled", getattr(trainer, "aux_loss_enabled", False), False),
        ):
            if value != fine:
                raise ValueError(
                    f"cross_entropy='numtok' hands TRL the loss's per-token sum, which {setting}="
                    f"{value!r} would reweigh or add to: use NTLossForTrainer(..., "
                    "cross_entropy='model')"
                )
        bypass = facts.bypass(lambda outputs: outputs["logits"])
        output_type = importlib.import_module("trl.trainer.utils").FusedCausalLMOutput
        numtok = _NumtokCrossEntropy(bypass, output_type)
    return _TrlRoute(facts.loss_model, vocab, capped, ntl_weight, link, capture, head, numtok)
