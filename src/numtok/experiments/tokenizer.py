"""A character tokenizer for the Mathematics questions: one token per character.

Its digits ``0``-``9`` are single-character tokens, so ``NumberVocab.from_tokenizer`` finds
exactly ten number tokens worth 0-9 (the paper's digit-level setting). The tokenizer is read by
duck typing (``get_vocab``, ``len``), like any Hugging Face tokenizer.
"""

from __future__ import annotations

import string
from collections.abc import Sequence

from numtok.vocab import NumberVocab

__all__ = ["CharTokenizer"]

#: The characters of DeepMind's Mathematics questions and answers (its ``QUESTION_CHARS``).
CHARACTERS = " " + string.ascii_letters + string.digits + string.punctuation
PAD, SEPARATOR, END = "<pad>", "<answer>", "<eos>"


class CharTokenizer:
    """``<pad>`` = 0, ``<answer>`` (between question and answer), ``<eos>``, then one token per
    character of :data:`CHARACTERS`.

    An example is laid out as ``question <answer> answer <eos>``; the model learns to emit the
    answer and ``<eos>`` after ``<answer>``.
    """

    def __init__(self) -> None:
        self.tokens: list[str] = [PAD, SEPARATOR, END, *CHARACTERS]
        self._ids = {token: index for index, token in enumerate(self.tokens)}
        self.pad_id = self._ids[PAD]
        self.separator_id = self._ids[SEPARATOR]
        self.end_id = self._ids[END]

    def __len__(self) -> int:
        return len(self.tokens)

    def get_vocab(self) -> dict[str, int]:
        return dict(self._ids)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, one per character; unknown characters are a ValueError."""
        try:
            return [self._ids[char] for char in text]
        except KeyError as error:
            raise ValueError(
                f"character {error.args[0]!r} in {text!r} is not in the tokenizer's alphabet "
                "(ASCII letters, digits, punctuation and space)"
            ) from None

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` up to the first ``<eos>``; ``<pad>`` and ``<answer>`` are dropped."""
        chars = []
        for token_id in ids:
            if token_id == self.end_id:
                break
            if token_id not in (self.pad_id, self.separator_id):
                chars.append(self.tokens[token_id])
        return "".join(chars)

    def encode_example(self, question: str, answer: str) -> tuple[list[int], list[int]]:
        """Model inputs and next-token labels for one question/answer pair.

        ``inputs`` is ``question <answer> answer`` and ``labels[t]`` is the token after
        ``inputs[t]``: the answer characters and ``<eos>`` where the model predicts the answer,
        ``-100`` (ignored) over the question. Both have length ``len(question) + len(answer) + 1``.
        """
        prompt = [*self.encode(question), self.separator_id]
        target = [*self.encode(answer), self.end_id]
        sequence = prompt + target
        labels = [-100] * (len(prompt) - 1) + target
        return sequence[:-1], labels

    def number_vocab(self) -> NumberVocab:
        """The ten digit tokens as a :class:`~numtok.NumberVocab`."""
        return NumberVocab.from_tokenizer(self, multi_digit=False, prefixed=False)
