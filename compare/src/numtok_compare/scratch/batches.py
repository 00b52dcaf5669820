"""The training questions as tensors, and the packed batch of every step.

A step's batch is a deterministic function of (seed, step): positions ``step·B .. step·B + B - 1``
of a stream made of one random permutation of the training set per epoch, seeded with
(seed, epoch). So every arm of a seed sees the same batches, and a resumed run the same ones as an
uninterrupted run.

The questions are short and of uneven length (4 to 75 characters for ``add_or_sub``), so padding
every example to the longest one of its batch wastes about 40 % of the compute. Instead a batch's
examples are *packed* into rows (first-fit decreasing, at most ``capacity`` tokens per row) with a
block-diagonal causal mask and positions restarting at 0 for every example: each example attends
to itself only, exactly as if it sat alone in a padded row, and the loss is the same sum over the
same answer tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from numtok_compare.scratch.tokenizer import PromptAnswerTokenizer

__all__ = ["PackedBatch", "TrainingSet", "pack"]

#: Tokens per packed row, unless an example is longer.
ROW_CAPACITY = 128


class PackedBatch(NamedTuple):
    """``inputs``, ``labels`` and ``positions`` (R, C); ``allowed`` (R, 1, C, C) is True where a
    query may attend to a key (same example, not later). Padding has label -100. Example ``e``
    of the packed list starts at ``inputs[example_rows[e], example_offsets[e]]`` ((E,) each)."""

    inputs: torch.Tensor
    labels: torch.Tensor
    positions: torch.Tensor
    allowed: torch.Tensor
    example_rows: torch.Tensor
    example_offsets: torch.Tensor

    def to(self, device: torch.device) -> PackedBatch:
        return PackedBatch(*(t.to(device) for t in self))


def _first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Indices of ``lengths`` grouped into bins whose sums are at most ``capacity`` (longest
    first, each into the first bin it fits)."""
    bins: list[list[int]] = []
    room: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        for b, free in enumerate(room):
            if lengths[index] <= free:
                bins[b].append(index)
                room[b] -= lengths[index]
                break
        else:
            bins.append([index])
            room.append(capacity - lengths[index])
    return bins


def pack(
    examples: Sequence[tuple[torch.Tensor, torch.Tensor]], *, capacity: int, pad_id: int
) -> PackedBatch:
    """Pack (inputs, labels) pairs of 1-D tensors into rows of at most ``capacity`` tokens (an
    example longer than that gets a row of its own)."""
    lengths = [len(inputs) for inputs, _ in examples]
    capacity = max(capacity, *lengths)
    bins = _first_fit_decreasing(lengths, capacity)
    width = max(sum(lengths[i] for i in b) for b in bins)
    shape = (len(bins), width)
    inputs = torch.full(shape, pad_id, dtype=torch.long)
    labels = torch.full(shape, -100, dtype=torch.long)
    positions = torch.zeros(shape, dtype=torch.long)
    segment = torch.full(shape, -1, dtype=torch.long)  # which example of its row; -1: padding
    example_rows = torch.empty(len(examples), dtype=torch.long)
    example_offsets = torch.empty(len(examples), dtype=torch.long)
    for row, members in enumerate(bins):
        offset = 0
        for number, index in enumerate(members):
            length = lengths[index]
            span = slice(offset, offset + length)
            inputs[row, span], labels[row, span] = examples[index]
            positions[row, span] = torch.arange(length)
            segment[row, span] = number
            example_rows[index], example_offsets[index] = row, offset
            offset += length
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    same_example = segment[:, :, None] == segment[:, None, :]  # (R, C, C)
    # Padding queries see themselves, so that no attention row is empty (that would be NaN).
    allowed = (causal & same_example) | torch.eye(width, dtype=torch.bool)
    return PackedBatch(inputs, labels, positions, allowed[:, None], example_rows, example_offsets)


class TrainingSet:
    """The encoded training questions and the batch of every (seed, step)."""

    def __init__(
        self, examples: Sequence[tuple[str, str]], tokenizer: PromptAnswerTokenizer
    ) -> None:
        self.examples = [
            (torch.tensor(inputs), torch.tensor(labels))
            for inputs, labels in (tokenizer.encode_example(q, a) for q, a in examples)
        ]
        self.pad_id = tokenizer.pad_id
        self._permutations: dict[tuple[int, int], np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.examples)

    def batch_indices(self, seed: int, step: int, batch_size: int) -> np.ndarray:
        """Example indices of step ``step`` (see the module docstring)."""
        positions = np.arange(step * batch_size, (step + 1) * batch_size)
        epochs, offsets = np.divmod(positions, len(self))
        indices = np.empty(batch_size, dtype=np.int64)
        for epoch in np.unique(epochs):
            mask = epochs == epoch
            indices[mask] = self._permutation(seed, int(epoch))[offsets[mask]]
        return indices

    def _permutation(self, seed: int, epoch: int) -> np.ndarray:
        key = (seed, epoch)
        if key not in self._permutations:
            self._permutations = {key: np.random.default_rng([seed, epoch]).permutation(len(self))}
        return self._permutations[key]

    def batch(self, seed: int, step: int, batch_size: int) -> PackedBatch:
        chosen = [self.examples[i] for i in self.batch_indices(seed, step, batch_size)]
        return pack(chosen, capacity=ROW_CAPACITY, pad_id=self.pad_id)
