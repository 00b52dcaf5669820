"""The autograd node of a loss whose forward pass also writes the logits' gradient.

Cross-entropy + NTL reduced to a scalar is a sum of per-row terms whose scales are known before
any logit is read, so a backend can write the logits' gradient for a unit upstream gradient in
the same pass that computes the loss (Liger-Kernel's scheme): one read and one write of (M, V).
Backward then only multiplies that buffer by the upstream gradient (a scalar, or one value per
row for ``reduction="none"``) and hands it out. Both backends (:mod:`numtok.kernels.torch_rows`,
:mod:`numtok.kernels.triton_loss`) go through :func:`loss_with_gradient_in_forward`, each with
its own pass and its own scaling.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.autograd.function import once_differentiable

__all__ = ["ComputeInto", "ScaleBy", "loss_with_gradient_in_forward"]

#: ``compute(flat_logits (M, V), gradient (M, V)) -> (loss, ce, ntl)``: the loss terms, with the
#: logits' gradient for a unit upstream gradient written into ``gradient`` (which may be
#: ``flat_logits`` itself).
ComputeInto = Callable[
    [torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]
]
#: ``scale(gradient (M, V), upstream)`` multiplies the gradient in place by the upstream gradient
#: of the loss (one value, or M values for ``reduction="none"``).
ScaleBy = Callable[[torch.Tensor, torch.Tensor], None]


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
            raise RuntimeError(
                "cross_entropy_with_ntl computes the logits' gradient in its forward pass and "
                "hands it out in the first backward; a second backward through the same call "
                "(retain_graph=True) is not supported: call the loss again"
            )
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
