"""What an attached :class:`~numtok.hf.NTLossForTrainer` knows about its trainer: the current
optimizer step's target and number positions, counted over its micro-batches and processes
before the first forward pass, the denominators of each micro-batch's loss, and the ``ce`` and
``ntl`` terms of the logs (see :mod:`numtok.hf.trainer` for why this makes NTL's mean exact).
Every route of ``attach()`` — from the logits, logits-free, beside TRL's fused LM head — divides
by these counts and records its terms here."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from numtok.hf._loss import count_targets, token_share_denominators
from numtok.maths.ntl import LossSpec
from numtok.numbers.vocab import NumberVocab

__all__ = ["StepCounts", "StepLink"]


class StepCounts(NamedTuple):
    """The denominators of one micro-batch's loss ``Σ ce / tokens + ntl_weight · Σ ntl /
    numbers``, and its own counts ``[|T|, |P|]`` where the step's are not known (evaluation, a
    call outside a training step), else None."""

    tokens: torch.Tensor
    numbers: torch.Tensor
    local: torch.Tensor | None


@dataclass
class StepLink:
    """The counts of the current optimizer step and the logged terms, for one trainer."""

    vocab: NumberVocab
    spec: LossSpec
    gather: Callable[[torch.Tensor], torch.Tensor]
    #: The Trainer sums its token count over processes and multiplies the loss by their number.
    sum_over_processes: bool
    #: Tensor/context/sequence-parallel ranks share a batch; the Trainer divides its count by this.
    replicas: int
    #: The step's ``|T|``, also the ``num_items_in_batch`` the Trainer passes for this step.
    step_tokens: torch.Tensor | None = None
    step_numbers: torch.Tensor | None = None
    #: ``[Σ ce/|T|, Σ ntl/|P|]`` of the optimizer steps since the last log, on this process.
    train_sums: torch.Tensor | None = None
    steps_since_log: int = 0
    #: ``[Σ ce, Σ ntl, |T|, |P|]`` during an evaluation loop, on this process; None outside one.
    eval_sums: torch.Tensor | None = None

    def reduce(self, tensor: torch.Tensor, *, mean: bool) -> torch.Tensor:
        per_process = self.gather(tensor[None]).reshape(-1, tensor.numel())  # (processes, n)
        return per_process.mean(dim=0) if mean else per_process.sum(dim=0)

    def counts(
        self,
        labels: torch.Tensor,
        num_items_in_batch: torch.Tensor | int | None,
        position_of_id: torch.Tensor,
        dtype: torch.dtype,
    ) -> StepCounts:
        """The step's counts when ``num_items_in_batch`` is the step's (the Trainer passes back
        what :meth:`wrap`'s counting returned), else the micro-batch's own, weighted by its share
        of ``num_items_in_batch`` when given."""
        if self.step_tokens is not None and num_items_in_batch is self.step_tokens:
            assert self.step_numbers is not None
            device = labels.device
            return StepCounts(
                self.step_tokens.to(device=device, dtype=dtype),
                self.step_numbers.to(device=device, dtype=dtype),
                None,
            )
        local = count_targets(labels, position_of_id, self.spec)
        return StepCounts(*token_share_denominators(local, num_items_in_batch, dtype), local)

    def record(self, ce: torch.Tensor, ntl: torch.Tensor, counts: StepCounts) -> None:
        """Add one micro-batch's detached terms ``Σ ce / tokens`` and ``Σ ntl / numbers`` to the
        training logs (within a step) or, as raw sums, to the evaluation loop's."""
        if counts.local is None:
            terms = torch.stack([ce, ntl])
            self.train_sums = terms if self.train_sums is None else self.train_sums + terms
        elif self.eval_sums is not None:
            # Raw sums, so that the evaluation set's means are exact: [Σ ce, Σ ntl, |T|, |P|].
            local = counts.local.to(counts.tokens.dtype)
            sums = torch.stack([ce * counts.tokens, ntl * counts.numbers, *local])
            self.eval_sums += sums.to(self.eval_sums)

    def wrap(self, trainer: Any) -> None:
        """Wrap three of the trainer's methods on the instance: ``get_batch_samples`` (counts the
        step's target and number positions), ``log`` (adds ``ce`` and ``ntl``) and
        ``evaluation_loop`` (adds ``eval_ce`` and ``eval_ntl``)."""
        link = self
        spec = self.spec
        vocab = self.vocab
        get_batch_samples = trainer.get_batch_samples
        log = trainer.log
        evaluation_loop = trainer.evaluation_loop
        loop_signature = inspect.signature(evaluation_loop)

        @functools.wraps(get_batch_samples)
        def counting_get_batch_samples(*args: Any, **kwargs: Any) -> tuple[list[Any], Any]:
            batch_samples, num_items_in_batch = get_batch_samples(*args, **kwargs)
            found = [b.get("labels") for b in batch_samples if isinstance(b, Mapping)]
            labels = [x for x in found if isinstance(x, torch.Tensor)]
            if not labels or len(labels) != len(batch_samples):
                link.step_tokens = link.step_numbers = None
                return batch_samples, num_items_in_batch
            device = trainer.args.device
            counts = torch.stack(
                [
                    count_targets(x, vocab.tables(x.device).position_of_id, spec).to(device)
                    for x in labels
                ]
            ).sum(dim=0)  # (2,): [|T|, |P|] over the step's micro-batches
            if link.sum_over_processes:
                counts = link.reduce(counts, mean=False)
            if link.replicas > 1:
                counts = counts / link.replicas
            link.step_tokens, link.step_numbers = counts.clamp_min(1).unbind()
            link.steps_since_log += 1
            return batch_samples, link.step_tokens

        @functools.wraps(log)
        def log_with_terms(logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
            if "loss" in logs and link.train_sums is not None and link.steps_since_log > 0:
                sums = link.reduce(link.train_sums, mean=not link.sum_over_processes)
                ce, ntl = (float(x) / link.steps_since_log for x in sums)
                terms = {"loss": logs["loss"], "ce": ce, "ntl": ntl}
                rest = {k: v for k, v in logs.items() if k not in terms}
                logs.clear()
                logs.update({**terms, **rest})
                link.train_sums, link.steps_since_log = None, 0
            log(logs, *args, **kwargs)

        @functools.wraps(evaluation_loop)
        def evaluation_loop_with_terms(*args: Any, **kwargs: Any) -> Any:
            bound = loop_signature.bind(*args, **kwargs)
            prefix = bound.arguments.get("metric_key_prefix", "eval")
            link.eval_sums = torch.zeros(4, device=trainer.args.device)
            try:
                output = evaluation_loop(*args, **kwargs)
                ce_sum, ntl_sum, tokens, numbers = link.reduce(link.eval_sums, mean=False)
            finally:
                link.eval_sums = None
            metrics = getattr(output, "metrics", None)
            if isinstance(metrics, dict):
                metrics[f"{prefix}_ce"] = float(ce_sum / tokens.clamp_min(1))
                metrics[f"{prefix}_ntl"] = float(ntl_sum / numbers.clamp_min(1))
            return output

        trainer.get_batch_samples = counting_get_batch_samples
        trainer.log = log_with_terms
        trainer.evaluation_loop = evaluation_loop_with_terms
