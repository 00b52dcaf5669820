"""Tokenizers of the experiments: one token per character (the Mathematics questions) or per
word (the rJokes jokes). Both lay an example out as ``prompt <answer> answer <eos>`` and spell
numbers with the single-digit tokens ``0``-``9``, so ``NumberVocab.from_tokenizer`` finds exactly
ten number tokens worth 0-9 (the paper's digit-level setting). They are read by duck typing
(``get_vocab``, ``len``), like any Hugging Face tokenizer.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence

from numtok import NumberVocab

__all__ = ["CharTokenizer", "PromptAnswerTokenizer", "WordTokenizer"]

#: The characters of DeepMind's Mathematics questions and answers (its ``QUESTION_CHARS``).
CHARACTERS = " " + string.ascii_letters + string.digits + string.punctuation
PAD, SEPARATOR, END, UNKNOWN = "<pad>", "<answer>", "<eos>", "<unk>"
DIGITS = tuple("0123456789")


class PromptAnswerTokenizer:
    """``<pad>`` = 0, ``<answer>`` (between prompt and answer), ``<eos>``, then the tokens a
    subclass adds; a subclass defines :meth:`encode`.

    An example is laid out as ``prompt <answer> answer <eos>``; the model learns to emit the
    answer and ``<eos>`` after ``<answer>``.
    """

    def __init__(self, tokens: Iterable[str]) -> None:
        self.tokens: list[str] = [PAD, SEPARATOR, END, *tokens]
        self._ids = {token: index for index, token in enumerate(self.tokens)}
        if len(self._ids) != len(self.tokens):
            raise ValueError("a tokenizer's tokens must be distinct")
        self.pad_id = self._ids[PAD]
        self.separator_id = self._ids[SEPARATOR]
        self.end_id = self._ids[END]

    def __len__(self) -> int:
        return len(self.tokens)

    def get_vocab(self) -> dict[str, int]:
        return dict(self._ids)

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def encode_prompt(self, prompt: str) -> list[int]:
        """The token ids the model reads before it answers: ``prompt <answer>``."""
        return [*self.encode(prompt), self.separator_id]

    def _join(self, tokens: Sequence[str]) -> str:
        return "".join(tokens)

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` up to the first ``<eos>``; ``<pad>`` and ``<answer>`` are dropped."""
        tokens = []
        for token_id in ids:
            if token_id == self.end_id:
                break
            if token_id not in (self.pad_id, self.separator_id):
                tokens.append(self.tokens[token_id])
        return self._join(tokens)

    def encode_example(self, prompt: str, answer: str) -> tuple[list[int], list[int]]:
        """Model inputs and next-token labels for one prompt/answer pair.

        ``inputs`` is ``prompt <answer> answer`` and ``labels[t]`` is the token after
        ``inputs[t]``: the answer tokens and ``<eos>`` where the model predicts the answer,
        ``-100`` (ignored) over the prompt. Both have length ``len(prompt ids) + len(answer ids)
        + 1``.
        """
        prompt_ids = self.encode_prompt(prompt)
        target = [*self.encode(answer), self.end_id]
        sequence = prompt_ids + target
        labels = [-100] * (len(prompt_ids) - 1) + target
        return sequence[:-1], labels

    def number_vocab(self) -> NumberVocab:
        """The ten digit tokens as a :class:`~numtok.NumberVocab`."""
        return NumberVocab.from_tokenizer(self, multi_digit=False, prefixed=False)


class CharTokenizer(PromptAnswerTokenizer):
    """One token per character of :data:`CHARACTERS` after the three special tokens."""

    def __init__(self) -> None:
        super().__init__(CHARACTERS)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, one per character; unknown characters are a ValueError."""
        try:
            return [self._ids[char] for char in text]
        except KeyError as error:
            raise ValueError(
                f"character {error.args[0]!r} in {text!r} is not in the tokenizer's alphabet "
                "(ASCII letters, digits, punctuation and space)"
            ) from None


# A word (letters, with inner apostrophes: "don't"), a single ASCII digit, or any other single
# character that is not white space (punctuation, symbols, other numerals).
_PIECES = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)*|[0-9]|\S")


def split_words(text: str) -> list[str]:
    """Lower-cased words, single ASCII digits, and single other characters, in order."""
    return _PIECES.findall(text.lower())


class WordTokenizer(PromptAnswerTokenizer):
    """Words of a training text: ``<unk>``, the ten digits, then the ``max_words`` most frequent
    pieces of :func:`split_words` (ties broken alphabetically, so the vocabulary is a function of
    the text alone). A prompt is cut to its first ``max_prompt_tokens`` tokens.

    Digits are single tokens wherever they appear, in the prompt and in the answer, so numbers
    are spelled digit by digit and ``"10"`` is ``1`` ``0``.
    """

    def __init__(self, words: Sequence[str], *, max_prompt_tokens: int) -> None:
        if isinstance(max_prompt_tokens, bool) or not isinstance(max_prompt_tokens, int):
            raise TypeError(f"max_prompt_tokens must be an int, got {max_prompt_tokens!r}")
        if max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be at least 1, got {max_prompt_tokens}")
        super().__init__([UNKNOWN, *DIGITS, *words])
        self.unknown_id = self._ids[UNKNOWN]
        self.max_prompt_tokens = max_prompt_tokens

    @classmethod
    def from_texts(
        cls, texts: Iterable[str], *, max_words: int, max_prompt_tokens: int
    ) -> WordTokenizer:
        """The tokenizer of the ``max_words`` most frequent words of ``texts``."""
        counts = Counter(piece for text in texts for piece in split_words(text))
        for digit in DIGITS:
            counts.pop(digit, None)
        ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
        return cls([word for word, _ in ranked[:max_words]], max_prompt_tokens=max_prompt_tokens)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``'s pieces; words outside the vocabulary are ``<unk>``."""
        return [self._ids.get(piece, self.unknown_id) for piece in split_words(text)]

    def encode_prompt(self, prompt: str) -> list[int]:
        return [*self.encode(prompt)[: self.max_prompt_tokens], self.separator_id]

    def _join(self, tokens: Sequence[str]) -> str:
        """Space-separated, except that consecutive digits form one number (``1`` ``0`` is 10)."""
        text = ""
        for index, token in enumerate(tokens):
            glued = index > 0 and token in DIGITS and tokens[index - 1] in DIGITS
            text += token if glued or index == 0 else " " + token
        return text
