"""The logits-free pass that computes the gradients in the forward pass (Liger-Kernel's scheme),
for a loss reduced to a scalar (``"mean"`` or ``"sum"``).

A scalar loss is a sum of per-row terms ``L = Σ_r L_r`` whose scales (the ``"mean"``
denominators) are known from the labels before any logit is computed
(:func:`numtok.fused.reduction_scales`). So each chunk of ``c`` rows can be finished at once:

    X = h_c @ Wᵀ + b                                    (c, V) logits, one buffer reused
    lse, x[y], z = row statistics of X                  (c,), (c,), (c, N)
    L_r, ∂L/∂lse, ∂L/∂x[y], ∂L/∂z                       fused.loss_and_row_gradients
    G = ∂L/∂X = ∂L/∂lse·softmax(X) + onehot + scatter   written over X in place
    ∂L/∂h_c = G @ W      ∂L/∂W += Gᵀ @ h_c      ∂L/∂b += Σ_rows G

Three (M, H, V) matrix products in all, where recomputing the logits in backward
(:mod:`numtok._linear_recompute`) needs four; the only (·, V) buffer is the chunk's. Backward
multiplies the stored gradients by the upstream gradient (a scalar). Gradients that are not
needed are not computed (a frozen output layer costs two products).

Precision: the hidden states' gradient is written once per row. The weight's gradient is summed
over the ``⌈M / c⌉`` chunks in the weight's dtype (``addmm``, one rounding per chunk, as
Liger-Kernel does by default); for bfloat16 that adds an error of about ``sqrt(⌈M / c⌉)·2⁻⁹``
relative, against ``2⁻⁹`` for the single product of the materialised path. The bias's gradient
is summed in the compute dtype.
"""

from __future__ import annotations

from typing import Any

import torch

from numtok._linear_recompute import logits_into
from numtok._ntl_maths import LossSpec
from numtok.fused import (
    CEWithNTLOutput,
    loss_and_row_gradients,
    prepare_rows,
    reduce_terms,
    reduction_scales,
)
from numtok.kernels.torch_rows import compute_row_statistics, write_row_gradient
from numtok.vocab import NumberTables

__all__ = ["linear_loss_in_forward"]


class _LossWithGradients(torch.autograd.Function):
    """``(loss, ce, ntl)`` of hidden (M, H), weight (V, H) and bias (V,) or None, with the
    gradients computed in forward and saved; ``ce`` and ``ntl`` are not differentiable."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        rows: Any,  # what numtok.fused.prepare_rows returns, for all M positions
        tables: NumberTables,
        spec: LossSpec,
        ntl_weight: float,
        num_items: torch.Tensor | int | None,
        chunk_size: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        needs_hidden, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        num_tokens, vocab_size = hidden.shape[0], weight.shape[0]
        dtype = rows.ntl_weights.dtype  # the compute dtype
        scales = reduction_scales(rows, spec, num_items)
        ce_rows = hidden.new_empty(num_tokens, dtype=dtype)  # (M,)
        ntl_rows = hidden.new_empty(num_tokens, dtype=dtype)  # (M,)
        grad_hidden = torch.empty_like(hidden) if needs_hidden else None  # (M, H)
        grad_weight = torch.zeros_like(weight) if needs_weight else None  # (V, H)
        grad_bias = weight.new_zeros(vocab_size, dtype=dtype) if needs_bias else None  # (V,)
        buffer = hidden.new_empty(min(chunk_size, num_tokens), vocab_size)  # (c, V)
        for start in range(0, num_tokens, chunk_size):
            index = slice(start, start + chunk_size)
            chunk, part = hidden[index], rows.take(index)
            logits = logits_into(buffer[: chunk.shape[0]], chunk, weight, bias)  # (c, V)
            lse, target_logit, number_logits = compute_row_statistics(
                logits, part.target_ids, tables.ids, dtype
            )
            terms = loss_and_row_gradients(
                lse, target_logit, number_logits, part, tables, spec, ntl_weight, scales
            )
            ce_rows[index], ntl_rows[index] = terms.ce, terms.ntl
            if not (needs_hidden or needs_weight or needs_bias):
                continue
            write_row_gradient(
                logits,
                logits,
                lse,
                part.target_ids,
                tables.ids,
                terms.grad_lse,
                terms.grad_target,
                terms.grad_numbers,
            )  # (c, V), now G = ∂L/∂logits of the chunk
            if grad_hidden is not None:
                torch.mm(logits, weight, out=grad_hidden[index])
            if grad_weight is not None:
                grad_weight.addmm_(logits.t(), chunk)
            if grad_bias is not None:
                grad_bias += logits.sum(0, dtype=dtype)
        del buffer
        shape = torch.Size([num_tokens])  # scalar reductions only: the shape is not read
        ce, ntl = reduce_terms(ce_rows, ntl_rows, rows, spec, num_items, shape)
        ctx.save_for_backward(
            grad_hidden,
            grad_weight,
            None if grad_bias is None or bias is None else grad_bias.to(bias.dtype),
        )
        ctx.mark_non_differentiable(ce, ntl)
        return ce + ntl_weight * ntl, ce, ntl

    @staticmethod
    def backward(
        ctx: Any, grad_loss: torch.Tensor, *_: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        scaled = [None if g is None else g * grad_loss.to(g.dtype) for g in ctx.saved_tensors]
        return (*scaled, *[None] * 6)


def linear_loss_in_forward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    loss_weights: torch.Tensor | None,
    tables: NumberTables,
    spec: LossSpec,
    ntl_weight: float,
    num_items: torch.Tensor | int | None,
    chunk_size: int,
    dtype: torch.dtype,
) -> CEWithNTLOutput:
    """CE + ``ntl_weight``·NTL of the logits ``hidden @ weight.T + bias`` with a scalar reduction
    (``spec.reduction`` ``"mean"`` or ``"sum"``), its gradients computed in the forward pass.

    ``hidden`` (M, H) the flattened hidden states, ``weight`` (V, H), ``bias`` (V,) or None;
    ``labels`` and ``loss_weights`` validated, of one shape with M elements (shifted here when
    ``spec.shift``); ``dtype`` the compute dtype. ``loss_weights`` must not require a gradient
    (it would get none). Not for ``torch.compile``: dynamo does not trace the ``torch.func.vjp``
    of :func:`numtok.fused.loss_and_row_gradients` inside an ``autograd.Function``."""
    rows, _ = prepare_rows(labels, loss_weights, tables, spec, dtype)
    loss, ce, ntl = _LossWithGradients.apply(  # type: ignore[no-untyped-call]
        hidden, weight, bias, rows, tables, spec, ntl_weight, num_items, chunk_size
    )
    return CEWithNTLOutput(loss=loss, ce=ce, ntl=ntl)
