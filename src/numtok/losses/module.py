"""``NumberTokenLoss``: the ``nn.Module`` form of the Number Token Loss alone (CE + NTL has its
own modules: :class:`~numtok.CrossEntropyWithNTL`, :class:`~numtok.LinearCrossEntropyWithNTL`)."""

from __future__ import annotations

import torch

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

__all__ = ["NumberTokenLoss"]


class NumberTokenLoss(VocabBuffers):
    """``nn.Module`` form of :func:`~numtok.number_token_loss`: settings are validated once here and
    the vocabulary's lookup tables are buffers, so ``.to(device)``, ``state_dict`` and
    ``torch.compile`` work as for any module (the value table stays float64 under
    ``.to(dtype)``).

    ``forward(logits (..., V), labels (...), *, loss_weights=None, num_items_in_batch=None)``
    returns NTL, a tensor (a scalar, or the labels' shape for ``reduction="none"``), as
    :func:`numtok.number_token_loss` with the module's settings; ``capturable=True`` computes
    without reading anything back from the device. For cross-entropy plus NTL in one pass hold a
    :class:`~numtok.CrossEntropyWithNTL` instead.

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
        capturable: bool = False,
    ) -> None:
        super().__init__()
        self.number_level: NumberLevelLoss | None = None
        if isinstance(kind, str) and kind == NUMBER_LEVEL:
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
    ) -> torch.Tensor:
        if self.number_level is not None:
            return self.number_level(  # type: ignore[no-any-return]
                logits, labels, loss_weights=loss_weights, num_items_in_batch=num_items_in_batch
            )
        return number_token_loss_from_tables(
            logits, labels, self.tables(), self.spec, loss_weights, num_items_in_batch
        )

    def extra_repr(self) -> str:
        if self.number_level is not None:
            return "kind='number'"
        return self.spec.describe(number_tokens=self.ids.numel())
