"""``NumberTokenLoss``: the one module a training loop holds for NTL (or for CE + NTL)."""

from __future__ import annotations

import torch

from numtok._common.validation import check_ntl_weight
from numtok.losses.fused import CEWithNTLOutput, cross_entropy_with_ntl_from_tables
from numtok.losses.number_level import NumberLevelLoss
from numtok.losses.token import number_token_loss_from_tables
from numtok.maths.ntl import (
    NUMBER_LEVEL,
    Kind,
    LossSpec,
    check_number_level_capturable,
    check_number_level_squash,
)
from numtok.numbers.buffers import VocabBuffers
from numtok.numbers.vocab import NumberVocab
from numtok.ops.kernels.dispatch import check_impl

__all__ = ["NumberTokenLoss"]


class NumberTokenLoss(VocabBuffers):
    """``nn.Module`` form of :func:`~numtok.number_token_loss`: settings are validated once here and
    the vocabulary's lookup tables are buffers, so ``.to(device)``, ``state_dict`` and
    ``torch.compile`` work as for any module (the value table stays float64 under
    ``.to(dtype)``).

    ``forward(logits, labels, *, loss_weights=None, num_items_in_batch=None)`` returns NTL.

    With ``ntl_weight=w`` it returns cross-entropy plus ``w`` times NTL instead, as
    :func:`numtok.cross_entropy_with_ntl` computes it in one fused pass (a
    :class:`~numtok.CEWithNTLOutput`: ``.loss`` to back-propagate, detached ``.ce`` and ``.ntl``
    to log), so that a training loop holds one module for the whole loss.

    ``impl`` (``"auto"``, ``"torch"`` or ``"triton"``) chooses the backend of that fused pass, as
    in :func:`numtok.cross_entropy_with_ntl`; ``capturable=True`` computes without reading
    anything back from the device, as in :func:`numtok.number_token_loss`.

    With ``kind="number"`` it holds and calls a
    :class:`~numtok.losses.number_level.NumberLevelLoss` as ``self.number_level``.
    """

    def __init__(
        self,
        vocab: NumberVocab,
        *,
        kind: Kind = "was",
        reweigh: bool = False,
        squash_factor: float | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        shift: bool = False,
        ntl_weight: float | None = None,
        impl: str = "auto",
        capturable: bool = False,
    ) -> None:
        super().__init__()
        self.ntl_weight = None if ntl_weight is None else check_ntl_weight(ntl_weight)
        self.impl = check_impl(impl)
        if self.impl != "auto" and ntl_weight is None:
            raise ValueError(
                f"impl applies to the fused CE + NTL (ntl_weight=...), got impl={impl!r} without "
                "ntl_weight; the NTL alone runs on the reference path"
            )
        self.number_level: NumberLevelLoss | None = None
        if isinstance(kind, str) and kind == NUMBER_LEVEL:
            if ntl_weight is not None:
                raise ValueError(
                    "ntl_weight (cross-entropy + NTL in one fused pass) is not available with "
                    "kind='number'; add F.cross_entropy to the module's output instead"
                )
            check_number_level_squash(squash_factor)
            check_number_level_capturable(capturable)
            self.number_level = NumberLevelLoss(
                vocab,
                reweigh=reweigh,
                ignore_index=ignore_index,
                reduction=reduction,
                shift=shift,
            )
            return
        self.spec = LossSpec.build(
            vocab,
            kind=kind,
            reweigh=reweigh,
            squash_factor=squash_factor,
            ignore_index=ignore_index,
            reduction=reduction,
            shift=shift,
            capturable=capturable,
        )
        self.register_tables(vocab)

    def forward(
        self,
        logits: torch.Tensor,
        labels: torch.Tensor,
        *,
        loss_weights: torch.Tensor | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor | CEWithNTLOutput:
        if self.number_level is not None:
            return self.number_level(  # type: ignore[no-any-return]
                logits, labels, loss_weights=loss_weights, num_items_in_batch=num_items_in_batch
            )
        if self.ntl_weight is not None:
            return cross_entropy_with_ntl_from_tables(
                logits,
                labels,
                self.tables(),
                self.spec,
                self.ntl_weight,
                loss_weights,
                num_items_in_batch,
                impl=self.impl,
            )
        return number_token_loss_from_tables(
            logits, labels, self.tables(), self.spec, loss_weights, num_items_in_batch
        )

    def extra_repr(self) -> str:
        if self.number_level is not None:
            return "kind='number'"
        spec = self.spec
        return (
            f"kind={spec.kind!r}, reweigh={spec.reweigh}, squash_factor={spec.squash_factor}, "
            f"ignore_index={spec.ignore_index}, reduction={spec.reduction!r}, shift={spec.shift}, "
            f"number_tokens={self.ids.numel()}, vocab_size={spec.vocab_size}"
            + ("" if self.ntl_weight is None else f", ntl_weight={self.ntl_weight}")
            + ("" if self.impl == "auto" else f", impl={self.impl!r}")
            + (", capturable=True" if spec.capturable else "")
        )
