"""What a model's logits say about numbers: the expected value of the number token at each
position, the expected value of each whole number in a sequence, and (:func:`predict_numbers`)
the number a causal LM would answer a prompt with, read out of its distribution.

Values are the number tokens' own values (``"7"`` is 7, ``"123"`` is 123), as in ntloss's
``predict_numbers``. Only the N number-token columns are gathered and computed in float32 (float64
logits stay float64); the logits are never upcast as a whole.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from numtok._common.logsumexp import selected_rows_logsumexp
from numtok._common.validation import check_logits
from numtok.numbers.spans import NumberSpans, span_tables, span_values
from numtok.numbers.vocab import NumberVocab, check_number_vocab
from numtok.ops.number_logits import compute_dtype, expected_token_values, number_logits_at
from numtok.readout.distribution import (
    NextTokenScorer,
    NumberDistribution,
    check_max_digits,
    check_max_value,
    number_distribution,
    widest_level,
)
from numtok.readout.sampling import check_samples, sample_distribution
from numtok.readout.scorers import (
    CachedScorer,
    CacheUnsupportedError,
    WholeSequenceScorer,
)

__all__ = [
    "READOUTS",
    "ExpectedNumbers",
    "NumberPredictions",
    "expected_numbers",
    "expected_span_values",
    "greedy_tokens",
    "predict_numbers",
    "prompt_token_ids",
    "prompts_per_group",
]


#: :func:`predict_numbers` reads its prompts in groups small enough that the logits of the
#: number tree's widest level, (prefixes, V) in float32, stay under this many bytes.
LOGITS_BUDGET_BYTES = 2**30


class ExpectedNumbers(NamedTuple):
    """``value`` (...): ``Σ_j p_j v_j`` with ``p`` the softmax over the number-token logits only;
    ``mass`` (...): the full-vocabulary probability of all number tokens together."""

    value: torch.Tensor
    mass: torch.Tensor


def expected_numbers(logits: torch.Tensor, vocab: NumberVocab) -> ExpectedNumbers:
    """The expected number-token value and the number-token mass at every position.

    With ``z`` the logits (..., V) and ``N`` the number tokens (values ``v``):

    * ``value = Σ_{j∈N} softmax(z_N)_j · v_j`` — the model's guess *given* that a number token
      comes (what ntloss calls ``predict_numbers``);
    * ``mass = Σ_{j∈N} softmax(z)_j = exp(logsumexp(z_N) - logsumexp(z))`` — how likely a
      number token comes at all.

    With tokens of several digits, ``value`` mixes lengths (a 1-digit and a 3-digit token both
    count their own value); :func:`expected_span_values` places them in whole numbers.

    Returns:
        :class:`ExpectedNumbers` of two (...) tensors, float32 (float64 for float64 logits).

    >>> vocab = NumberVocab.from_values({i: str(i) for i in range(10)}, vocab_size=11)
    >>> logits = torch.full((1, 11), -torch.inf); logits[0, 3] = logits[0, 5] = 0.0
    >>> expected_numbers(logits, vocab)
    ExpectedNumbers(value=tensor([4.]), mass=tensor([1.]))
    """
    numbers = check_number_vocab(vocab)
    logits = check_logits(logits, vocab_size=numbers.vocab_size)
    dtype = compute_dtype(logits)
    tables = numbers.tables(logits.device)
    logits_2d = logits.reshape(-1, logits.shape[-1])  # (M, V)
    number_logits = number_logits_at(logits, None, tables.ids, dtype)  # (M, N)
    value = expected_token_values(number_logits, numbers.values.to(logits.device))
    all_rows = torch.arange(logits_2d.shape[0], device=logits.device)
    log_mass = torch.logsumexp(number_logits, dim=-1) - selected_rows_logsumexp(
        logits_2d, all_rows, dtype
    )
    shape = logits.shape[:-1]
    return ExpectedNumbers(value.reshape(shape), torch.exp(log_mass).reshape(shape))


def expected_span_values(
    logits: torch.Tensor, spans: NumberSpans, vocab: NumberVocab
) -> torch.Tensor:
    """The expected value of each whole number, given the logits that produced its tokens.

    For spans found with :func:`~numtok.numbers.spans.find_number_spans` in token ids (..., T) and
    the logits (..., T, V) scored at the same positions (``logits[..., t, :]`` is the distribution
    the token at t was drawn from, e.g. ``torch.stack(generate(...).scores, dim=1)`` with the
    generated ids), each span's expected value is ``±Σ_t ŷ_t · 10**place_t`` over its number
    tokens, with ``ŷ_t`` the :func:`expected_numbers` value at t and the places and sign of the
    span. With ``logits`` from a training step (``logits[t]`` predicts token ``t + 1``), pass
    ``logits[..., :-1, :]`` and spans of ``ids[..., 1:]``.

    Returns:
        (S,) float64, differentiable with respect to ``logits``.
    """
    check_number_vocab(vocab)
    if not isinstance(spans, NumberSpans):
        raise TypeError(f"spans must be NumberSpans, got {type(spans).__name__}")
    logits = check_logits(logits, vocab_size=vocab.vocab_size)
    if logits.shape[:-1] != spans.span_of_token.shape:
        raise ValueError(
            f"logits must have shape (*token_ids.shape, V) for the token ids the spans were "
            f"found in, {tuple(spans.span_of_token.shape)}; got {tuple(logits.shape)}"
        )
    tables = span_tables(vocab, logits.device)
    number_logits = number_logits_at(
        logits, spans.number_positions, tables.ids, compute_dtype(logits)
    )
    return span_values(expected_token_values(number_logits, tables.values), spans)


class NumberPredictions(NamedTuple):
    """What :func:`predict_numbers` returns for P prompts: ``number`` (P,) the chosen readout;
    ``mean``, ``median``, ``mode``, ``mass``, ``pruned``, ``mean_bound`` and
    ``mean_standard_error`` (P,) and
    ``probabilities`` (P, 10**max_digits) as in
    :class:`~numtok.readout.distribution.NumberDistribution`, all float64 on the CPU; ``greedy``:
    each prompt's greedy continuation, token ids (empty without ``new_tokens``)."""

    number: torch.Tensor
    mean: torch.Tensor
    median: torch.Tensor
    mode: torch.Tensor
    mass: torch.Tensor
    pruned: torch.Tensor
    probabilities: torch.Tensor
    mean_bound: torch.Tensor
    mean_standard_error: torch.Tensor
    greedy: tuple[tuple[int, ...], ...] = ()

    @classmethod
    def of(
        cls,
        distribution: NumberDistribution,
        readout: str,
        greedy: tuple[tuple[int, ...], ...] = (),
    ) -> NumberPredictions:
        """The predictions of ``distribution`` with ``readout`` (one of :data:`READOUTS`) as
        ``number``."""
        chosen = {"expected": distribution.mean, "median": distribution.median}
        return cls(
            chosen.get(readout, distribution.mode),
            distribution.mean,
            distribution.median,
            distribution.mode,
            distribution.mass,
            distribution.pruned,
            distribution.probabilities,
            distribution.mean_bound,
            distribution.mean_standard_error,
            greedy,
        )


READOUTS = ("expected", "median", "mode")


@torch.no_grad()
def greedy_tokens(
    scorer: NextTokenScorer, new_tokens: int, *, eos_id: int | None
) -> tuple[tuple[int, ...], ...]:
    """Greedy decoding through a :class:`~numtok.readout.distribution.NextTokenScorer`: each of
    ``new_tokens`` steps appends to every prompt its most likely next token (``argmax`` of the
    logits (P, V), the first on ties, as ``generate(do_sample=False)``), one ``extend`` of the P
    sequences per step; each prompt's tokens end at its first ``eos_id`` (kept) and the steps
    stop when every prompt has one. With a :class:`~numtok.readout.scorers.CachedScorer` the
    prompts' pass is the one its later ``start()`` (a number tree) reuses."""
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 1:
        raise ValueError(f"new_tokens must be a positive int, got {new_tokens!r}")
    logits = scorer.start()  # (P, V)
    sequences = torch.arange(logits.shape[0])
    steps: list[torch.Tensor] = []
    ended = torch.zeros(len(sequences), dtype=torch.bool)
    while True:
        token = logits.argmax(dim=-1).cpu()  # (P,)
        steps.append(token)
        ended |= token == eos_id
        if len(steps) == new_tokens or bool(ended.all()):
            break
        logits = scorer.extend(sequences, token)
    tokens = torch.stack(steps, dim=1).tolist()  # (P, steps)
    eos = [row.index(eos_id) + 1 if eos_id in row else len(row) for row in tokens]
    return tuple(tuple(row[:end]) for row, end in zip(tokens, eos, strict=True))


def prompt_token_ids(
    tokenizer: Any, prompts: Sequence[Any], *, vocab_given: bool = False
) -> list[list[int]]:
    """The token ids of each prompt: a string tokenized by ``tokenizer(prompt)["input_ids"]``
    (refused with ``vocab_given``: a NumberVocab cannot tokenize text), a list of ints as it is;
    a ``TypeError``/``ValueError`` names the prompt that is neither, or an empty list."""
    if isinstance(prompts, (str, torch.Tensor)) or not isinstance(prompts, Sequence):
        raise TypeError(
            "prompts must be a list of strings (with a tokenizer) or of token-id lists, got "
            f"{type(prompts).__name__}"
        )
    if not prompts:
        raise ValueError("prompts must hold at least one prompt, got an empty list")
    encoded = []
    for index, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            if vocab_given:
                raise TypeError(
                    f"prompts[{index}] is a string, but a NumberVocab cannot tokenize text: pass "
                    "the tokenizer instead, or token-id lists"
                )
            prompt = tokenizer(prompt)["input_ids"]
        if (
            not isinstance(prompt, Sequence)
            or not prompt
            or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        ):
            raise TypeError(
                f"prompts[{index}] must be a string or a non-empty list of int token ids, got "
                f"{prompt!r:.80}"
            )
        encoded.append(list(prompt))
    return encoded


def prompts_per_group(
    vocab: NumberVocab,
    max_digits: int,
    *,
    max_value: int | None = None,
    max_prefixes: int | None = None,
) -> int:
    """How many prompts :func:`predict_numbers` reads at a time (at least one): each prompt's
    tree is scored on its own, so a group's widest level returns ``group · widest`` logit rows
    of V float32 columns at once (``widest``: :func:`~numtok.readout.distribution.widest_level`,
    at most ``max_prefixes``), kept under :data:`LOGITS_BUDGET_BYTES`."""
    widest = widest_level(vocab, max_digits, max_value=max_value)
    widest = widest if max_prefixes is None else min(widest, max_prefixes)
    return max(1, LOGITS_BUDGET_BYTES // (widest * vocab.vocab_size * 4))


def _output_size(model: Any) -> int | None:
    embeddings = getattr(model, "get_output_embeddings", lambda: None)()
    weight = getattr(embeddings, "weight", None)
    if isinstance(weight, torch.Tensor):
        return int(weight.shape[0])
    size = getattr(getattr(model, "config", None), "vocab_size", None)
    return size if isinstance(size, int) else None


def predict_numbers(
    model: Any,
    vocab_or_tokenizer: Any,
    prompts: Sequence[str] | Sequence[Sequence[int]],
    *,
    readout: str = "expected",
    max_digits: int = 2,
    max_value: int | None = None,
    min_probability: float = 0.0,
    tolerance: float = 0.0,
    max_prefixes: int | None = None,
    samples: int | None = None,
    seed: int = 0,
    new_tokens: int = 0,
    batch_size: int | None = None,
) -> NumberPredictions:
    """The number a causal LM would answer each prompt with, read out of its distribution.

    The model's distribution over the whole number that follows each prompt (non-negative
    integers of at most ``max_digits`` digits, each way of spelling it with number tokens
    scored exactly; see :func:`numtok.readout.distribution.number_distribution`) gives ``P(v)`` and
    the covered mass ``m = Σ_v P(v)``. The readouts summarise ``P(v) / m``:

    * ``"expected"``: the mean ``Σ_v v·P(v) / m`` (minimises the expected squared error);
    * ``"median"``: the smallest ``v`` with ``Σ_{u≤v} P(u) ≥ m/2`` (minimises the absolute error);
    * ``"mode"``: ``argmax_v P(v)``, the single most likely number (greedy decoding reads the
      most likely *token* at each step instead, which can differ).

    The prompt should end where the number starts (e.g. ``"Score: "``, or after a chat
    template's assistant header); ``1 - m`` says how much of the model's mass went elsewhere
    (words, a sign, longer numbers). One call computes the whole distribution, so every
    readout comes with it (``mean``, ``median``, ``mode``); ``readout`` only picks ``number``.

    Cost: each prompt is run once and its key/value cache kept; then each level of the tree of
    number prefixes is one batched forward of one token per live prefix (about
    ``1.1 · 10**max_digits`` one-token steps per prompt in all, ``10**max_digits`` of them in
    the last level), attending to the prompt's cache. Prompts are read in groups small enough
    that the widest level's logits, (prefixes, V) float32, stay under 1 GiB
    (:data:`LOGITS_BUDGET_BYTES`; 54 prompts at a time for two digits and V = 49,152): the memory
    does not grow with the number of prompts. Models whose cache is not a transformers
    ``DynamicCache`` of full-attention layers (sliding-window or hybrid attention, state-space
    models), or whose attention ignores a 4D mask (flash, flex), are scored the slow way
    instead, with a warning: every continuation from the prompt's first token, right-padded.

    Args:
        model: a Hugging Face causal LM (any module whose call with ``input_ids`` returns
            logits (B, T, V) and, with ``use_cache=True``, its key/value cache; without the
            cache, ``attention_mask`` is passed too); it is put in eval mode while scoring.
        vocab_or_tokenizer: its tokenizer (text prompts; the NumberVocab is built from it with
            the model's output size) or a :class:`~numtok.NumberVocab` (token-id prompts).
        prompts: strings, or lists of token ids.
        readout: ``"expected"``, ``"median"`` or ``"mode"``: which summary is ``number``.
        max_digits: the longest number enumerated, 1 to 5; exactly, the model scores about
            ``1.1 · 10**max_digits`` continuations per prompt (with a ``tolerance``, the
            likely ones).
        max_value: the largest number enumerated (None: all of ``max_digits`` digits): on a
            known scale (scores 0 to 11) most prefixes need not be scored; larger numbers'
            probability is left out of ``mass``.
        min_probability: prefixes less likely than this are not extended (faster); ``pruned``
            bounds the probability this loses.
        tolerance: the unexplored mass allowed, a share of each prompt's number mass (0:
            exact); each level extends the most likely prefixes first, and ``pruned`` reports
            the mass left unexplored (:func:`numtok.readout.distribution.number_distribution`;
            :data:`numtok.readout.distribution.FAST_TOLERANCE` moves the mean by about a thousandth
            of the values' range at most).
        max_prefixes: at most this many prefixes per prompt and level (None: no limit); it also
            bounds the widest level, so more prompts share each forward.
        samples: instead of enumerating, draw this many numbers per prompt from the same
            distribution (:func:`numtok.readout.sampling.sample_distribution`, with ``seed``):
            ``mean`` is then unbiased with ``mean_standard_error`` beside it, at a cost of at
            most ``samples`` one-token steps per prompt and level whatever the spread (the
            draws that share a prefix share its step); not with ``min_probability``,
            ``tolerance`` or ``max_prefixes``, which prune an enumeration.
        seed: the draws' random stream, with ``samples``.
        new_tokens: with a positive count, each prompt's greedy continuation of up to that many
            tokens (``greedy``; :func:`greedy_tokens`, ending at the tokenizer's
            ``eos_token_id``) comes from the same prompt pass as the distribution.
        batch_size: prefixes (or, the slow way, whole sequences) per forward pass; None
            (default): with the cache, as many as keep a forward's key/value cache under
            1 GiB, the slow way 8.

    Returns:
        :class:`NumberPredictions`.
    """
    if readout not in READOUTS:
        raise ValueError(f"readout must be one of {list(READOUTS)}, got {readout!r}")
    if batch_size is not None and (
        isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
    ):
        raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}")
    check_max_value(max_value, check_max_digits(max_digits))
    if samples is not None:
        check_samples(samples)
        pruning = {"min_probability": min_probability, "tolerance": tolerance,
                   "max_prefixes": max_prefixes}  # fmt: skip
        set_too = [name for name, value in pruning.items() if value not in (0.0, None)]
        if set_too:
            raise ValueError(
                f"samples draws numbers instead of enumerating them: {', '.join(set_too)} "
                "(which prune an enumeration) must be left at their defaults, got "
                + ", ".join(f"{name}={pruning[name]!r}" for name in set_too)
            )
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 0:
        raise ValueError(f"new_tokens must be a non-negative int, got {new_tokens!r}")
    if not callable(model):
        raise TypeError(f"model must be a callable causal LM, got {type(model).__name__}")
    vocab_given = isinstance(vocab_or_tokenizer, NumberVocab)
    if vocab_given:
        vocab = vocab_or_tokenizer
    else:
        vocab = NumberVocab.from_tokenizer(vocab_or_tokenizer, vocab_size=_output_size(model))
    ids = prompt_token_ids(vocab_or_tokenizer, prompts, vocab_given=vocab_given)
    pad_id = getattr(vocab_or_tokenizer, "pad_token_id", None)
    pad_id = pad_id if isinstance(pad_id, int) else 0
    eos_id = getattr(vocab_or_tokenizer, "eos_token_id", None)
    widest = samples if samples is not None else max_prefixes
    group = prompts_per_group(vocab, max_digits, max_value=max_value, max_prefixes=widest)
    scorer: type[CachedScorer] | type[WholeSequenceScorer] = CachedScorer
    greedy: list[tuple[int, ...]] = []

    def distribution_of(prompts_of_group: list[list[int]]) -> NumberDistribution:
        model_scorer = scorer(model, prompts_of_group, pad_id=pad_id, batch_size=batch_size)
        if new_tokens:
            greedy.extend(greedy_tokens(model_scorer, new_tokens, eos_id=eos_id))
        if samples is not None:
            return sample_distribution(
                model_scorer, vocab, samples=samples, max_digits=max_digits,
                max_value=max_value, seed=seed,
            )  # fmt: skip
        return number_distribution(
            model_scorer,
            vocab,
            max_digits=max_digits,
            max_value=max_value,
            min_probability=min_probability,
            tolerance=tolerance,
            max_prefixes=max_prefixes,
        )

    parts: list[NumberDistribution] = []
    was_training = bool(getattr(model, "training", False))
    if hasattr(model, "eval"):
        model.eval()
    try:
        for begin in range(0, len(ids), group):
            prompts_of_group = ids[begin : begin + group]
            try:
                parts.append(distribution_of(prompts_of_group))
            except CacheUnsupportedError as reason:
                warnings.warn(
                    f"predict_numbers: {reason}; every continuation is scored from the prompt's "
                    "first token instead (exact, much slower)",
                    stacklevel=2,
                )
                scorer = WholeSequenceScorer
                parts.append(distribution_of(prompts_of_group))
    finally:
        if hasattr(model, "train"):
            model.train(was_training)
    distribution = NumberDistribution(*(torch.cat(field) for field in zip(*parts, strict=True)))
    return NumberPredictions.of(distribution, readout, tuple(greedy))
