"""The ``head`` arm's model: a causal LM's decoder with a linear layer that reads each prompt's
last hidden state as a number, trained by the ``transformers.Trainer`` like every other arm."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["RegressionHead"]

IGNORE_INDEX = -100


class RegressionHead(nn.Module):
    """A decoder (the causal LM's ``.model``: its LoRA adapters, if any, inside) and a linear map
    from the hidden state ``h_b`` (H,) at row ``b``'s last prompt token (the one before its first
    answer label, the position the answer is predicted from) to ``ŷ_b = w·h_b + c``, the answer
    standardised by the training answers' mean and standard deviation. ``w`` and ``c`` start at
    zero, so the first prediction is the training mean.

    ``forward(input_ids, attention_mask, labels (B, T), targets (B,))`` returns
    ``{"loss": mean_b (ŷ_b − targets_b)², "predictions": ŷ (B,)}``, as the Trainer expects of a
    model that computes its own loss.
    """

    def __init__(self, decoder: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.decoder = decoder
        self.head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def predict(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        """ŷ (B,) of right-padded rows whose answer positions ``labels`` marks (not -100)."""
        hidden = self.decoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        first_answer = (labels != IGNORE_INDEX).int().argmax(dim=1)
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        prediction: torch.Tensor = self.head(hidden[rows, first_answer - 1]).squeeze(-1)
        return prediction

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor,
        targets: torch.Tensor,
    ) -> dict[str, Any]:
        predictions = self.predict(input_ids, attention_mask, labels)
        loss = F.mse_loss(predictions, targets.to(predictions))
        return {"loss": loss, "predictions": predictions}
