"""The tokenizers of the comparisons trained from scratch, built in-process with ``tokenizers``
and used as any Hugging Face tokenizer (``PreTrainedTokenizerFast``): one token per character
(:func:`character_tokenizer`, DeepMind's Mathematics questions) or per word
(:func:`word_tokenizer`, the rJokes jokes).

Both spell numbers with the ten single-digit tokens ``0``-``9``, so ``NumberVocab.from_tokenizer``
finds exactly ten number tokens worth 0-9 (the paper's digit-level setting). An example is laid out
as ``prompt <answer> answer <eos>`` (:func:`encode_example`): the tokenizer's post-processor ends
every encoded text with ``<answer>``, where the model starts to answer, and ``<eos>`` is the
tokenizer's ``eos_token``. Decoding joins the tokens without spaces (``decoders.Fuse``): an answer
is the digits (and signs, decimal points) it spells.
"""

from __future__ import annotations

import string
from collections import Counter
from collections.abc import Iterable
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers.processors import TemplateProcessing
from transformers import PreTrainedTokenizerFast

from numtok_compare.runner.batches import Encoded

__all__ = ["character_tokenizer", "encode_example", "word_tokenizer"]

#: The characters of DeepMind's Mathematics questions and answers (its ``QUESTION_CHARS``).
CHARACTERS = " " + string.ascii_letters + string.digits + string.punctuation
PAD, SEPARATOR, END, UNKNOWN = "<pad>", "<answer>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, SEPARATOR, END, UNKNOWN)
DIGITS = tuple("0123456789")

# A word (letters, with inner apostrophes: "don't"), a single ASCII digit, or any other single
# character that is not white space (punctuation, symbols, other numerals).
WORD_PIECES = r"[^\W\d_]+(?:'[^\W\d_]+)*|[0-9]|\S"


def _wrapped(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    """``tokenizer`` with the layout of the module docstring, as a Hugging Face tokenizer."""
    tokenizer.decoder = decoders.Fuse()
    tokenizer.post_processor = TemplateProcessing(
        single=f"$A {SEPARATOR}", special_tokens=[(SEPARATOR, SPECIAL_TOKENS.index(SEPARATOR))]
    )
    wrapped = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer, pad_token=PAD, eos_token=END, unk_token=UNKNOWN,
        additional_special_tokens=[SEPARATOR],
    )  # fmt: skip
    return wrapped


def _word_level(tokens: list[str]) -> Tokenizer:
    """A word-level model over ``SPECIAL_TOKENS + tokens``: each piece of the pre-tokenizer is
    one token, ``<unk>`` if unknown."""
    vocabulary = {token: index for index, token in enumerate([*SPECIAL_TOKENS, *tokens])}
    return Tokenizer(models.WordLevel(vocabulary, unk_token=UNKNOWN))


def character_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character of :data:`CHARACTERS` after the four special tokens."""
    tokens = list(CHARACTERS)
    tokenizer = _word_level(tokens)
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return _wrapped(tokenizer)


def _word_splitter() -> pre_tokenizers.PreTokenizer:
    """Lower-cased text (the normaliser's) split at white space, then into :data:`WORD_PIECES`."""
    return pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(WORD_PIECES), "isolated")]
    )


def word_tokenizer(texts: Iterable[str], *, max_words: int) -> PreTrainedTokenizerFast:
    """The ``max_words`` most frequent pieces of the lower-cased ``texts`` (ties broken
    alphabetically, so the vocabulary is a function of the texts alone) after the special tokens
    and the ten digits; words outside it are ``<unk>``. Digits are single tokens wherever they
    appear, so numbers are spelled digit by digit and ``"10"`` is ``1`` ``0``."""
    if isinstance(max_words, bool) or not isinstance(max_words, int) or max_words < 1:
        raise ValueError(f"max_words must be a positive int, got {max_words!r}")
    normalizer, splitter = normalizers.Lowercase(), _word_splitter()
    counts: Counter[str] = Counter()
    for text in texts:
        pieces = splitter.pre_tokenize_str(normalizer.normalize_str(text))
        counts.update(piece for piece, _ in pieces)
    for digit in DIGITS:
        counts.pop(digit, None)
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    tokens = [*DIGITS, *(word for word, _ in ranked[:max_words])]
    tokenizer = _word_level(tokens)
    tokenizer.normalizer, tokenizer.pre_tokenizer = normalizer, splitter
    return _wrapped(tokenizer)


def encode_example(
    tokenizer: Any, question: str, answer: str, *, max_prompt_tokens: int | None = None
) -> Encoded:
    """``question <answer>`` (the question cut to its first ``max_prompt_tokens`` tokens) and
    ``answer <eos>``, with the answer's value."""
    cut = {} if max_prompt_tokens is None else {"truncation": True,
                                                 "max_length": max_prompt_tokens + 1}  # fmt: skip
    prompt = tokenizer(question, **cut)["input_ids"]
    answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
    return Encoded(tuple(prompt), (*answer_ids, tokenizer.eos_token_id), float(answer))
