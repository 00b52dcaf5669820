"""The ``head`` arm's model: the transformer trunk with a scalar regression head."""

from __future__ import annotations

import torch
from torch import nn

from numtok.experiments.model import Transformer

__all__ = ["ScoreRegressor"]


class ScoreRegressor(nn.Module):
    """``trunk`` (the same :class:`~numtok.experiments.model.Transformer` as the token arms,
    with the same initial weights) and ``head``, a linear map from the hidden state at the
    ``<answer>`` token to the standardised score. The head starts at zero, so the first
    prediction is the training mean."""

    def __init__(self, trunk: Transformer) -> None:
        super().__init__()
        self.trunk = trunk
        self.head = nn.Linear(trunk.config.d_model, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states (K, C) at ``<answer>`` tokens -> standardised scores (K,)."""
        prediction: torch.Tensor = self.head(hidden).squeeze(-1)
        return prediction
