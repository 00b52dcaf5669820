"""Where a number loss reads a row's number-token logits and its full-vocabulary log-sum-exp: from
the logits (:class:`LogitsRows`), or from the output layer's number rows and the hidden states —
the number head (:class:`HeadRows`).

The token-level and the number-level losses read a position ``r`` only through

* ``z_r = x_r[ids]``, its N number-token logits, and
* ``lse_r = log Σ_v exp(x_r,v)``, its full-vocabulary log-sum-exp (``reweigh`` only),

and only at the positions whose label is a number token. So with the output layer
``x = h @ Wᵀ + b`` they need no logits at all: ``z_r = h_r @ W[ids]ᵀ + b[ids]``, a (P, H) × (H, N)
product where the logits are (M, H) × (H, V), and ``lse`` from whatever computes the
cross-entropy beside them. A source hands out both for the rows asked for, in the compute dtype;
autograd carries the gradients back to whatever they were read from (only those rows of the
logits, of the hidden states and of the weight get any).
"""

from __future__ import annotations

from typing import Protocol

import torch

from numtok._common.logsumexp import selected_rows_logsumexp
from numtok.ops.number_logits import number_logits_at

__all__ = ["HeadRows", "LogitsRows", "NumberRows"]


class NumberRows(Protocol):
    """What a number loss reads of the positions it scores (see the module docstring)."""

    dtype: torch.dtype  # the compute dtype: float64 for float64 inputs, float32 otherwise

    def number_logits(self, rows: torch.Tensor | None) -> torch.Tensor:
        """(R, N) the finite number-token logits of the flat positions ``rows`` (R,), of every
        position for None (R = M)."""
        ...

    def lse(self, rows: torch.Tensor | None, label_logit: torch.Tensor) -> torch.Tensor:
        """(R,) the full-vocabulary log-sum-exp at ``rows`` (every position for None);
        ``label_logit`` (R,) is the logit of each row's label, one of its number logits."""
        ...


class LogitsRows:
    """The rows of a logits tensor (..., V), gathered only at the positions asked for; ``ids``
    (N,) the number-token columns."""

    def __init__(self, logits: torch.Tensor, ids: torch.Tensor, dtype: torch.dtype) -> None:
        self.logits, self.ids, self.dtype = logits, ids, dtype

    def number_logits(self, rows: torch.Tensor | None) -> torch.Tensor:
        return number_logits_at(self.logits, rows, self.ids, self.dtype)

    def lse(self, rows: torch.Tensor | None, label_logit: torch.Tensor) -> torch.Tensor:
        flat = self.logits.reshape(-1, self.logits.shape[-1])  # (M, V)
        if rows is None:
            rows = torch.arange(flat.shape[0], device=flat.device)
        return selected_rows_logsumexp(flat, rows, self.dtype)


class HeadRows:
    """The number head: the rows of the logits ``softcap(hidden @ weight.T + bias)`` that a number
    loss reads, computed from ``hidden`` (M, H) at the rows asked for and ``weight[ids]`` (N, H)
    only, in the compute dtype (bfloat16/float16 inputs give float32 number logits).

    The log-sum-exp comes from beside the head: ``lse`` (M,) as a cross-entropy kernel returns it,
    or ``label_log_probs`` (M,), the log-probability of each position's label, since at a
    position whose label is a number token ``lse = z_label - log p_label`` (``z_label`` is one of
    the number logits). Both are read only at the rows asked for, and their gradient flows back
    to what computed them."""

    def __init__(
        self,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        ids: torch.Tensor,
        dtype: torch.dtype,
        *,
        softcap: float | None = None,
        lse: torch.Tensor | None = None,
        label_log_probs: torch.Tensor | None = None,
    ) -> None:
        self.hidden, self.weight, self.bias, self.ids = hidden, weight, bias, ids
        self.dtype, self.softcap = dtype, softcap
        self.full_lse, self.label_log_probs = lse, label_log_probs

    def number_logits(self, rows: torch.Tensor | None) -> torch.Tensor:
        hidden = self.hidden if rows is None else self.hidden.index_select(0, rows)
        hidden = hidden.to(self.dtype)  # (R, H)
        number_rows = self.weight.index_select(0, self.ids).to(self.dtype)  # (N, H)
        if self.bias is None:
            logits = hidden @ number_rows.T  # (R, N)
        else:
            logits = torch.addmm(self.bias.index_select(0, self.ids).to(self.dtype), hidden,
                                 number_rows.T)  # fmt: skip
        if self.softcap is not None:
            logits = self.softcap * torch.tanh(logits / self.softcap)
        # In self.dtype also under autocast, whose products come out in bfloat16 (torch 2.4
        # refuses to clamp those at float32's minimum).
        return logits.to(self.dtype).clamp_min(torch.finfo(self.dtype).min)

    def lse(self, rows: torch.Tensor | None, label_logit: torch.Tensor) -> torch.Tensor:
        given = self.full_lse if self.full_lse is not None else self.label_log_probs
        assert given is not None, "checked by the caller: lse or label_log_probs"
        at_rows = (given if rows is None else given.index_select(0, rows)).to(self.dtype)
        return at_rows if self.full_lse is not None else label_logit - at_rows
