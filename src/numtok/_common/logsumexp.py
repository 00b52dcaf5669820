"""Full-vocabulary log-sum-exp of selected logit rows, without upcasting or copying the logits."""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

# Rows are processed in chunks of about this many elements, so a bf16 logits tensor is never
# upcast as a whole: the float32 working copy is at most 2**22 elements (16 MiB).
_CHUNK_ELEMENTS = 1 << 22


def _rows_per_chunk(row_length: int) -> int:
    return max(1, _CHUNK_ELEMENTS // max(1, row_length))


class _SelectedRowsLogSumExp(torch.autograd.Function):
    """``lse[k] = log Σ_v exp(logits[rows[k], v])`` in ``compute_dtype``.

    Backward: ``∂lse[k]/∂logits[rows[k], v] = softmax(logits[rows[k]])_v``, written straight into
    a gradient of the logits' shape and dtype; rows not selected get zero gradient. A row that is
    entirely ``-inf`` has ``lse = -inf`` and gets a zero gradient instead of NaN.
    """

    @staticmethod
    def forward(
        ctx: Any, logits: torch.Tensor, rows: torch.Tensor, compute_dtype: torch.dtype
    ) -> torch.Tensor:
        lse = torch.empty(rows.numel(), dtype=compute_dtype, device=logits.device)
        step = _rows_per_chunk(logits.shape[-1])
        for start in range(0, rows.numel(), step):
            block = logits.index_select(0, rows[start : start + step]).to(compute_dtype)  # (k, V)
            lse[start : start + step] = torch.logsumexp(block, dim=-1)
        ctx.save_for_backward(logits, rows, lse)
        return lse

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_lse: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        logits, rows, lse = ctx.saved_tensors
        grad_logits = torch.zeros_like(logits)
        finite_lse = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
        step = _rows_per_chunk(logits.shape[-1])
        for start in range(0, rows.numel(), step):
            chunk_rows = rows[start : start + step]
            block = logits.index_select(0, chunk_rows).to(lse.dtype)  # (k, V)
            softmax = torch.exp(block - finite_lse[start : start + step, None])
            grad_rows = softmax * grad_lse[start : start + step, None]
            grad_logits.index_copy_(0, chunk_rows, grad_rows.to(logits.dtype))
        return grad_logits, None, None


def selected_rows_logsumexp(
    logits: torch.Tensor, rows: torch.Tensor, compute_dtype: torch.dtype
) -> torch.Tensor:
    """Log-sum-exp over the last dim of ``logits[rows]`` for 2-D ``logits`` (M, V), (K,) result.

    Works in row chunks of at most ``2**22`` elements in ``compute_dtype``; the selected rows are
    never materialised in full and nothing but ``logits`` itself is kept for backward.
    """
    result: torch.Tensor = _SelectedRowsLogSumExp.apply(  # type: ignore[no-untyped-call]
        logits, rows, compute_dtype
    )
    return result
