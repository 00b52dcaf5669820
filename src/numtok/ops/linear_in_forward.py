"""The logits-free pass that computes the gradients in the forward pass (Liger-Kernel's scheme),
for a loss reduced to a scalar (``"mean"`` or ``"sum"``), and the evaluation pass of any
reduction.

A scalar loss is a sum of per-row terms ``L = Σ_r L_r`` whose scales (the ``"mean"``
denominators) are known from the labels before any logit is computed
(:func:`numtok.ops.row_algebra.reduction_scales`). So each chunk of ``c`` rows can be finished at
once:

    X = h_c @ Wᵀ + b                                    (c, V) logits, one buffer reused
    L_r, and X turned in place into                     the row pass of the backend:
    G = ∂L/∂X = ∂L/∂lse·softmax(X) + onehot + scatter   torch row passes or the Triton kernel
    ∂L/∂h_c = G @ W      ∂L/∂W += Gᵀ @ h_c      ∂L/∂b += Σ_rows G

Three (M, H, V) matrix products in all, where recomputing the logits in backward
(:mod:`numtok.ops.linear_recompute`) needs four; the only (·, V) buffer is the chunk's. Backward
multiplies the stored gradients by the upstream gradient (a scalar). Gradients that are not
needed are not computed (a frozen output layer costs two products); without any (evaluation) the
same loop computes the loss alone, one product.

The row pass (:class:`ChunkRows`): the torch backend computes each chunk's row statistics and
:func:`numtok.ops.row_algebra.loss_and_row_gradients` and writes the gradient with
:func:`~numtok.ops.kernels.torch_rows.write_row_gradient`; the Triton backend
(:class:`numtok.ops.kernels.triton_loss.ChunkRows`) does all of it in one kernel over the chunk.

Precision: the hidden states' gradient is written once per row. The weight's gradient is summed
over the ``⌈M / c⌉`` chunks in float32 on a GPU (cuBLAS accumulates the bfloat16/float16 products
straight into a float32 buffer, cast once at the end: bf16 sums over chunks made Liger-Kernel's
users' models diverge) and in the weight's dtype on CPU (``addmm``, one rounding per chunk, as
Liger-Kernel did by default; there float32 would cost float32 products). The bias's gradient is
summed in the compute dtype.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, Protocol

import torch

from numtok.maths.ntl import LossSpec
from numtok.numbers.vocab import NumberTables
from numtok.ops.kernels.torch_rows import (
    compute_row_statistics,
    entropy_and_top1,
    write_row_gradient,
)
from numtok.ops.linear_recompute import logits_into
from numtok.ops.row_algebra import (
    loss_and_row_gradients,
    prepare_rows,
    reduce_terms,
    reduction_scales,
)

__all__ = [
    "ChunkRows",
    "RowTerms",
    "TorchChunkRows",
    "linear_loss_in_forward",
    "weight_gradient_dtype",
]


class ChunkRows(Protocol):
    """A backend's row pass over the chunks of one call (see the module docstring)."""

    def __call__(self, index: slice, logits: torch.Tensor, write_gradient: bool) -> None:
        """The positions ``index`` from their logits (c, V), turned into their gradient for a
        unit upstream gradient with ``write_gradient``."""

    def terms(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(loss, ce, ntl)`` over all positions, once every chunk has been passed."""


class RowTerms(NamedTuple):
    """Each (flattened, shifted) position's terms, detached, (M,): ``ce`` its cross-entropy (0
    where the label is ignored), ``ntl`` its weighted NTL (0 where the label is no number), as
    :func:`numtok.ops.row_algebra.reduce_terms` sums them; ``entropy`` the entropy of its next-token
    distribution and ``is_top1`` whether its label is that distribution's most likely token (both
    of every position, ignored labels included)."""

    ce: torch.Tensor
    ntl: torch.Tensor
    entropy: torch.Tensor
    is_top1: torch.Tensor


class TorchChunkRows:
    """The torch backend's :class:`ChunkRows`, for validated ``labels`` and ``loss_weights``
    (shifted here when ``spec.shift``); ``dtype`` is the compute dtype. With ``metrics`` it also
    keeps each position's entropy and top-1 (:class:`RowTerms`)."""

    def __init__(
        self,
        labels: torch.Tensor,
        loss_weights: torch.Tensor | None,
        tables: NumberTables,
        spec: LossSpec,
        ntl_weight: float,
        num_items: torch.Tensor | int | None,
        dtype: torch.dtype,
        metrics: bool = False,
    ) -> None:
        self.rows, self.shape = prepare_rows(labels, loss_weights, tables, spec, dtype)
        self.tables, self.spec, self.ntl_weight, self.num_items = (
            tables,
            spec,
            ntl_weight,
            num_items,
        )
        self.dtype = dtype
        self.scales = reduction_scales(self.rows, spec, num_items)
        self.ce_rows, self.ntl_rows = (labels.new_empty(labels.numel(), dtype=dtype) for _ in "ab")
        self.metrics = None
        if metrics:
            self.metrics = (
                labels.new_empty(labels.numel(), dtype=dtype),
                labels.new_empty(labels.numel(), dtype=torch.bool),
            )

    def __call__(self, index: slice, logits: torch.Tensor, write_gradient: bool) -> None:
        part = self.rows.take(index)
        softcap = self.spec.logit_softcap
        lse, target_logit, number_logits = compute_row_statistics(
            logits, part.target_ids, self.tables.ids, self.dtype, softcap
        )
        terms = loss_and_row_gradients(
            lse, target_logit, number_logits, part, self.tables, self.spec, self.ntl_weight,
            self.scales,
        )  # fmt: skip
        self.ce_rows[index], self.ntl_rows[index] = terms.ce, terms.ntl
        if self.metrics is not None:
            entropy, is_top1 = self.metrics
            entropy[index], is_top1[index] = entropy_and_top1(logits, lse, part.target_ids, softcap)
        if write_gradient:
            write_row_gradient(
                logits, logits, lse, part.target_ids, self.tables.ids, terms.grad_lse,
                terms.grad_target, terms.grad_numbers, softcap=softcap,
            )  # fmt: skip

    def terms(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ce, ntl = reduce_terms(
            self.ce_rows, self.ntl_rows, self.rows, self.spec, self.num_items, self.shape
        )
        return ce + self.ntl_weight * ntl, ce, ntl

    def row_terms(self) -> RowTerms:
        """Every position's terms, once every chunk has been passed (``metrics`` only)."""
        assert self.metrics is not None, "built without metrics"
        return RowTerms(self.ce_rows, self.ntl_rows, *self.metrics)


def weight_gradient_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype the weight's gradient is summed in over the chunks: float32 for a
    bfloat16/float16 weight on a GPU, the weight's own dtype otherwise."""
    low_precision = weight.dtype in (torch.bfloat16, torch.float16)
    return torch.float32 if low_precision and weight.device.type != "cpu" else weight.dtype


def _add_product(total: torch.Tensor, left: torch.Tensor, right: torch.Tensor) -> None:
    """``total += left @ right``, summed in ``total``'s dtype: a float32 ``total`` of bfloat16
    or float16 factors takes cuBLAS's float32 output where torch offers it (``out_dtype``), the
    float32 product of the upcast factors elsewhere."""
    if total.dtype == left.dtype:
        total.addmm_(left, right)
    elif _sums_low_precision_products_into_float32(total.device):
        torch.addmm(total, left, right, out_dtype=total.dtype, out=total)
    else:
        total.addmm_(left.to(total.dtype), right.to(total.dtype))


@functools.cache
def _sums_low_precision_products_into_float32(device: torch.device) -> bool:
    """Whether ``torch.addmm(total, a, b, out_dtype=torch.float32, out=total)`` adds a bfloat16
    product to a float32 ``total`` in place on ``device`` (CUDA, torch >= 2.8): tried once per
    device and process on a 2 x 2 sum, whose check reads one boolean back."""
    if device.type != "cuda":
        return False
    total = torch.ones(2, 2, device=device)
    factor = torch.eye(2, device=device, dtype=torch.bfloat16)
    try:
        torch.addmm(total, factor, factor, out_dtype=torch.float32, out=total)
    except (RuntimeError, TypeError):
        return False
    return bool(torch.equal(total, torch.eye(2, device=device) + 1))


class _LossWithGradients(torch.autograd.Function):
    """``(loss, ce, ntl)`` of hidden (M, H), weight (V, H) and bias (V,) or None, with the
    gradients computed in forward and saved; ``ce`` and ``ntl`` are not differentiable."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        chunk_rows: ChunkRows,
        chunk_size: int,
        gradients: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # (needs_input_grad says what requires grad, also where autograd records nothing.)
        needs_hidden, needs_weight, needs_bias = (gradients and n for n in ctx.needs_input_grad[:3])
        write_gradient = needs_hidden or needs_weight or needs_bias
        num_tokens, vocab_size = hidden.shape[0], weight.shape[0]
        compute = torch.float64 if hidden.dtype == torch.float64 else torch.float32
        grad_hidden = torch.empty_like(hidden) if needs_hidden else None  # (M, H)
        grad_weight = (
            torch.zeros_like(weight, dtype=weight_gradient_dtype(weight)) if needs_weight else None
        )  # (V, H)
        grad_bias = weight.new_zeros(vocab_size, dtype=compute) if needs_bias else None  # (V,)
        buffer = hidden.new_empty(min(chunk_size, num_tokens), vocab_size)  # (c, V)
        for start in range(0, num_tokens, chunk_size):
            index = slice(start, min(start + chunk_size, num_tokens))
            chunk = hidden[index]
            logits = logits_into(buffer[: chunk.shape[0]], chunk, weight, bias)  # (c, V)
            chunk_rows(index, logits, write_gradient)  # now G = ∂L/∂logits of the chunk
            if grad_hidden is not None:
                torch.mm(logits, weight, out=grad_hidden[index])
            if grad_weight is not None:
                _add_product(grad_weight, logits.t(), chunk)
            if grad_bias is not None:
                grad_bias += logits.sum(0, dtype=compute)
        del buffer
        loss, ce, ntl = chunk_rows.terms()
        ctx.save_for_backward(
            grad_hidden,
            None if grad_weight is None else grad_weight.to(weight.dtype),
            None if grad_bias is None or bias is None else grad_bias.to(bias.dtype),
        )
        ctx.mark_non_differentiable(ce, ntl)
        return loss, ce, ntl

    @staticmethod
    def backward(
        ctx: Any, grad_loss: torch.Tensor, *_: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        scaled = [None if g is None else _times_upstream(g, grad_loss) for g in ctx.saved_tensors]
        return (*scaled, None, None, None)


def _times_upstream(gradient: torch.Tensor, upstream: torch.Tensor) -> torch.Tensor:
    """``gradient · upstream`` (a 0-dim float32 or float64 upstream gradient), computed in the
    upstream's dtype and rounded once to the gradient's, into a fresh buffer (a second backward
    through the same graph reads the saved gradient again).

    A 0-dim factor does not take part in type promotion: ``bfloat16 (V, H) * float32 ()`` has
    the result type bfloat16, and CUDA computes a binary op in its result type, so it would
    round the upstream gradient to bfloat16 first (float16: a loss scale of 2^16 becomes inf)
    where the CPU's kernel keeps a 0-dim scalar in float32. As a 1-element tensor of as many
    dimensions as the gradient it promotes the product to its own dtype on every device; ``out=``
    rounds the result once, without a float32 buffer of the gradient's size."""
    factor = upstream.reshape([1] * gradient.dim())
    return torch.mul(gradient, factor, out=torch.empty_like(gradient))


def linear_loss_in_forward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    chunk_rows: ChunkRows,
    chunk_size: int,
    gradients: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, ce, ntl)``: CE + ``ntl_weight``·NTL of the logits ``hidden @ weight.T + bias``
    through ``chunk_rows`` (its labels, settings and backend), ``chunk_size`` rows at a time.

    ``hidden`` (M, H) the flattened hidden states, ``weight`` (V, H), ``bias`` (V,) or None.
    With ``gradients`` (autograd records and one of them requires grad) the gradients of those
    that require grad are computed in the forward pass, for a scalar reduction only (``"mean"``
    or ``"sum"``); without, the loss alone (any reduction). The loss weights must not require a
    gradient (they would get none). Not for ``torch.compile``: dynamo does not trace the torch
    backend's ``torch.func.vjp`` inside an ``autograd.Function``."""
    loss, ce, ntl = _LossWithGradients.apply(  # type: ignore[no-untyped-call]
        hidden, weight, bias, chunk_rows, chunk_size, gradients
    )
    return loss, ce, ntl
