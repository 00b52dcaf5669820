"""numtok: the Number Token Loss for language models, right on every tokenizer."""

from numtok.losses import NumberTokenLoss, number_token_loss
from numtok.vocab import NumberVocab

__all__ = ["NumberTokenLoss", "NumberVocab", "number_token_loss"]
__version__ = "0.1.0"
