"""The whole number a language model would write next, estimated from samples where enumerating
every spelling cannot pay (answers of four or five digits from a spread distribution).

:func:`numtok.readout.distribution.number_distribution` scores every prefix of every number
(about ``1.1 · 10**max_digits`` per prompt, fewer with a ``tolerance`` only when the model is
peaked). :func:`sample_distribution` draws ``samples`` numbers per prompt from the same
distribution instead, renormalised to the numbers it covers, so that the mean of the draws is an
unbiased estimate of the readout's ``mean`` with a standard error that shrinks as
``1/√samples``, whatever the spread; the samples of one prompt that share a prefix share its
forward (a peaked model costs a few rows per level).
"""

from __future__ import annotations

import torch

from numtok.numbers.spans import span_tables
from numtok.numbers.vocab import NumberVocab, check_number_vocab
from numtok.readout.distribution import (
    NextTokenScorer,
    NumberDistribution,
    Unexplored,
    check_max_digits,
    check_max_value,
    scorer_number_log_probs,
    summarise_table,
)

__all__ = ["check_samples", "sample_distribution"]


def check_samples(samples: object, *, name: str = "samples") -> int:
    """``samples`` (draws per prompt) checked: an int of at least 2, not a bool; a
    ``TypeError`` or ``ValueError`` that calls it ``name``."""
    if isinstance(samples, bool) or not isinstance(samples, int):
        raise TypeError(f"{name} must be an int, got {samples!r}")
    if samples < 2:
        raise ValueError(f"{name} must be at least 2 (a standard error needs two), got {samples}")
    return samples


@torch.no_grad()
def sample_distribution(
    scorer: NextTokenScorer,
    vocab: NumberVocab,
    *,
    samples: int,
    max_digits: int = 2,
    max_value: int | None = None,
    seed: int = 0,
) -> NumberDistribution:
    """``samples`` draws per prompt of the whole number its continuation starts with, as a
    :class:`~numtok.readout.distribution.NumberDistribution` of their frequencies.

    Each draw follows the model token by token, as
    :func:`~numtok.readout.distribution.number_distribution` defines ``P(v)``: a first number token
    ``t_1`` among those that start a number of at most ``max_digits`` digits and ``max_value``,
    drawn with probability ``p(t_1 | prompt) / s`` (``s`` their total, the prompt's number mass
    in range); then, with ``C`` the number tokens that continue a number, the next token ``c ∈
    C`` with probability ``p(c | prompt, t_1..t_k)`` or the end of the number with ``1 − Σ_C p``.
    A draw that spells a number beyond ``max_digits`` or ``max_value`` is rejected; the others
    are exact draws of ``P(v) / Σ_{u covered} P(u)``, the table ``number_distribution`` reads its
    readouts from. So, with ``n`` accepted draws ``v_1..v_n`` of a prompt:

    * ``probabilities[v] = s · #{i: v_i = v} / samples`` (an unbiased estimate of ``P(v)``, and
      ``mass`` of the covered mass);
    * ``mean`` ``= Σ v_i / n``, unbiased for the exact mean given ``n ≥ 1``, and
      ``mean_standard_error`` ``= sd(v) / √n`` (``nan`` for ``n < 2``); ``median`` and
      ``mode`` are the draws' (consistent, not unbiased);
    * ``pruned`` is 0 (nothing is left unexplored: the error is the draws' noise) and
      ``mean_bound`` is ``nan`` (no bound holds for a random error).

    Args:
        scorer: the model as a :class:`~numtok.readout.distribution.NextTokenScorer`; each level
            extends the distinct prefixes the live draws have reached, once each.
        vocab: the number tokens.
        samples: draws per prompt (at least 2).
        max_digits: the longest number covered (1 to :data:`~numtok.readout.distribution.
            MAX_DIGITS`).
        max_value: the largest number covered (None: every number of ``max_digits`` digits).
        seed: the draws' random stream (``torch.Generator().manual_seed(seed)``): the same
            prompts, model and seed give the same draws.

    Returns:
        :class:`~numtok.readout.distribution.NumberDistribution`.
    """
    vocab = check_number_vocab(vocab)
    samples = check_samples(samples)
    max_digits = check_max_digits(max_digits)
    largest = check_max_value(max_value, max_digits)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    generator = torch.Generator().manual_seed(seed)
    tables = span_tables(vocab)
    token_values, token_digits = tables.values, tables.digit_counts
    continues = ~torch.isin(vocab.ids, torch.tensor(vocab.word_start_ids, dtype=torch.long))

    logits = scorer.start()
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise ValueError(
            "the scorer's start() must return logits of shape (prompts, V), got "
            f"{getattr(logits, 'shape', type(logits).__name__)}"
        )
    prompts = logits.shape[0]
    first = scorer_number_log_probs(logits, vocab, prompts).cpu().exp()  # (P, N)
    first = torch.where((token_digits <= max_digits) & (token_values <= largest), first, 0.0)
    number_mass = first.sum(dim=1)  # (P,): s
    drawn = torch.zeros(prompts, samples, dtype=torch.long)
    live = number_mass > 0
    if bool(live.any()):
        drawn[live] = torch.multinomial(first[live], samples, replacement=True, generator=generator)
    # Each draw: its prompt, value and digits so far, and its row in the scorer's last call.
    prompt = torch.arange(prompts).repeat_interleave(samples)
    token = drawn.reshape(-1)
    value, digits = token_values[token], token_digits[token]
    active = live[prompt]
    accepted = torch.zeros(prompts * samples, dtype=torch.bool)
    row = prompt.clone()  # the start() rows are the prompts
    while bool(active.any()):
        # The distinct (row, token) pairs of the live draws: one new sequence each.
        pairs, row_of_draw = torch.unique(
            torch.stack([row[active], token[active]], dim=1), dim=0, return_inverse=True
        )
        logits = scorer.extend(pairs[:, 0], vocab.ids[pairs[:, 1]])
        log_probs = scorer_number_log_probs(logits, vocab, len(pairs)).cpu()  # (R, N)
        step = torch.where(continues, log_probs.exp(), 0.0)
        # The number ends with the probability that no continuing number token follows.
        ending = (1.0 - step.sum(dim=1, keepdim=True)).clamp(min=0.0)
        choices = torch.cat([step, ending], dim=1)[row_of_draw]  # (live draws, N + 1)
        choice = torch.multinomial(choices, 1, generator=generator).squeeze(1)
        index = active.nonzero().squeeze(1)
        ends = choice == len(vocab.ids)
        accepted[index[ends]] = True
        going, next_token = index[~ends], choice[~ends]
        value[going] = value[going] * 10 ** token_digits[next_token] + token_values[next_token]
        digits[going] += token_digits[next_token]
        active[index] = False
        inside = (digits[going] <= max_digits) & (value[going] <= largest)
        active[going[inside]] = True  # a draw beyond the covered numbers is rejected
        token[going] = next_token
        row[index] = row_of_draw  # this call's rows, which the next extends
    probabilities = torch.zeros(prompts, 10**max_digits, dtype=torch.float64)
    weight = (number_mass / samples)[prompt[accepted]]
    probabilities.index_put_((prompt[accepted], value[accepted]), weight, accumulate=True)
    nothing = torch.zeros(0, dtype=torch.long)
    none_left = Unexplored(nothing, nothing, nothing, nothing.double())
    summary = summarise_table(probabilities, torch.zeros(prompts, dtype=torch.float64), none_left)
    return summary._replace(
        mean_bound=torch.full((prompts,), torch.nan, dtype=torch.float64),
        mean_standard_error=_standard_error(prompt[accepted], value[accepted].double(), prompts),
    )


def _standard_error(prompt: torch.Tensor, value: torch.Tensor, prompts: int) -> torch.Tensor:
    """Per prompt (P,): the standard error of the mean of its ``value``s (``sd / √n``, the
    sample standard deviation with ``n − 1``), ``nan`` for fewer than two."""
    count = torch.zeros(prompts, dtype=torch.float64).index_add_(0, prompt, torch.ones_like(value))
    total = torch.zeros(prompts, dtype=torch.float64).index_add_(0, prompt, value)
    mean = total / count.clamp(min=1)
    squares = torch.zeros(prompts, dtype=torch.float64)
    squares.index_add_(0, prompt, (value - mean[prompt]) ** 2)
    variance = squares / (count - 1).clamp(min=1)
    return torch.where(count >= 2, (variance / count).sqrt(), torch.nan)
