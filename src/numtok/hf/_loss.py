"""The loss both Hugging Face routes compute (the Trainer adapter, :mod:`numtok.hf.trainer`, and
the patched forward, :mod:`numtok.hf.patch`): ``Σ ce / tokens + ntl_weight · Σ ntl / numbers``,
from the logits or logits-free, and the counts and denominators it is divided by."""

from __future__ import annotations

import torch

from numtok._common.shift import shift_left
from numtok.hf._head import BypassedHead
from numtok.hf._zero3 import gathered
from numtok.losses.fused import CEWithNTLOutput, cross_entropy_with_ntl_from_tables
from numtok.losses.head import NumberHeadSpec, number_head_loss
from numtok.losses.linear import linear_cross_entropy_with_ntl_from_tables
from numtok.maths.ntl import LossSpec
from numtok.numbers.vocab import NumberTables, NumberVocab

__all__ = [
    "NUMBER_LEVEL_INSTEAD",
    "auto_cross_entropy",
    "ce_plus_ntl",
    "count_targets",
    "denominator_dtype",
    "number_head_mean",
    "token_share_denominators",
]

#: What computes ``kind="number"`` where these routes refuse it (their counts are of number tokens,
#: the number-level loss's mean is over whole numbers).
NUMBER_LEVEL_INSTEAD = (
    "Its step counts are of number tokens, not of whole numbers. Add the number-level loss to the "
    "model's loss in your own loss code instead: outputs.loss + ntl_weight * "
    "number_token_loss(outputs.logits, labels, vocab, kind='number', shift=True), or "
    "linear_number_token_loss(hidden, weight, labels, vocab, kind='number', shift=True) from the "
    "final hidden states"
)


#: What computes the cross-entropy beside NTL, one vocabulary on every route that chooses
#: (``patch_model`` and TRL's ``SFTTrainer`` under ``attach()``): ``"numtok"``, numtok's passes;
#: ``"model"``, the model's own (its loss, or TRL's fused head, which is the model's forward with
#: ``fused_lm_head=True``) with NTL from the number head beside it; ``"auto"``, as
#: :func:`auto_cross_entropy` decides.
CROSS_ENTROPIES = ("auto", "numtok", "model")


def check_cross_entropy(cross_entropy: object) -> str:
    """``cross_entropy`` if it is one of :data:`CROSS_ENTROPIES`, else a ``ValueError``."""
    if not isinstance(cross_entropy, str) or cross_entropy not in CROSS_ENTROPIES:
        raise ValueError(f"cross_entropy must be one of {CROSS_ENTROPIES}, got {cross_entropy!r}")
    return cross_entropy


def auto_cross_entropy(device: torch.device) -> str:
    """What ``cross_entropy="auto"`` chooses on ``device``, on every route that chooses:
    ``"numtok"`` (numtok's pass) on CPU, where it was measured faster than PyTorch's
    cross-entropy and lighter on memory; ``"model"``, the model's own cross-entropy beside the
    number head, everywhere else, where numtok's pass has not been measured fast (its torch row
    passes ran at 2.4-11× ``F.cross_entropy`` on the one GPU run)."""
    return "numtok" if device.type == "cpu" else "model"


def ce_plus_ntl(
    logits: torch.Tensor,
    labels: torch.Tensor,
    tables: NumberTables,
    tokens: torch.Tensor,
    numbers: torch.Tensor,
    head: BypassedHead | None = None,
    *,
    spec: LossSpec,
    head_spec: LossSpec,
    ntl_weight: float,
    impl: str,
) -> CEWithNTLOutput:
    """``Σ ce / tokens + ntl_weight · Σ ntl / numbers`` over logits (B, T, V) and labels (B, T),
    through the fused path, with ``.ce = Σ ce / tokens`` and ``.ntl = Σ ntl / numbers``. With a
    bypassed ``head``, ``logits`` are the hidden states (B, T, H) and the logits
    ``hidden @ head.weight.T + head.bias`` are never built (the logits-free path, with the
    settings ``head_spec``: ``spec`` and the model's soft cap).

    ``cross_entropy_with_ntl`` divides both sums by one ``num_items_in_batch``; NTL gets its own
    denominator by weighing every position by ``tokens / numbers`` (a constant, so NTL's
    ``loss_weights`` scale its sum): ``Σ (tokens/numbers)·ntl / tokens = Σ ntl / numbers``.
    """
    ratio = (tokens / numbers).expand(labels.shape)  # (B, T), a view of one scalar
    if head is None:
        return cross_entropy_with_ntl_from_tables(
            logits, labels, tables, spec, ntl_weight, ratio, tokens, impl=impl
        )
    with gathered([head.weight, head.bias]):  # ZeRO-3: the layer's call released them
        bias = None if head.bias is None else head.bias.to(head.dtype)
        return linear_cross_entropy_with_ntl_from_tables(
            logits.to(head.dtype),
            head.weight.to(head.dtype),
            labels,
            tables,
            head_spec,
            ntl_weight,
            ratio,
            tokens,
            bias=bias,
            impl=impl,
        )


def number_head_mean(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    vocab: NumberVocab,
    tables: NumberTables,
    spec: LossSpec,
    tokens: torch.Tensor,
    numbers: torch.Tensor,
) -> torch.Tensor:
    """``Σ ntl / numbers`` of the number head (:func:`numtok.linear_number_token_loss`) on the
    hidden states (B, T, H) and the output layer's ``weight`` (V, H) and ``bias``, gathered where
    ZeRO-3 partitions them, for labels (B, T) and the settings ``spec`` (its soft cap included).
    Every position is weighed by ``tokens / numbers`` and the sum divided by ``tokens``."""
    with gathered([weight, bias]):  # ZeRO-3: the layer's call released them
        return number_head_loss(
            hidden.to(weight.dtype),
            weight,
            labels,
            vocab,
            NumberHeadSpec.of(spec),
            tables,
            bias=bias,
            loss_weights=(tokens / numbers).expand(labels.shape),
            num_items_in_batch=tokens,
        )


def count_targets(
    labels: torch.Tensor, position_of_id: torch.Tensor, spec: LossSpec
) -> torch.Tensor:
    """``[|T|, |P|]`` (2,) int64 for labels (...): the positions with a label, and those whose
    label is a number token, after the causal shift when ``spec.shift``. Ids outside the
    vocabulary count as targets that are not numbers (the loss itself rejects them)."""
    if spec.shift:
        labels = shift_left(labels, spec.ignore_index)
    is_target = labels != spec.ignore_index
    in_range = is_target & (labels >= 0) & (labels < position_of_id.numel())
    is_number = in_range & (position_of_id[torch.where(in_range, labels, 0)] >= 0)
    return torch.stack([is_target.sum(), is_number.sum()])


def denominator_dtype(logits: torch.Tensor) -> torch.dtype:
    """The dtype of the denominators: the loss's compute dtype (float64 only for float64
    logits, which not every device has); counts up to 2**24 tokens per step are exact in
    float32."""
    return torch.promote_types(logits.dtype, torch.float32)


def token_share_denominators(
    local_counts: torch.Tensor, num_items_in_batch: torch.Tensor | int | None, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens, numbers)`` for one micro-batch whose counts are ``local_counts`` ``[|T|, |P|]``:
    its own counts without ``num_items_in_batch``; with it, ``num_items_in_batch`` and the
    token-share weighting ``num_items_in_batch · |P| / |T|``, so that this micro-batch's NTL mean
    counts as much as its share of the step's target tokens (exact when it is the only
    micro-batch)."""
    local_tokens, local_numbers = local_counts.to(dtype).unbind()
    if num_items_in_batch is None:
        return local_tokens.clamp_min(1), local_numbers.clamp_min(1)
    tokens = torch.as_tensor(num_items_in_batch, device=local_counts.device).to(dtype)
    return tokens, tokens * local_numbers.clamp_min(1) / local_tokens.clamp_min(1)
