"""The training loss of each arm.

* ``ce``: cross-entropy on the answer tokens;
* ``was`` / ``mse``: ``CE + λ·NTL`` with NTL-WAS or NTL-MSE (:class:`numtok.NumberTokenLoss`) on
  the answer digits;
* ``number``: ``CE + λ·`` the number-level loss (``kind="number"``: whole numbers, smape);
* ``del`` / ``smmd`` / ``dist2``: ``CE + λ·`` DEL, SMMD or DIST2 (:mod:`numtok.maths.kinds`) with
  their authors' settings;
* ``ntil``: ``CE + λ·`` NTIL (:func:`numtok.ntil_loss`: per-digit EMD weighed by place, plus the
  whole number's relative error and log ratio) with its authors' settings; its Gumbel noise comes
  from torch's global generator;
* ``gls``: cross-entropy with Gaussian-smoothed digit targets
  (:class:`numtok.losses.smoothing.GaussianLabelSmoothingLoss`, σ = 1 digit) instead of CE, the
  paper's strongest baseline that is not NTL.

Every arm also reports the plain cross-entropy (for the ``gls`` arm computed without gradient),
so that the training curves of all arms are on one scale.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from numtok import GaussianLabelSmoothingLoss, NTILLoss, NumberTokenLoss, NumberVocab

__all__ = [
    "ARMS",
    "ARM_LABELS",
    "ATTACHED_ARMS",
    "GLS_SIGMA",
    "IGNORE_INDEX",
    "NUMBER_LOSS_ARMS",
    "Objective",
]

#: The arms and how tables name them.
ARM_LABELS = {
    "ce": "CE",
    "was": "CE+NTL-WAS",
    "mse": "CE+NTL-MSE",
    "gls": "GLS-CE",
    "number": "CE+NTL-number",
    "del": "CE+DEL",
    "smmd": "CE+SMMD",
    "dist2": "CE+DIST2",
    "ntil": "CE+NTIL",
}
ARMS = tuple(ARM_LABELS)
#: The arms whose loss is CE + λ·(a number loss), with that loss's kind.
NUMBER_LOSS_ARMS = ("was", "mse", "number", "del", "smmd", "dist2", "ntil")
#: The number-loss arms whose loss :class:`numtok.hf.NTLossForTrainer` computes (its kinds): under
#: the ``transformers.Trainer`` they are added by its ``attach``, the line users write.
ATTACHED_ARMS = ("was", "mse", "del", "smmd", "dist2")
#: The label of a position no loss reads (the prompt, the padding), as in ``F.cross_entropy``.
IGNORE_INDEX = -100
#: Width of the Gaussian target of the ``gls`` arm, in digits.
GLS_SIGMA = 1.0


class Objective(nn.Module):
    """``forward(logits (..., V), labels (...)) -> (loss, ce, ntl)``: the loss to minimise, the
    plain cross-entropy, and the unweighted NTL (None for arms without NTL)."""

    def __init__(self, arm: str, vocab: NumberVocab, *, ntl_weight: float) -> None:
        super().__init__()
        if arm not in ARM_LABELS:
            raise ValueError(f"arm must be one of {list(ARMS)}, got {arm!r}")
        self.arm = arm
        self.ntl_weight = ntl_weight
        self.ntl: nn.Module | None = None
        if arm == "ntil":
            self.ntl = NTILLoss(vocab)
        elif arm in NUMBER_LOSS_ARMS:
            self.ntl = NumberTokenLoss(vocab, kind=arm)
        self.smoothing = (
            GaussianLabelSmoothingLoss(vocab, sigma=GLS_SIGMA) if arm == "gls" else None
        )

    def forward(
        self, logits: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        if self.smoothing is not None:
            loss: torch.Tensor = self.smoothing(logits, labels)
            with torch.no_grad():
                ce = F.cross_entropy(logits.flatten(0, -2), labels.flatten())
            return loss, ce, None
        ce = F.cross_entropy(logits.flatten(0, -2), labels.flatten())
        if self.ntl is None:
            return ce, ce, None
        ntl: torch.Tensor = self.ntl(logits, labels)
        return ce + self.ntl_weight * ntl, ce, ntl
