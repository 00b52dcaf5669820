"""The whole number a language model would write next, as a probability distribution, by
enumerating every way it can spell a number of up to ``max_digits`` digits.

Greedy decoding reads out the *mode* of the model's next number, digit by digit; for a
regression target the *mean* (RMSE-optimal) or the *median* (MAE-optimal) of the same
distribution is a better point estimate. :func:`number_distribution` computes that distribution
exactly for short numbers; :func:`numtok.readout.decoding.predict_numbers` applies it to a Hugging
Face causal LM and text prompts.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch

from numtok.numbers.spans import span_tables
from numtok.numbers.vocab import NumberVocab, check_number_vocab

__all__ = [
    "FAST_TOLERANCE",
    "MAX_DIGITS",
    "NextTokenScorer",
    "NumberDistribution",
    "check_max_digits",
    "check_tolerance",
    "mean_bound",
    "number_distribution",
    "number_log_probs",
    "scorer_number_log_probs",
    "summarise_table",
]

#: The largest ``max_digits``: the table holds ``10**max_digits`` float64 values per prompt, and
#: the exact enumeration scores about ``1.1 · 10**max_digits`` continuations per prompt (a
#: ``tolerance`` scores only the likely ones).
MAX_DIGITS = 5

#: A ``tolerance`` with which the mean moves by less than 1e-3 of the values' range when the
#: covered mass is most of the number mass (see :func:`number_distribution`).
FAST_TOLERANCE = 1e-3


class NextTokenScorer(Protocol):
    """The model, seen as a tree of continuations of its prompts.

    ``start()`` returns the logits (P, V) of the token after each of the P prompts.
    ``extend(parents, tokens)`` returns the logits (M, V) of the token after M new sequences,
    sequence ``i`` being sequence ``parents[i]`` of the previous call (of ``start`` for the first
    ``extend``) followed by the token ``tokens[i]``. An implementation may keep a key/value cache
    per call and select its rows with ``parents``.
    """

    def start(self) -> torch.Tensor: ...

    def extend(self, parents: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor: ...


class NumberDistribution(NamedTuple):
    """What :func:`number_distribution` returns, for P prompts and ``D = max_digits``.

    ``probabilities`` (P, 10**D) float64: entry ``[i, v]`` is the probability that after prompt
    ``i`` the model writes the non-negative integer ``v`` with at most D digits and then ends it.
    ``mass`` (P,): the row sums, the probability the enumeration covers. ``mean``, ``median``
    and ``mode`` (P,) summarise each row renormalised to 1 (``nan`` where ``mass`` is 0).
    ``pruned`` (P,): the total probability of the prefixes not extended because of
    ``min_probability``, ``tolerance`` or ``max_prefixes`` (0 without pruning), the *unexplored
    mass*: every number missing from a row for that reason lies under one of them, so it bounds
    the probability lost, and the mean moves by at most ``pruned / (mass + pruned)`` times the
    range of the values. ``mean_bound`` (P,): a tighter bound on that move, from where each pruned
    prefix's numbers can lie (:func:`mean_bound`): the exact table's mean is within
    ``mean ± mean_bound`` (0 without pruning, ``nan`` where ``mean`` is).
    ``mean_standard_error`` (P,): 0 for an enumerated table; for a sampled one
    (:func:`numtok.readout.sampling.sample_distribution`, whose ``mean_bound`` is ``nan``: no
    bound holds) the standard error of its mean.
    """

    probabilities: torch.Tensor
    mass: torch.Tensor
    mean: torch.Tensor
    median: torch.Tensor
    mode: torch.Tensor
    pruned: torch.Tensor
    mean_bound: torch.Tensor
    mean_standard_error: torch.Tensor


def check_max_digits(max_digits: object) -> int:
    """``max_digits`` (the longest numbers :func:`number_distribution` enumerates) checked: an int
    from 1 to :data:`MAX_DIGITS`, not a bool; a ``TypeError`` or ``ValueError`` naming it."""
    if isinstance(max_digits, bool) or not isinstance(max_digits, int):
        raise TypeError(f"max_digits must be an int, got {max_digits!r}")
    if not 1 <= max_digits <= MAX_DIGITS:
        raise ValueError(
            f"max_digits must be between 1 and {MAX_DIGITS} (the enumeration grows as "
            f"10**max_digits), got {max_digits}"
        )
    return max_digits


def check_max_value(max_value: object, max_digits: int) -> int:
    """``max_value`` checked (a non-negative int or None); None is the largest number of
    ``max_digits`` digits."""
    if max_value is None:
        return int(10**max_digits - 1)
    if isinstance(max_value, bool) or not isinstance(max_value, int):
        raise TypeError(f"max_value must be an int or None, got {max_value!r}")
    if max_value < 0:
        raise ValueError(f"max_value must be a non-negative int, got {max_value}")
    return max_value


def _check_probability(min_probability: object) -> float:
    if isinstance(min_probability, bool) or not isinstance(min_probability, (int, float)):
        raise TypeError(f"min_probability must be a number in [0, 1), got {min_probability!r}")
    if not 0.0 <= min_probability < 1.0:
        raise ValueError(f"min_probability must be in [0, 1), got {min_probability!r}")
    return float(min_probability)


def check_tolerance(tolerance: object, *, name: str = "tolerance") -> float:
    """``tolerance`` (the unexplored mass :func:`number_distribution` may leave) checked: a number
    in [0, 1), not a bool; the errors call it ``name``."""
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)):
        raise TypeError(f"{name} must be a number in [0, 1), got {tolerance!r}")
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {tolerance!r}")
    return float(tolerance)


def _check_max_prefixes(max_prefixes: object) -> int | None:
    if max_prefixes is None:
        return None
    if isinstance(max_prefixes, bool) or not isinstance(max_prefixes, int) or max_prefixes < 1:
        raise ValueError(f"max_prefixes must be a positive int or None, got {max_prefixes!r}")
    return max_prefixes


def _most_likely(
    prompt: torch.Tensor, probability: torch.Tensor, allowance: torch.Tensor, largest: int | None
) -> torch.Tensor:
    """Which of C candidate prefixes to extend, (C,) bool: per prompt, the most likely ones until
    those left out weigh at most the prompt's ``allowance`` (P,), and at most ``largest``.

    With prompt ``q``'s candidates sorted by probability ``π_1 ≥ π_2 ≥ …``, the ``j``-th is kept
    when ``Σ_{i≥j} π_i > allowance_q`` (leaving it and every less likely one out would exceed
    the allowance) and ``j ≤ largest``; ``prompt`` and ``probability`` are (C,)."""
    by_probability = torch.argsort(probability, descending=True, stable=True)
    order = by_probability[torch.argsort(prompt[by_probability], stable=True)]  # (C,)
    sorted_prompt, sorted_probability = prompt[order], probability[order]
    first = torch.ones_like(sorted_prompt, dtype=torch.bool)
    first[1:] = sorted_prompt[1:] != sorted_prompt[:-1]
    position = torch.arange(len(order))
    group_start = torch.cummax(torch.where(first, position, 0), dim=0).values  # (C,)
    before = sorted_probability.cumsum(0) - sorted_probability  # exclusive, across prompts
    # Σ over this candidate and the less likely ones of its prompt (a suffix sum).
    total = torch.zeros_like(allowance).index_add_(0, sorted_prompt, sorted_probability)
    tail = total[sorted_prompt] - (before - before[group_start])
    keep = tail > allowance[sorted_prompt]
    if largest is not None:
        keep &= position - group_start < largest
    kept = torch.empty_like(keep)
    kept[order] = keep
    return kept


def scorer_number_log_probs(
    logits: torch.Tensor, vocab: NumberVocab, expected_rows: int
) -> torch.Tensor:
    """:func:`number_log_probs` of a scorer's logits, checked to be (``expected_rows``, V)."""
    if (
        not isinstance(logits, torch.Tensor)
        or logits.dim() != 2
        or logits.shape[0] != expected_rows
    ):
        raise ValueError(
            f"the scorer must return logits of shape ({expected_rows}, V), one row per sequence; "
            f"got {getattr(logits, 'shape', type(logits).__name__)}"
        )
    if logits.shape[1] != vocab.vocab_size:
        raise ValueError(
            f"the scorer's logits have {logits.shape[1]} columns but the NumberVocab expects "
            f"vocab_size={vocab.vocab_size}; build it with the model's output size "
            "(NumberVocab.from_tokenizer(tokenizer, vocab_size=model.config.vocab_size))"
        )
    return number_log_probs(logits, vocab)


def number_log_probs(logits: torch.Tensor, vocab: NumberVocab) -> torch.Tensor:
    """``log softmax(logits)`` (M, V) at the number-token columns ``vocab.ids``: float64 (M, N),
    the full-vocabulary log-sum-exp in the logits' own precision (at least float32), without a
    float64 copy of all logits."""
    wide = logits if logits.dtype == torch.float64 else logits.float()
    log_normaliser = torch.logsumexp(wide, dim=-1, keepdim=True).double()  # (M, 1)
    return wide[:, vocab.ids.to(logits.device)].double() - log_normaliser  # (M, N)


def widest_level(vocab: NumberVocab, max_digits: int, *, max_value: int | None = None) -> int:
    """The most sequences one prompt puts into one call of the scorer in
    :func:`number_distribution` without pruning: the largest count, over ``k``, of the ``k``-token
    spellings of at most ``max_digits`` digits whose value is at most ``max_value``
    (``10**max_digits`` with single-digit tokens and no ``max_value``). With ``n_k(v, d)`` the
    number of ``k``-token spellings of value ``v`` in ``d`` digits, a token of value ``t`` and
    ``c`` digits extends each to ``n_{k+1}(v·10**c + t, d + c)`` (``n_0(0, 0) = 1``); the level's
    size is ``Σ_{v ≤ max_value, d ≤ max_digits} n_k(v, d)`` (word-start tokens, which cannot
    continue a number, are counted too, so this bounds the level)."""
    check_number_vocab(vocab)
    max_digits = check_max_digits(max_digits)
    largest = check_max_value(max_value, max_digits)
    tables = span_tables(vocab)
    # The values of the number tokens of c digits, for each c.
    values_of = {c: tables.values[tables.digit_counts == c] for c in range(1, max_digits + 1)}
    # counts[d][v] = n_k(v, d); a d-digit spelling's value is below 10**d.
    counts = [torch.zeros(min(10**d, largest + 1), dtype=torch.long) for d in range(max_digits + 1)]
    counts[0][0] = 1
    widest = 1
    for _ in range(max_digits):
        extended = [torch.zeros_like(level) for level in counts]
        for d, level in enumerate(counts):
            for c in range(1, max_digits - d + 1):
                # (values so far, tokens of c digits): the value each token extends each to.
                child = torch.arange(len(level))[:, None] * 10**c + values_of[c]
                keep = child <= largest
                extended[d + c].index_add_(0, child[keep], level[:, None].expand_as(child)[keep])
        counts = extended
        widest = max(widest, int(sum(level.sum() for level in counts)))
    return widest


class Unexplored(NamedTuple):
    """The prefixes :func:`number_distribution` did not extend, U of them: ``prompt`` (U,) whose
    they are, ``low`` and ``high`` (U,) the least and the largest number they can start (a
    prefix of value ``v`` and ``d`` digits starts ``v`` and ``v·10**j + t``, ``t < 10**j``, for
    ``j ≤ max_digits − d``: the values ``v`` to ``(v + 1)·10**(max_digits − d) − 1``, at most
    ``max_value``), ``probability`` (U,) float64, theirs."""

    prompt: torch.Tensor
    low: torch.Tensor
    high: torch.Tensor
    probability: torch.Tensor

    @classmethod
    def of(
        cls,
        prompt: torch.Tensor,
        value: torch.Tensor,
        digits: torch.Tensor,
        probability: torch.Tensor,
        *,
        max_digits: int,
        largest: int,
    ) -> Unexplored:
        """The prefixes of ``value`` and ``digits`` digits (U,) of ``prompt`` left out."""
        high = (value + 1) * 10 ** (max_digits - digits) - 1
        return cls(prompt, value, high.clamp(max=largest), probability)


def _largest_ratio(
    prompt: torch.Tensor, gain: torch.Tensor, probability: torch.Tensor, mass: torch.Tensor
) -> torch.Tensor:
    """Per prompt (P,): ``max_q Σ q_u·gain_u / (mass + Σ q_u)`` over ``0 ≤ q_u ≤ probability_u``
    of the prompt's entries ``u`` (0 when none gains). A linear-fractional maximum over a box:
    at the optimum ``f*`` every ``q_u`` with ``gain_u > f*`` is full and every other is 0, so it is
    the best of the ratios over the entries taken in decreasing ``gain``, the first ``k`` of them
    for each ``k``."""
    by_gain = torch.argsort(gain, descending=True, stable=True)
    order = by_gain[torch.argsort(prompt[by_gain], stable=True)]
    sorted_prompt = prompt[order]
    weighted, weight = (probability * gain)[order], probability[order]
    first = torch.ones_like(sorted_prompt, dtype=torch.bool)
    first[1:] = sorted_prompt[1:] != sorted_prompt[:-1]
    position = torch.arange(len(order))
    group_start = torch.cummax(torch.where(first, position, 0), dim=0).values
    totals = []
    for values in (weighted, weight):
        running = values.cumsum(0)
        totals.append(running - (running - values)[group_start])  # Σ of the first k, per prompt
    ratio = totals[0] / (mass[sorted_prompt] + totals[1])
    best = torch.zeros_like(mass)
    return best.scatter_reduce(0, sorted_prompt, ratio, reduce="amax", include_self=True)


def mean_bound(mass: torch.Tensor, mean: torch.Tensor, unexplored: Unexplored) -> torch.Tensor:
    """How far the exact mean can lie from ``mean`` (P,), the mean of a table of covered ``mass``
    (P,) whose ``unexplored`` prefixes were not extended.

    The numbers under prefix ``u`` weigh some ``q_u ∈ [0, π_u]`` (``π_u`` its probability) and
    average some ``μ_u ∈ [low_u, high_u]``, so the exact mean is
    ``m* = (mass·m + Σ q_u μ_u) / (mass + Σ q_u)`` and

        ``m* − m ≤ max_q Σ q_u (high_u − m) / (mass + Σ q_u)``,
        ``m − m* ≤ max_q Σ q_u (m − low_u) / (mass + Σ q_u)``;

    the bound is the larger of the two maxima (:func:`_largest_ratio`): float64 (P,), 0 where no
    prefix was left out, ``nan`` where ``mean`` is. It is at most ``pruned / (mass + pruned)``
    times the range, and much less when the pruned prefixes are long and near the mean."""
    prompt = unexplored.prompt
    centre = mean[prompt]
    bound = torch.zeros_like(mass)
    for gain in (unexplored.high - centre, centre - unexplored.low):
        bound = torch.maximum(bound, _largest_ratio(prompt, gain, unexplored.probability, mass))
    return torch.where(torch.isnan(mean), torch.nan, bound)


def summarise_table(
    probabilities: torch.Tensor, pruned: torch.Tensor, unexplored: Unexplored
) -> NumberDistribution:
    """A :class:`NumberDistribution` of a value table ``probabilities`` (P, 10**D), float64:
    ``mass = Σ_v p_v``, ``mean = Σ_v v·p_v / mass``, the median the smallest v whose cumulative
    probability reaches ``mass / 2``, the mode ``argmax_v p_v`` (all NaN where ``mass`` is 0),
    ``pruned`` (P,) as given, ``mean_bound`` by :func:`mean_bound` of ``unexplored`` and
    ``mean_standard_error`` 0 (the table is read, not drawn)."""
    mass = probabilities.sum(dim=-1)  # (P,)
    values = torch.arange(probabilities.shape[-1], dtype=torch.float64)
    covered = mass > 0
    mean = torch.where(covered, probabilities @ values / mass, torch.nan)
    # The median: the smallest v whose cumulative probability reaches half the covered mass.
    cumulative = probabilities.cumsum(dim=-1)
    median = (cumulative < mass[:, None] / 2).sum(dim=-1).double()
    median = torch.where(covered, median, torch.nan)
    mode = torch.where(covered, probabilities.argmax(dim=-1).double(), torch.nan)
    bound = mean_bound(mass, mean, unexplored)
    exact = torch.zeros_like(mass)
    return NumberDistribution(probabilities, mass, mean, median, mode, pruned, bound, exact)


@torch.no_grad()
def number_distribution(
    scorer: NextTokenScorer,
    vocab: NumberVocab,
    *,
    max_digits: int = 2,
    max_value: int | None = None,
    min_probability: float = 0.0,
    tolerance: float = 0.0,
    max_prefixes: int | None = None,
) -> NumberDistribution:
    """The distribution of the whole number each prompt's continuation starts with.

    A number is spelled by one or more number tokens (``vocab``; each a digit string, ``"7"`` or
    ``"123"``): the first may be any number token, each further one must not start a new word
    (``vocab.word_start_ids``: ``Ġ12`` after ``3`` is a second number, not ``312``). It ends at
    the first token that cannot continue it. With ``p(t | s)`` the model's next-token
    probability, the number ``v`` has probability

        ``P(v) = Σ_{t_1..t_k spelling v} Π_i p(t_i | prompt, t_<i) · (1 − Σ_{c ∈ C} p(c | prompt,
        t_1..t_k))``

    over token sequences whose digit strings concatenate to ``v`` (leading zeros allowed: ``0``
    ``7`` is 7) with at most ``max_digits`` digits, ``C`` being the number tokens that continue
    a number. Every such sequence is scored, so the result is exact for numbers of up to
    ``max_digits`` digits; the probability of longer numbers, of a sign or decimal point before
    the digits, or of no number at all is the uncovered ``1 − mass``. A decimal point after the
    digits ends the number (``3.5`` counts as 3). The cost is one scored sequence per prefix:
    ``1 + 10 + … + 10**max_digits`` per prompt with single-digit tokens, exactly; with a
    ``tolerance`` only the likely prefixes, and ``pruned`` bounds what the others held.

    Args:
        scorer: the model as a :class:`NextTokenScorer`.
        vocab: the number tokens.
        max_digits: the longest number enumerated (1 to :data:`MAX_DIGITS`).
        max_value: the largest number enumerated (None: every number of at most ``max_digits``
            digits); a prefix whose value exceeds it is not scored, since every number it starts
            does too (``P(v) = 0`` in the table for ``v > max_value``, their probability
            uncovered: ``1 − mass``). On a known scale it saves most of the work: 23 instead of
            111 scored prefixes per prompt for scores 0 to 11 with single-digit tokens.
        min_probability: prefixes less likely than this are not extended and their probability
            is added to ``pruned``; 0 enumerates everything.
        tolerance: the unexplored mass allowed, as a share of the prompt's number mass ``s``
            (the probability that its continuation starts with a number token that can begin a
            number of at most ``max_digits`` digits and ``max_value``); 0 (default) enumerates
            everything. Level ``k`` of the tree (prefixes of ``k`` tokens, all of a batch's in
            one call of the scorer) extends each prompt's most likely prefixes first and leaves
            out the least likely ones while everything left out so far weighs at most
            ``tolerance · s · k / max_digits``; so ``pruned ≤ tolerance · s`` and, when the
            covered mass is most of ``s``, the mean moves by at most about ``tolerance`` times
            the values' range (:data:`FAST_TOLERANCE`, 1e-3: a thousandth of it). A peaked
            distribution then costs a few prefixes per level instead of ``10**k``.
        max_prefixes: at most this many prefixes of each prompt extended per level (None: no
            limit); what it leaves out is added to ``pruned`` too, so the bound holds whatever
            it costs in accuracy.

    Returns:
        :class:`NumberDistribution`.
    """
    vocab = check_number_vocab(vocab)
    max_digits = check_max_digits(max_digits)
    largest = check_max_value(max_value, max_digits)
    min_probability = _check_probability(min_probability)
    tolerance = check_tolerance(tolerance)
    max_prefixes = _check_max_prefixes(max_prefixes)
    # Each token's integer value and digit count ("007" is 7 and 3); digit strings only.
    tables = span_tables(vocab)
    token_values, token_digits = tables.values, tables.digit_counts
    starts_word = torch.isin(vocab.ids, torch.tensor(vocab.word_start_ids, dtype=torch.long))
    ids = vocab.ids
    size = 10**max_digits

    logits = scorer.start()
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise ValueError(
            "the scorer's start() must return logits of shape (prompts, V), got "
            f"{getattr(logits, 'shape', type(logits).__name__)}"
        )
    prompts = logits.shape[0]
    log_probs = scorer_number_log_probs(logits, vocab, prompts).cpu()  # (P, N)
    probabilities = torch.zeros(prompts, size, dtype=torch.float64)
    pruned = torch.zeros(prompts, dtype=torch.float64)
    # The paths of the current level: prompt, value so far, digits so far, log-probability.
    prompt = torch.arange(prompts)
    value = torch.zeros(prompts, dtype=torch.long)
    digits = torch.zeros(prompts, dtype=torch.long)
    log_prob = torch.zeros(prompts, dtype=torch.float64)
    allowed = torch.ones(len(ids), dtype=torch.bool)  # the first token may start a word
    budget = torch.zeros(prompts, dtype=torch.float64)  # tolerance · s, set at the first level
    none = torch.zeros(0, dtype=torch.long)
    left_out = [Unexplored.of(none, none, none, none.double(), max_digits=1, largest=0)]
    level = 0
    while True:
        level += 1
        # Extend every path by every allowed number token that keeps it within max_digits.
        child_log_prob = log_prob[:, None] + log_probs  # (M, N)
        keep = allowed & (digits[:, None] + token_digits <= max_digits)
        # A longer spelling never lowers the value, so a prefix above the largest value only
        # starts numbers above it (spellings past max_digits, whose values may overflow, are
        # already out).
        child_value = value[:, None] * 10**token_digits + token_values  # (M, N)
        keep &= child_value <= largest
        if level == 1:  # rows are prompts: s, each prompt's number mass in range
            budget = tolerance * torch.where(keep, child_log_prob.exp(), 0.0).sum(dim=1)
        child_digits = digits[:, None] + token_digits  # (M, N)
        if min_probability > 0:
            likely = child_log_prob >= torch.log(torch.tensor(min_probability, dtype=torch.float64))
            unlikely = torch.where(keep & ~likely, child_log_prob.exp(), 0.0).sum(dim=1)  # (M,)
            pruned.index_add_(0, prompt, unlikely)
            rows, columns = (keep & ~likely).nonzero(as_tuple=True)
            left_out.append(Unexplored.of(
                prompt[rows], child_value[rows, columns], child_digits[rows, columns],
                child_log_prob[rows, columns].exp(), max_digits=max_digits, largest=largest,
            ))  # fmt: skip
            keep &= likely
        parents, tokens = keep.nonzero(as_tuple=True)
        if tolerance > 0 or max_prefixes is not None:
            probability = child_log_prob[parents, tokens].exp()  # (C,)
            allowance = budget * level / max_digits - pruned  # (P,)
            chosen = _most_likely(prompt[parents], probability, allowance, max_prefixes)
            pruned.index_add_(0, prompt[parents[~chosen]], probability[~chosen])
            rows, columns = parents[~chosen], tokens[~chosen]
            left_out.append(Unexplored.of(
                prompt[rows], child_value[rows, columns], child_digits[rows, columns],
                probability[~chosen], max_digits=max_digits, largest=largest,
            ))  # fmt: skip
            parents, tokens = parents[chosen], tokens[chosen]
        if len(parents) == 0:
            break
        prompt = prompt[parents]
        value = child_value[parents, tokens]
        digits = child_digits[parents, tokens]
        log_prob = child_log_prob[parents, tokens]
        logits = scorer.extend(parents, ids[tokens])
        log_probs = scorer_number_log_probs(logits, vocab, len(parents)).cpu()
        allowed = ~starts_word
        # The number ends here unless a continuing number token follows:
        # log(1 − Σ_C p) from log Σ_C p (clamped: rounding can put it a hair above 0).
        log_continue = torch.logsumexp(log_probs[:, allowed], dim=-1).clamp(max=0.0)
        log_end = torch.log1p(-torch.exp(log_continue))
        probabilities.index_put_((prompt, value), torch.exp(log_prob + log_end), accumulate=True)
    unexplored = Unexplored(*(torch.cat(field) for field in zip(*left_out, strict=True)))
    return summarise_table(probabilities, pruned, unexplored)
