"""What every benchmark measures on and against: the number vocabularies at ids 100…, and the
anchors of every ratio — ``F.cross_entropy``, Liger-Kernel's cross-entropies (Triton, GPUs only)
and ntloss 0.3.2 (the authors' package, single digits only)."""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F

from numtok import NumberVocab

FIRST_NUMBER_ID = 100  # the number tokens are ids 100…: the digits 100..109, the chunks ..1209
DIGITS = "digits (10)"
CHUNKS = "1-3-digit chunks (1,110)"


@functools.cache
def vocabularies(vocab_size: int) -> dict[str, NumberVocab]:
    """The number tokens at ids 100…: the ten digits, or every 1-, 2- and 3-digit string."""
    chunks: dict[int, str] = {}
    for width in (1, 2, 3):
        for value in range(10**width):
            chunks[FIRST_NUMBER_ID + len(chunks)] = f"{value:0{width}d}"
    digits = {FIRST_NUMBER_ID + d: str(d) for d in range(10)}
    return {
        DIGITS: NumberVocab.from_values(digits, vocab_size=vocab_size),
        CHUNKS: NumberVocab.from_values(chunks, vocab_size=vocab_size),
    }


def importable(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, **options: Any) -> torch.Tensor:
    """``F.cross_entropy`` over the flattened positions."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), **options)


@functools.cache
def ntloss_of(vocab_size: int, reweigh: bool) -> Any:
    """ntloss's ``NTLoss`` on a WordLevel tokenizer built in process whose ids 100..109 are the
    digits and every other id a word (needs ntloss and transformers)."""
    from loguru import logger
    from ntloss import NTLoss
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    words = {"<unk>": 0, **{f"w{i}": i for i in range(1, vocab_size)}}
    for digit in range(10):
        del words[f"w{FIRST_NUMBER_ID + digit}"]
        words[str(digit)] = FIRST_NUMBER_ID + digit
    backend = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")
    logger.disable("ntloss")
    return NTLoss(tokenizer, vocab_size=vocab_size, reweigh=reweigh)


def ntloss_available() -> bool:
    return importable("ntloss") and importable("transformers")


def ntloss(logits: torch.Tensor, labels: torch.Tensor, reweigh: bool) -> torch.Tensor:
    """ntloss's NTL of (batch, sequence, V) logits (it reads sequences)."""
    return ntloss_of(logits.shape[-1], reweigh)(logits, labels)  # type: ignore[no-any-return]


def liger_available() -> bool:
    return importable("liger_kernel.transformers")


def liger_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    from liger_kernel.transformers import LigerCrossEntropyLoss

    flat = logits.reshape(-1, logits.shape[-1])
    return LigerCrossEntropyLoss()(flat, labels.reshape(-1))  # type: ignore[no-any-return]


def liger_linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, reduction: str = "mean"
) -> torch.Tensor:
    """Liger's fused linear cross-entropy of (..., H) hidden states and the (V, H) weight."""
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    return liger_fused_linear_cross_entropy(  # type: ignore[no-any-return]
        hidden.reshape(-1, hidden.shape[-1]), weight, labels.reshape(-1), reduction=reduction
    )
