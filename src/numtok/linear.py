"""Cross-entropy plus the Number Token Loss straight from the hidden states: the (M, V) logits of
the output layer never exist.

``linear_cross_entropy_with_ntl(hidden, weight, labels, vocab, bias=b, ...)`` has the value and the
gradients (for ``hidden``, ``weight`` and ``bias``) of ``cross_entropy_with_ntl(hidden @ weight.T
+ b, labels, vocab, ...)``. Forward goes over chunks of ``c`` tokens: it computes each chunk's
logits (c, V), keeps only their row statistics (log-sum-exp, the label's logit, the N
number-token logits; see :mod:`numtok._fused_rows`) and drops them. Backward goes over blocks of
vocabulary columns holding as many logits, for all tokens at once: it recomputes the block's
logits (M, C), turns them in place into ``G = ∂L/∂logits[:, block]`` (the row statistics carry
everything the softmax needs) and multiplies out: ``∂L/∂W[block] = Gᵀ @ hidden`` and
``∂L/∂b[block] = Σ_rows G`` in one product each, ``∂L/∂hidden += G @ W[block]``. Slicing the
backward by columns writes the weight's gradient once, with no sum over chunks (which in bfloat16
would need a float32 copy of the weight). The price is one extra matrix product (the
recomputation) for a peak memory of one (c, V) buffer plus the gradients, instead of several
(M, V) buffers.
"""

from __future__ import annotations

from typing import Any

import torch

from numtok._fused_rows import compute_row_statistics, write_row_gradient
from numtok._ntl_maths import Kind, LossSpec
from numtok._number_logits import compute_dtype
from numtok._validation import (
    check_logits_and_labels,
    check_loss_weights,
    check_ntl_weight,
    check_num_items,
)
from numtok.fused import CEWithNTLOutput, combine_terms, prepare_rows
from numtok.vocab import NumberVocab

__all__ = ["linear_cross_entropy_with_ntl"]

# Below about 256 rows a (rows, H) @ (H, V) product is limited by streaming the (V, H) weight, not
# by arithmetic (measured on CPU: 67 GFLOP/s at 32 rows, 125-150 at 256-1024).
_MIN_CHUNK_ROWS = 256


def default_chunk_size(num_tokens: int, hidden_size: int) -> int:
    """Rows per chunk: H, so that a chunk's logits (H, V) take as much memory as the weight
    (V, H) and its gradient, which exist anyway; at least 256 rows, so that the matrix products
    stay compute-bound (on CPU, a (4096, 1024) @ (1024, 131072) product in chunks of 256 rows
    took 16% longer than in chunks of 1024); and at most M."""
    return max(1, min(num_tokens, max(_MIN_CHUNK_ROWS, hidden_size)))


def _logits_into(
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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    num_tokens = hidden.shape[0]
    lse = hidden.new_empty(num_tokens, dtype=compute_dtype)
    target_logit = hidden.new_empty(num_tokens, dtype=compute_dtype)
    number_logits = hidden.new_empty(num_tokens, number_ids.shape[0], dtype=compute_dtype)
    buffer = hidden.new_empty(min(chunk_size, num_tokens), weight.shape[0])  # (c, V)
    for start in range(0, num_tokens, chunk_size):
        rows = slice(start, start + chunk_size)
        chunk = hidden[rows]
        logits = _logits_into(buffer[: chunk.shape[0]], chunk, weight, bias)
        stats = compute_row_statistics(logits, target_ids[rows], number_ids, compute_dtype)
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
        grad_logits = _logits_into(block_logits, hidden, block_weight, block_bias)  # (M, C)
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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (
        torch.empty_like(hidden) if needs_hidden else hidden.new_empty(0),
        torch.empty_like(weight) if needs_weight else weight.new_empty(0),
        weight.new_empty(weight.shape[0] if needs_bias else 0),
    )


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    hidden, weight, bias, target_ids, number_ids, chunk_size, _ = inputs
    ctx.save_for_backward(hidden, weight, bias, target_ids, number_ids, output[0])
    ctx.chunk_size = chunk_size


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
    )
    wanted = (needs_hidden, needs_weight, needs_bias)
    return *(grad if need else None for grad, need in zip(grads, wanted, strict=True)), *[None] * 4


_linear_row_statistics.register_autograd(_backward, setup_context=_setup_context)


def _require_tensor(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def _check_linear_inputs(
    hidden: object, weight: object, bias: object, labels: object, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """hidden (..., H) and weight (V, H) of one floating dtype, bias (V,) or None, V equal to
    the vocabulary's size, labels of shape (...); the labels' dtype and range are checked by
    :func:`~numtok._validation.check_logits_and_labels`."""
    hidden = _require_tensor("hidden", hidden)
    weight = _require_tensor("weight", weight)
    labels = _require_tensor("labels", labels)
    if not hidden.is_floating_point():
        raise TypeError(f"hidden must be floating point, got {hidden.dtype}")
    if weight.dtype != hidden.dtype:
        raise TypeError(
            f"weight must have the hidden states' dtype {hidden.dtype}, got {weight.dtype}"
        )
    if hidden.dim() < 1 or weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(
            f"weight must have shape (vocab_size, hidden_size) with hidden_size = "
            f"hidden.shape[-1]: hidden has shape {tuple(hidden.shape)}, weight has shape "
            f"{tuple(weight.shape)}"
        )
    if weight.shape[0] != vocab_size:
        raise ValueError(
            f"weight has {weight.shape[0]} rows (one per logit) but the NumberVocab was built "
            f"for vocab_size={vocab_size}; build it with vocab_size={weight.shape[0]}"
        )
    if bias is not None:
        bias = _require_tensor("bias", bias)
        if bias.dtype != hidden.dtype or tuple(bias.shape) != (vocab_size,):
            raise ValueError(
                f"bias must have shape ({vocab_size},) and dtype {hidden.dtype}, got shape "
                f"{tuple(bias.shape)} and dtype {bias.dtype}"
            )
    if tuple(labels.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(
            f"labels must have shape hidden.shape[:-1] = {tuple(hidden.shape[:-1])}, "
            f"got {tuple(labels.shape)}"
        )
    return hidden, weight, bias, labels


def _check_chunk_size(chunk_size: object) -> int | None:
    if chunk_size is None:
        return None
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        raise TypeError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size}")
    return chunk_size


def linear_cross_entropy_with_ntl(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    vocab: NumberVocab,
    *,
    bias: torch.Tensor | None = None,
    chunk_size: int | None = None,
    ntl_weight: float = 0.3,
    kind: Kind = "was",
    reweigh: bool = False,
    squash_factor: float | None = None,
    loss_weights: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    num_items_in_batch: torch.Tensor | int | None = None,
    shift: bool = False,
) -> CEWithNTLOutput:
    """Cross-entropy plus ``ntl_weight`` times the Number Token Loss of the logits
    ``hidden @ weight.T + bias``, without materialising them.

    Value and gradients (for ``hidden``, ``weight`` and ``bias``) equal
    ``cross_entropy_with_ntl(hidden @ weight.T + bias, labels, vocab, ...)``; see
    :func:`~numtok.fused.cross_entropy_with_ntl` for the exact formula and the settings.

    Memory: one buffer of ``chunk_size·V`` logits, the row statistics (M + M·N numbers) and the
    gradients themselves, instead of the (M, V) logits and the buffers of their backward. Time:
    four (M, H, V) matrix products instead of three (backward recomputes the logits, block by
    block of vocabulary columns). For bfloat16/float16 the hidden states' gradient is summed over
    the blocks in float32. As in ``cross_entropy_with_ntl``, only the argument checks synchronise
    with the host.

    Args:
        hidden: (..., H) the hidden states before the output layer; float dtype.
        weight: (V, H) the output layer's weight, same dtype; V must equal ``vocab.vocab_size``.
        labels: (...) integer token ids in [0, V) or ``ignore_index``, the hidden states' shape
            without H.
        vocab: the :class:`~numtok.NumberVocab` of the tokenizer.
        bias: (V,) the output layer's bias, or None.
        chunk_size: tokens per forward chunk; backward blocks hold as many logits
            (``chunk_size·V / M`` columns). Default: H tokens, so that the logits buffer is as
            large as the weight; at least 256 (the matrix products stay compute-bound) and at
            most all of them.
        ntl_weight, kind, reweigh, squash_factor, loss_weights, ignore_index, reduction,
        num_items_in_batch, shift: as in :func:`~numtok.fused.cross_entropy_with_ntl`.

    Returns:
        :class:`~numtok.fused.CEWithNTLOutput` (``loss``, detached ``ce`` and ``ntl``).

    Example:
        >>> import torch
        >>> from numtok import NumberVocab
        >>> from numtok.fused import cross_entropy_with_ntl
        >>> from numtok.linear import linear_cross_entropy_with_ntl
        >>> vocab = NumberVocab.from_values({i: str(i) for i in range(10)}, vocab_size=12)
        >>> hidden, weight = torch.randn(2, 5, 8), torch.randn(12, 8)
        >>> labels = torch.tensor([[4, 11, 7, -100, 5]] * 2)
        >>> out = linear_cross_entropy_with_ntl(hidden, weight, labels, vocab, chunk_size=3)
        >>> reference = cross_entropy_with_ntl(hidden @ weight.T, labels, vocab)
        >>> bool(torch.isclose(out.loss, reference.loss))
        True
    """
    spec = LossSpec.build(
        vocab,
        kind=kind,
        reweigh=reweigh,
        squash_factor=squash_factor,
        ignore_index=ignore_index,
        reduction=reduction,
        shift=shift,
    )
    weight_of_ntl = check_ntl_weight(ntl_weight)
    hidden, weight, bias, labels = _check_linear_inputs(
        hidden, weight, bias, labels, spec.vocab_size
    )
    rows_per_chunk = _check_chunk_size(chunk_size)
    # The label checks (integer dtype, ids in range) need only the logits' shape and dtype: a
    # zero-stride view stands in for the logits that are never built.
    logits_like = hidden.new_empty(()).expand(*labels.shape, spec.vocab_size)
    _, labels = check_logits_and_labels(
        logits_like, labels, vocab_size=spec.vocab_size, ignore_index=spec.ignore_index
    )
    loss_weights = check_loss_weights(loss_weights, labels.shape)
    num_items = check_num_items(num_items_in_batch)

    tables = vocab.tables(hidden.device)
    dtype = compute_dtype(hidden)
    rows, shape = prepare_rows(labels, loss_weights, tables, spec, dtype)
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])  # (M, H)
    num_tokens = flat_hidden.shape[0]
    if rows_per_chunk is None:
        rows_per_chunk = default_chunk_size(num_tokens, hidden.shape[-1])
    lse, target_logit, number_logits = _linear_row_statistics(
        flat_hidden, weight, bias, rows.target_ids, tables.ids, rows_per_chunk, dtype
    )
    return combine_terms(
        lse, target_logit, number_logits, rows, tables, spec, weight_of_ntl, num_items, shape
    )
