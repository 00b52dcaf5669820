"""The autograd nodes of a loss whose logits' gradient is written in one pass over them.

Cross-entropy + NTL reduced to a scalar is a sum of per-row terms whose scales are known before
any logit is read, so a backend can write the logits' gradient for a unit upstream gradient in
the same pass that computes the loss (Liger-Kernel's scheme): one read and one write of (M, V).
Backward then only multiplies that buffer by the upstream gradient (a scalar, or one value per
row for ``reduction="none"``) and hands it out. Both backends (:mod:`numtok.ops.kernels.torch_rows`,
:mod:`numtok.ops.kernels.triton_loss`) go through :func:`loss_with_gradient_in_forward`, each with
its own pass and its own scaling.

float16 cannot take that order (:func:`gradient_waits_for_upstream`): its smallest subnormal is
2^-24, and a unit-upstream gradient entry ``softmax/num_items`` ((1/4,096)/32,768 = 7.5e-9)
is 0 there before GradScaler's 2^16 arrives to lift it (95 % of a 4,096-column row's entries that
``F.cross_entropy`` keeps, measured). :func:`loss_with_gradient_in_backward` computes the loss
in forward (one read) and writes the gradient in backward, with the upstream gradient folded
into its coefficients before anything is rounded (one more read and the write), as
``F.cross_entropy`` does.

The same order is also the cheaper one wherever it is known in forward that the upstream
gradient ``u`` will not be exactly 1 (:func:`gradient_in_backward`). Counted in passes over
(M, V), a read or a write each: the gradient written in forward costs 2 when ``u = 1`` (one read,
one write, backward does nothing) and 4 otherwise (backward reads and writes the gradient again
to scale it); written in backward it costs 3 whatever ``u`` is (a read in forward; a read and the
write in backward, ``u`` folded into the per-row coefficients, rounded once).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.autograd.function import once_differentiable

__all__ = [
    "ComputeInto",
    "ComputeThenWrite",
    "ScaleBy",
    "WriteGradient",
    "gradient_in_backward",
    "gradient_waits_for_upstream",
    "loss_with_gradient_in_backward",
    "loss_with_gradient_in_forward",
]

#: ``compute(flat_logits (M, V), gradient (M, V)) -> (loss, ce, ntl)``: the loss terms, with the
#: logits' gradient for a unit upstream gradient written into ``gradient`` (which may be
#: ``flat_logits`` itself).
ComputeInto = Callable[
    [torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]
]
#: ``scale(gradient (M, V), upstream)`` multiplies the gradient in place by the upstream gradient
#: of the loss (one value, or M values for ``reduction="none"``).
ScaleBy = Callable[[torch.Tensor, torch.Tensor], None]
#: ``write(flat_logits (M, V), gradient (M, V), upstream)`` writes the logits' gradient for the
#: upstream gradient of the loss (one value, or M) into ``gradient`` (which may be
#: ``flat_logits`` itself), rounded once to its dtype.
WriteGradient = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]
#: ``compute(flat_logits (M, V)) -> (loss, ce, ntl, write)``: the loss terms, and the
#: :data:`WriteGradient` of the same call for backward.
ComputeThenWrite = Callable[
    [torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor, WriteGradient]
]

_ONE_BACKWARD = (
    "cross_entropy_with_ntl hands out the logits' gradient in the first backward; a second "
    "backward through the same call (retain_graph=True) is not supported: call the loss again"
)


def gradient_waits_for_upstream(dtype: torch.dtype) -> bool:
    """Whether logits of ``dtype`` get their gradient in backward, once the upstream gradient
    is known (:func:`loss_with_gradient_in_backward`): float16, whose range ends at 2^-24, where
    the unit-upstream entries of a loss divided by a batch's tokens already lie (bfloat16 has
    float32's range)."""
    return dtype == torch.float16


def gradient_in_backward(logits: torch.Tensor, reduction: str) -> bool:
    """Whether the loss of ``logits`` writes their gradient in backward
    (:func:`loss_with_gradient_in_backward`: 3 passes over (M, V) for any upstream gradient
    ``u``) rather than in forward (:func:`loss_with_gradient_in_forward`: 2 passes for ``u = 1``,
    4 otherwise), from what is known when forward runs, without reading anything back from the
    device:

    * float16 logits (:func:`gradient_waits_for_upstream`): for their range, whatever ``u``;
    * ``reduction="none"``: ``u`` is one value per position (a weighting, a sum divided by a
      count), practically never all exactly 1;
    * a scalar loss computed under float16 autocast on the logits' device: float16 training
      scales the loss with a GradScaler (``u`` = its scale, 2^16 at first, a power of two), as
      it must for float16's range; without one this costs one pass more than needed (3, not 2).

    Every other scalar loss (``loss.backward()`` in bfloat16 or float32, which need no loss
    scale) writes the gradient in forward: for ``u = 1`` that is the least traffic there is,
    and backward decides on the device whether to scale. A loss divided afterwards (by the
    accumulation steps) pays the 4 passes; folding that division into ``num_items_in_batch``
    (the tokens of all micro-batches) keeps ``u = 1``."""
    if gradient_waits_for_upstream(logits.dtype) or reduction == "none":
        return True
    device = logits.device.type
    return (
        torch.amp.is_autocast_available(device)
        and torch.is_autocast_enabled(device)
        and torch.get_autocast_dtype(device) == torch.float16
    )


class _GradientInForward(torch.autograd.Function):
    """``(loss, ce, ntl)`` of ``logits`` (..., V); ``ce`` and ``ntl`` are not differentiable.
    The gradient goes into a fresh (M, V) buffer or, with ``inplace``, into the logits' own
    storage; backward can run once."""

    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        vocab_size: int,
        inplace: bool,
        compute: ComputeInto,
        scale: ScaleBy,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        flat = logits.view(-1, vocab_size) if inplace else logits.reshape(-1, vocab_size)
        gradient = flat if inplace else torch.empty_like(flat)  # (M, V)
        loss, ce, ntl = compute(flat, gradient)
        if inplace:
            # The logits now hold their gradient: any other autograd node that saved them fails
            # loudly in backward ("modified by an inplace operation") instead of using it.
            torch.autograd.graph.increment_version(logits)
        ctx.gradient = gradient
        ctx.scale = scale
        ctx.logits_shape = logits.shape
        ctx.mark_non_differentiable(ce, ntl)
        return loss, ce, ntl

    @staticmethod
    @once_differentiable
    def backward(
        ctx: Any, grad_loss: torch.Tensor, *_: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        gradient = ctx.gradient
        if gradient is None:
            raise RuntimeError(_ONE_BACKWARD)
        ctx.gradient = None
        ctx.scale(gradient, grad_loss)
        return gradient.view(ctx.logits_shape), None, None, None, None


def loss_with_gradient_in_forward(
    logits: torch.Tensor, vocab_size: int, inplace: bool, compute: ComputeInto, scale: ScaleBy
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, ce, ntl)`` from ``compute``, differentiable in ``logits`` through the gradient
    that ``compute`` wrote (scaled in backward by ``scale``)."""
    loss, ce, ntl = _GradientInForward.apply(  # type: ignore[no-untyped-call]
        logits, vocab_size, inplace, compute, scale
    )
    return loss, ce, ntl


class _GradientInBackward(torch.autograd.Function):
    """``(loss, ce, ntl)`` of ``logits`` (..., V); ``ce`` and ``ntl`` are not differentiable.
    The logits are saved (version-checked: changed in place after the call, backward raises);
    backward writes their gradient into a fresh (M, V) buffer or, with ``inplace``, into their
    own storage, and can run once."""

    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        vocab_size: int,
        inplace: bool,
        compute: ComputeThenWrite,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        loss, ce, ntl, write = compute(logits.reshape(-1, vocab_size))  # (M, V)
        if inplace:
            # Backward overwrites the logits: any other node that saved them fails loudly in
            # its backward ("modified by an inplace operation"), as with the gradient written
            # in forward.
            torch.autograd.graph.increment_version(logits)
        ctx.save_for_backward(logits)
        ctx.write, ctx.vocab_size, ctx.inplace = write, vocab_size, inplace
        ctx.mark_non_differentiable(ce, ntl)
        return loss, ce, ntl

    @staticmethod
    @once_differentiable
    def backward(
        ctx: Any, grad_loss: torch.Tensor, *_: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        if ctx.write is None:
            raise RuntimeError(_ONE_BACKWARD)
        write, ctx.write = ctx.write, None
        (logits,) = ctx.saved_tensors
        flat = (
            logits.view(-1, ctx.vocab_size) if ctx.inplace else logits.reshape(-1, ctx.vocab_size)
        )
        gradient = flat if ctx.inplace else torch.empty_like(flat)
        write(flat, gradient, grad_loss)
        return gradient.view(logits.shape), None, None, None


def loss_with_gradient_in_backward(
    logits: torch.Tensor, vocab_size: int, inplace: bool, compute: ComputeThenWrite
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, ce, ntl)`` from ``compute``, differentiable in ``logits`` through the
    :data:`WriteGradient` it returns, which backward calls with the upstream gradient."""
    loss, ce, ntl = _GradientInBackward.apply(  # type: ignore[no-untyped-call]
        logits, vocab_size, inplace, compute
    )
    return loss, ce, ntl
