"""The logits-free pass that recomputes the logits in backward: forward keeps only the row
statistics, backward recomputes the logits block by block of vocabulary columns.

Forward goes over chunks of ``c`` tokens: it computes each chunk's logits (c, V), keeps only their
row statistics (log-sum-exp, the label's logit, the N number-token logits; see
:mod:`numtok.ops.kernels.torch_rows`) and drops them; the loss is then assembled from the statistics
with ordinary autograd (:func:`numtok.ops.row_algebra.combine_terms`), so the upstream gradient may
differ per position (``reduction="none"``). Backward goes over blocks of vocabulary columns holding
as many logits, for all tokens at once: it recomputes the block's logits (M, C), turns them in place
into ``G = ∂L/∂logits[:, block]`` (the row statistics carry everything the softmax needs) and
multiplies out: ``∂L/∂W[block] = Gᵀ @ hidden`` and ``∂L/∂b[block] = Σ_rows G`` in one product
each, ``∂L/∂hidden += G @ W[block]``. Slicing the backward by columns writes the weight's gradient
once, with no sum over chunks. The price is one extra matrix product (the recomputation): four
(M, H, V) products where the gradient-in-forward pass (:mod:`numtok.ops.linear_in_forward`) needs
three. Both ops are ``torch.library`` custom ops, so ``torch.compile`` sees one node each.
"""

# No `from __future__ import annotations` here: torch.library.custom_op reads the ops' annotations
# as types, and torch before 2.5 cannot read them as strings (ValueError: infer_schema(func)).

from typing import Any

import torch

from numtok.ops.kernels.torch_rows import compute_row_statistics, write_row_gradient

__all__ = ["linear_row_statistics", "logits_into"]


def logits_into(
    out: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``hidden @ weight.T (+ bias)`` written into ``out`` (rows, columns)."""
    torch.mm(hidden, weight.t(), out=out)
    return out if bias is None else out.add_(bias)


@torch.library.custom_op("numtok::linear_row_statistics", mutates_args=())
def _linear_row_statistics(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    target_ids: torch.Tensor,
    number_ids: torch.Tensor,
    chunk_size: int,
    compute_dtype: torch.dtype,
    softcap: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    num_tokens = hidden.shape[0]
    lse = hidden.new_empty(num_tokens, dtype=compute_dtype)
    target_logit = hidden.new_empty(num_tokens, dtype=compute_dtype)
    number_logits = hidden.new_empty(num_tokens, number_ids.shape[0], dtype=compute_dtype)
    buffer = hidden.new_empty(min(chunk_size, num_tokens), weight.shape[0])  # (c, V)
    for start in range(0, num_tokens, chunk_size):
        rows = slice(start, start + chunk_size)
        chunk = hidden[rows]
        logits = logits_into(buffer[: chunk.shape[0]], chunk, weight, bias)
        stats = compute_row_statistics(logits, target_ids[rows], number_ids, compute_dtype, softcap)
        lse[rows], target_logit[rows], number_logits[rows] = stats
    return lse, target_logit, number_logits


@_linear_row_statistics.register_fake
def _(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    target_ids: torch.Tensor,
    number_ids: torch.Tensor,
    chunk_size: int,
    compute_dtype: torch.dtype,
    softcap: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    num_tokens = hidden.shape[0]
    return (
        hidden.new_empty(num_tokens, dtype=compute_dtype),
        hidden.new_empty(num_tokens, dtype=compute_dtype),
        hidden.new_empty(num_tokens, number_ids.shape[0], dtype=compute_dtype),
    )


def _vocabulary_block(chunk_size: int, num_tokens: int, vocab_size: int) -> int:
    """Columns per backward block: the (M, block) logits hold as many numbers as a forward chunk
    (chunk_size, V)."""
    return max(1, min(vocab_size, chunk_size * vocab_size // max(1, num_tokens)))


@torch.library.custom_op("numtok::linear_row_statistics_backward", mutates_args=())
def _linear_row_statistics_backward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    target_ids: torch.Tensor,
    number_ids: torch.Tensor,
    lse: torch.Tensor,
    grad_lse: torch.Tensor,
    grad_target: torch.Tensor,
    grad_numbers: torch.Tensor,
    chunk_size: int,
    needs_hidden: bool,
    needs_weight: bool,
    needs_bias: bool,
    softcap: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients for (hidden, weight, bias); an empty tensor for each one not needed.

    Works over blocks of vocabulary columns, all tokens at once: each block's logits (M, C) are
    recomputed and turned in place into ``G = ∂L/∂logits[:, block]``; then ``∂L/∂W[block] = Gᵀ @
    hidden`` and ``∂L/∂b[block] = Σ_rows G`` are final (one product over all M tokens, no
    accumulation), and ``∂L/∂hidden += G @ W[block]`` accumulates a small (M, H) sum, in float32
    for bfloat16/float16."""
    num_tokens, vocab_size = hidden.shape[0], weight.shape[0]
    compute_dtype = lse.dtype
    grad_weight = torch.empty_like(weight) if needs_weight else weight.new_empty(0)
    grad_bias = weight.new_empty(vocab_size if needs_bias else 0)
    grad_hidden = hidden.new_zeros(hidden.shape if needs_hidden else 0, dtype=compute_dtype)
    low_precision = needs_hidden and hidden.dtype != compute_dtype
    hidden_part = torch.empty_like(hidden) if low_precision else None  # (M, H) G @ W[block]
    width = _vocabulary_block(chunk_size, num_tokens, vocab_size)
    buffer = hidden.new_empty(num_tokens * width)
    for start in range(0, vocab_size, width):
        columns = slice(start, start + width)
        block_weight = weight[columns]  # (C, H)
        block_logits = buffer[: num_tokens * len(block_weight)].view(num_tokens, len(block_weight))
        block_bias = None if bias is None else bias[columns]
        grad_logits = logits_into(block_logits, hidden, block_weight, block_bias)  # (M, C)
        write_row_gradient(
            grad_logits,
            grad_logits,
            lse,
            target_ids,
            number_ids,
            grad_lse,
            grad_target,
            grad_numbers,
            first_column=start,
            softcap=softcap,
        )  # (M, C), now ∂L/∂logits[:, columns]
        if needs_weight:
            torch.mm(grad_logits.t(), hidden, out=grad_weight[columns])
        if needs_bias:
            grad_bias[columns] = grad_logits.sum(0, dtype=compute_dtype)
        if hidden_part is not None:
            grad_hidden.add_(torch.mm(grad_logits, block_weight, out=hidden_part))
        elif needs_hidden:
            grad_hidden.addmm_(grad_logits, block_weight)
    return grad_hidden.to(hidden.dtype), grad_weight, grad_bias


@_linear_row_statistics_backward.register_fake
def _(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    target_ids: torch.Tensor,
    number_ids: torch.Tensor,
    lse: torch.Tensor,
    grad_lse: torch.Tensor,
    grad_target: torch.Tensor,
    grad_numbers: torch.Tensor,
    chunk_size: int,
    needs_hidden: bool,
    needs_weight: bool,
    needs_bias: bool,
    softcap: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (
        torch.empty_like(hidden) if needs_hidden else hidden.new_empty(0),
        torch.empty_like(weight) if needs_weight else weight.new_empty(0),
        weight.new_empty(weight.shape[0] if needs_bias else 0),
    )


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    hidden, weight, bias, target_ids, number_ids, chunk_size, _, softcap = inputs
    ctx.save_for_backward(hidden, weight, bias, target_ids, number_ids, output[0])
    ctx.chunk_size, ctx.softcap = chunk_size, softcap


def _backward(
    ctx: Any, grad_lse: torch.Tensor, grad_target: torch.Tensor, grad_numbers: torch.Tensor
) -> tuple[torch.Tensor | None, ...]:
    hidden, weight, bias, target_ids, number_ids, lse = ctx.saved_tensors
    needs_hidden, needs_weight, needs_bias = ctx.needs_input_grad[:3]
    grads = _linear_row_statistics_backward(
        hidden,
        weight,
        bias,
        target_ids,
        number_ids,
        lse,
        grad_lse,
        grad_target,
        grad_numbers,
        ctx.chunk_size,
        needs_hidden,
        needs_weight,
        needs_bias,
        ctx.softcap,
    )
    wanted = (needs_hidden, needs_weight, needs_bias)
    return *(grad if need else None for grad, need in zip(grads, wanted, strict=True)), *[None] * 5


_linear_row_statistics.register_autograd(_backward, setup_context=_setup_context)


def linear_row_statistics(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    target_ids: torch.Tensor,
    number_ids: torch.Tensor,
    chunk_size: int,
    compute_dtype: torch.dtype,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(lse (M,), logits[r, target_ids[r]] (M,), logits[:, number_ids] (M, N))`` of the logits
    ``hidden @ weight.T + bias`` (M, V) (soft-capped with ``softcap``), computed ``chunk_size``
    rows at a time, in ``compute_dtype``; differentiable for ``hidden`` (M, H), ``weight`` (V, H)
    and ``bias`` (V,), with the logits recomputed in backward."""
    return _linear_row_statistics(  # type: ignore[no-any-return]
        hidden, weight, bias, target_ids, number_ids, chunk_size, compute_dtype, softcap
    )
