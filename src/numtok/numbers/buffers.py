"""The base of every loss module that holds a NumberVocab's lookup tables as buffers."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
from torch import nn

from numtok.numbers.vocab import NumberTables, NumberVocab

_Module = TypeVar("_Module", bound="VocabBuffers")


class VocabBuffers(nn.Module):
    """Registers :meth:`NumberVocab.tables` as buffers (so ``.to(device)``, ``state_dict`` and
    ``torch.compile`` work) and keeps the value table in float64 whatever dtype the module is
    cast to: ``model.to(torch.bfloat16)`` would otherwise round 9.99 to 10.0."""

    ids: torch.Tensor
    scaled_values: torch.Tensor
    groups: torch.Tensor
    position_of_id: torch.Tensor

    def register_tables(self, vocab: NumberVocab) -> None:
        for name, tensor in vocab.tables()._asdict().items():
            self.register_buffer(name, tensor.clone())

    def tables(self) -> NumberTables:
        return NumberTables(self.ids, self.scaled_values, self.groups, self.position_of_id)

    def _apply(
        self: _Module, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True
    ) -> _Module:
        exact = self._buffers.get("scaled_values")
        super()._apply(fn, recurse)  # type: ignore[no-untyped-call]
        if exact is not None:
            self.scaled_values = exact.to(self.scaled_values.device)
        return self
