"""NTIL, the Numerical Token Integrity Loss (Fei et al., "Advancing Sequential Numerical Prediction
in Autoregressive Models", ACL 2025, arXiv 2505.13077; authors' code ``github.com/xfey/NTIL``,
``ntil.py`` at commit 864abaa): :func:`ntil_loss` and its ``nn.Module`` :class:`NTILLoss`.

Definition, with ``p = softmax(z)`` over the N number tokens at a position (``z`` their logits),
a *number* a run of number-token labels (any other token, ``ignore_index`` and a decimal point end
it; a word-start number token begins a new one), ``k_t`` the count of digits after label token
``t``'s last digit in its number and ``b`` the place base (``1 + σ`` in the paper):

1. **Digit term** (token level; the paper's earth mover's distance with exponential
   position-based weighting, ``W_exp = [(1 + σ)^(n-i-1)]``; the code's
   ``compute_digit_wdist_loss``): at every number-token label ``t``

       E_t = b^k_t · Σ_j p_j · C[t, j],   C[t, j] = Σ_{i < L_t} b^i · c_i(t, j)

   with ``c_i = |digit_i(t) - digit_i(j)|`` the distance of the two tokens' ``i``-th digits from
   the right where both have the label's length ``L_t``, else 9 (the largest digit distance).
   On single-digit tokens this is the authors' ``b^k · Σ_d p_d · |d - t|``, the EMD between
   ``p`` and the label on the digit axis 0-9, weighed by the digit's place.
2. **Value term** (sequence level, the code's ``compute_abs_numerical_loss``): each number's
   predicted value ``x̂ = Σ_t v̂_t · 10^k_t`` against its true value ``y = Σ_t v_t · 10^k_t``
   (``v_t`` the raw value of a token, ``"123"`` is 123), compared by ``A = |x̂ - y| / (max(x̂, y) +
   1)``. ``v̂_t`` is the value of the token a straight-through hard Gumbel-softmax picks: in the
   forward pass the value of ``argmax_j (z_j + ε·g_j)`` (``g`` standard Gumbel noise, ``ε`` =
   ``gumbel_noise``), in the backward pass the gradient of ``Σ_j softmax((z + ε·g)/τ)_j · v_j``
   (``τ`` = ``temperature``).
3. **Magnitude term** (sequence level, the code's ``compute_order_magnitude_loss``):
   ``G = log((max(x̂, y) + 1) / (min(x̂, y) + 1)) = |log(1 + x̂) - log(1 + y)|``.

``NTIL = digit_weight · mean_digits(E) + value_weight · mean_numbers(A) + magnitude_weight ·
mean_numbers(G)``: the digit term is averaged over the labels' digits (a token of L digits counts
L), the value and magnitude terms over the numbers. Add it to cross-entropy: ``CE + λ·NTIL``.

Defaults are the authors' code's (``NTIL.__init__``): ``digit_alpha=1.0``, ``abs_alpha=0.2``,
``mag_alpha=0.2``, ``digit_exp=1.2`` (σ = 0.2), and its Gumbel-softmax's ``tau=0.1``,
``noise_scale=0.01`` (hard, straight-through). Their ``ntil_lambda=0.3`` is the λ of
``CE + λ·NTIL``, not an argument here.

Where this differs from the authors' code, and why:

* The code normalises: given the CE value it returns ``CE + λ·NTIL·detach(CE / NTIL)``, so that
  the added term always *equals* ``λ·CE`` in value and only its gradient direction comes from
  NTIL. numtok returns NTIL itself; that scaling is the caller's to apply if wanted.
* The code averages each term within a sequence, then averages the sequences (sequences without
  digits count as 0); numtok averages over the batch's digits and numbers (as ``F.cross_entropy``
  averages tokens), with ``loss_weights``, ``num_items_in_batch``, ``reduction`` and ``shift``.
* The code knows only the ten single-digit tokens ``"0"``..``"9"`` (an assertion fails on other
  tokenizers). numtok takes every number token of the :class:`~numtok.NumberVocab`: multi-digit
  tokens (``"123"``) get the per-digit costs ``C`` above, each digit weighed by its own place, so
  a chunk costs what its digits would cost on a digit tokenizer with the chunk's digit marginals;
  a candidate of another length costs 9 per digit. Numbers assemble chunks with their place
  values (``123|4`` is 1234). Word-start digits (``Ġ7``, ``▁7``) are number tokens too, and begin
  a number.
* Runs: the code splits numbers at every non-digit label of the flattened batch row; numtok does
  the same within each row and also at word starts. As in the code, a decimal point ends a number
  (``3.015`` is the numbers 3 and 15, and ``0`` takes the largest weight in ``015``) and signs are
  not read: numbers are non-negative integers.

Sources: the paper's full text (and so its equation numbers) could not be read here; the weighting
formula ``W_exp`` above is the paper's as a published summary of it quotes it, with its sections'
names (token level: EMD with exponential position-based weighting; sequence level: differentiable
value construction with a Gumbel-softmax, a relative-deviation metric and an order-of-magnitude
term). Every formula and default is read from the authors' code and stated in full here, so that
it can be checked against the paper.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from numtok._common.reduction import divided_by_count
from numtok._common.shift import shift_labels
from numtok._common.validation import (
    check_bool,
    check_int,
    check_logits_and_labels,
    check_loss_weights,
    check_num_items,
    check_number,
    check_reduction,
)
from numtok.maths.ntil import digit_costs, magnitude_error, relative_error, run_places
from numtok.numbers.spans import span_tables
from numtok.numbers.vocab import NumberVocab, check_number_vocab
from numtok.ops.number_logits import compute_dtype, number_logits_at

__all__ = ["NTILLoss", "NTILSpec", "NTILTables", "ntil_loss", "ntil_tables"]

# 10**308 is the largest power of ten float64 holds: longer numbers cannot be assembled.
_MAX_DIGITS = 308


@dataclass(frozen=True)
class NTILSpec:
    """The validated settings of NTIL (:meth:`build` raises on bad ones)."""

    digit_weight: float
    value_weight: float
    magnitude_weight: float
    place_base: float
    temperature: float
    gumbel_noise: float
    ignore_index: int
    reduction: str
    shift: bool
    vocab_size: int

    @classmethod
    def build(
        cls,
        vocab: NumberVocab,
        *,
        digit_weight: float,
        value_weight: float,
        magnitude_weight: float,
        place_base: float,
        temperature: float,
        gumbel_noise: float,
        ignore_index: int,
        reduction: str,
        shift: bool,
    ) -> NTILSpec:
        check_number_vocab(vocab)
        return cls(
            digit_weight=check_number("digit_weight", digit_weight, minimum=0, inclusive=True),
            value_weight=check_number("value_weight", value_weight, minimum=0, inclusive=True),
            magnitude_weight=check_number(
                "magnitude_weight", magnitude_weight, minimum=0, inclusive=True
            ),
            place_base=check_number(
                "place_base",
                place_base,
                minimum=0,
                inclusive=False,
                why=" (the digit at place k weighs place_base**k; the paper's 1 + σ)",
            ),
            temperature=check_number("temperature", temperature, minimum=0, inclusive=False),
            gumbel_noise=check_number("gumbel_noise", gumbel_noise, minimum=0, inclusive=True),
            ignore_index=check_int("ignore_index", ignore_index),
            reduction=check_reduction(reduction),
            shift=check_bool("shift", shift),
            vocab_size=vocab.vocab_size,
        )


class NTILTables(NamedTuple):
    """What NTIL reads of the vocabulary, on one device: ``ids`` (N,) the number-token ids,
    ``values`` (N,) int64 their raw values, ``lengths`` (N,) long their digit counts,
    ``position_of_id`` (V,) the index into the N number tokens or -1, ``word_start`` (V,) bool
    the word-start number tokens, ``costs`` (N, N) float64 the digit term's ``C``."""

    ids: torch.Tensor
    values: torch.Tensor
    lengths: torch.Tensor
    position_of_id: torch.Tensor
    word_start: torch.Tensor
    costs: torch.Tensor


_TABLES: weakref.WeakKeyDictionary[NumberVocab, dict[tuple[torch.device, float], NTILTables]] = (
    weakref.WeakKeyDictionary()
)


def ntil_tables(
    vocab: NumberVocab, place_base: float, device: torch.device | str | None = None
) -> NTILTables:
    """:class:`NTILTables` of ``vocab`` for ``place_base`` on ``device``, built once.

    Raises:
        ValueError: a number token is not a digit string (NTIL reads the digits of each token:
            a :class:`~numtok.NumberVocab` built with values such as ``2.5`` has none).
    """
    check_number_vocab(vocab)
    device = torch.device(device) if device is not None else torch.device("cpu")
    kept = _TABLES.setdefault(vocab, {})
    key = (device, float(place_base))
    if key not in kept:
        for token_id, digits in zip(vocab.ids.tolist(), vocab.digits, strict=True):
            if not (digits.isascii() and digits.isdigit()):
                raise ValueError(
                    f"ntil_loss needs number tokens that are digit strings (it compares their "
                    f"digits); token id {token_id} has the value {digits!r}: build the "
                    "NumberVocab from a tokenizer or from digit strings"
                )
        spans = span_tables(vocab, device)
        word_start = torch.zeros(vocab.vocab_size, dtype=torch.bool)
        word_start[torch.tensor(vocab.word_start_ids, dtype=torch.long)] = True
        kept[key] = NTILTables(
            ids=spans.ids,
            values=spans.values,
            lengths=spans.digit_counts,
            position_of_id=spans.position_of_id,
            word_start=word_start.to(device),
            costs=digit_costs(spans.values, spans.digit_counts, float(place_base)),
        )
    return kept[key]


def _gumbel(like: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Standard Gumbel noise ``-log(e)``, ``e ~ Exp(1)``, one (K, N) draw in ``like``'s dtype."""
    exponential = torch.empty_like(like)
    return -exponential.exponential_(generator=generator).log()


def _ntil_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    tables: NTILTables,
    spec: NTILSpec,
    loss_weights: torch.Tensor | None,
    num_items_in_batch: torch.Tensor | int | None,
    generator: torch.Generator | None,
) -> torch.Tensor:
    logits, labels = check_logits_and_labels(
        logits, labels, vocab_size=spec.vocab_size, ignore_index=spec.ignore_index
    )
    loss_weights = check_loss_weights(loss_weights, labels)
    num_items = check_num_items(num_items_in_batch)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {generator!r}")
    if labels.dim() < 1:
        raise ValueError("labels must have a sequence dimension (..., T), got a scalar")
    if spec.shift:
        labels, loss_weights = shift_labels(labels, loss_weights, spec.ignore_index)
    dtype = compute_dtype(logits)
    rows = labels.reshape(-1, labels.shape[-1])  # (R, T)
    known = rows != spec.ignore_index
    safe = torch.where(known, rows, 0)
    index = tables.position_of_id[safe]  # (R, T) into the N number tokens, -1 elsewhere
    is_number = known & (index >= 0)
    index = index.clamp_min(0)
    lengths = torch.where(is_number, tables.lengths[index], 0)
    starts_word = is_number & tables.word_start[safe]
    place, run, run_start = run_places(is_number, lengths, starts_word)

    flat_number = is_number.reshape(-1)
    positions = flat_number.nonzero().squeeze(1)  # (K,); reads the count back from the device
    label = index.reshape(-1)[positions]  # (K,)
    token_place = place.reshape(-1)[positions]  # (K,)
    token_run = run.reshape(-1)[positions]  # (K,), sorted
    token_digits = tables.lengths[label]  # (K,)
    num_runs = int(run_start.sum())
    run_digits = token_digits.new_zeros(num_runs).index_add(0, token_run, token_digits)
    if bool((run_digits > _MAX_DIGITS).any()):
        raise ValueError(
            f"labels hold a number of {int(run_digits.max())} digits; ntil_loss assembles numbers "
            f"in float64, which holds at most {_MAX_DIGITS} digits"
        )
    z = number_logits_at(logits, positions, tables.ids, dtype)  # (K, N)

    # 1. Digit term: b^k · Σ_j p_j C[t, j].
    probs = torch.exp(z - torch.logsumexp(z, dim=-1, keepdim=True))  # (K, N)
    costs = tables.costs.index_select(0, label).to(dtype)  # (K, N)
    weight_of_place = torch.pow(spec.place_base, token_place.to(dtype))
    digit_term = weight_of_place * (probs * costs).sum(dim=-1)  # (K,)

    # 2./3. Value and magnitude terms: straight-through hard Gumbel-softmax values, assembled.
    noisy = z if spec.gumbel_noise == 0 else z + spec.gumbel_noise * _gumbel(z, generator)
    values = tables.values.to(torch.float64)  # (N,)
    soft = torch.softmax(noisy / spec.temperature, dim=-1) @ values.to(dtype)  # (K,)
    hard = values[noisy.argmax(dim=-1)]  # (K,) float64
    picked = hard + (soft - soft.detach()).to(torch.float64)  # hard value, soft gradient
    scale = torch.pow(10.0, token_place.to(torch.float64))
    true_value = values[label] * scale
    zeros = values.new_zeros(num_runs)
    predicted = zeros.index_add(0, token_run, picked * scale)  # (S,)
    target = zeros.index_add(0, token_run, true_value)  # (S,)
    run_term = spec.value_weight * relative_error(predicted, target) + (
        spec.magnitude_weight * magnitude_error(predicted, target)
    )  # (S,) float64

    if loss_weights is None:
        token_weight = torch.ones_like(digit_term)
    else:
        token_weight = loss_weights.reshape(-1).index_select(0, positions).to(dtype)
    first = run_start.reshape(-1).nonzero().squeeze(1)  # (S,) flat position of each run's start
    run_weight = (
        torch.ones_like(run_term)
        if loss_weights is None
        else loss_weights.reshape(-1).index_select(0, first).to(torch.float64)
    )
    weighted_digits = spec.digit_weight * token_weight * digit_term  # (K,)
    weighted_runs = (run_weight * run_term).to(dtype)  # (S,)

    if spec.reduction == "none":
        per_position = z.new_zeros(labels.numel()).index_add(0, positions, weighted_digits)
        return per_position.index_add(0, first, weighted_runs).reshape(labels.shape)
    total_digits = weighted_digits.sum()
    total_runs = weighted_runs.sum()
    if spec.reduction == "sum":
        return total_digits + total_runs
    if num_items is not None:
        return divided_by_count(total_digits + total_runs, num_items)
    tiny = torch.finfo(dtype).tiny
    digit_count = (token_weight * token_digits.to(dtype)).sum().clamp_min(tiny)
    run_count = run_weight.sum().to(dtype).clamp_min(tiny)
    return total_digits / digit_count + total_runs / run_count


def ntil_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    vocab: NumberVocab,
    *,
    digit_weight: float = 1.0,
    value_weight: float = 0.2,
    magnitude_weight: float = 0.2,
    place_base: float = 1.2,
    temperature: float = 0.1,
    gumbel_noise: float = 0.01,
    loss_weights: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    num_items_in_batch: torch.Tensor | int | None = None,
    shift: bool = False,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """NTIL (see the module docstring: the formulas, the authors' defaults and where numtok
    differs from their code); add it to cross-entropy, ``CE + λ·NTIL``.

    Args:
        logits: (..., T, V) float32, bfloat16, float16 or float64; V must equal
            ``vocab.vocab_size``. Only the number-token columns at number positions are gathered
            and computed in float32 (float64 stays float64); numbers are assembled in float64.
        labels: (..., T) integer token ids in [0, V) or ``ignore_index``; numbers never cross rows.
        vocab: the :class:`~numtok.NumberVocab` of the tokenizer (its word-start ids begin
            numbers); its number tokens must be digit strings, of any length.
        digit_weight: weight of the digit term (the code's ``digit_alpha``, 1.0).
        value_weight: weight of the value term ``|x̂ - y| / (max(x̂, y) + 1)`` (``abs_alpha``,
            0.2); 0 leaves it out.
        magnitude_weight: weight of the magnitude term ``|log(1 + x̂) - log(1 + y)|``
            (``mag_alpha``, 0.2); 0 leaves it out.
        place_base: ``b`` > 0, the digit at place ``k`` weighs ``b**k`` (``digit_exp``, 1.2; the
            paper's ``1 + σ``); 1 weighs every digit alike.
        temperature: ``τ`` > 0 of the Gumbel-softmax whose gradient the predicted values take
            (0.1).
        gumbel_noise: ``ε`` >= 0, the scale of the Gumbel noise added to the number logits
            before picking each predicted token (0.01); 0 picks the argmax, deterministically.
        loss_weights: (..., T) non-negative; a token's digit term takes its position's weight
            (and counts ``weight × digits`` in the mean), a number's terms its first token's.
        ignore_index: label value that is skipped (it also ends a number).
        reduction: ``"mean"`` (digit term over the digits, value and magnitude terms over the
            numbers), ``"sum"``, or ``"none"`` (the labels' shape: each token's weighted digit
            term at its position, each number's value and magnitude terms added at its first
            token; their sum is ``"sum"``).
        num_items_in_batch: with ``"mean"``, the whole sum divided by this count instead (one
            denominator, for exact gradient accumulation).
        shift: compare ``logits[..., t, :]`` with ``labels[..., t + 1]`` (causal LMs).
        generator: the random generator of the Gumbel noise (None: torch's global one). The
            noise is one (K, N) draw for the K number labels in flat order.

    Returns:
        A scalar (labels' shape for ``"none"``), float32 (float64 for float64 logits). A batch
        without numbers gives 0, still connected to the graph.

    Raises:
        ValueError: besides the usual argument checks (each names the argument, what it takes
            and what came), for a vocabulary whose number tokens are not digit strings and for
            a label number of more than 308 digits, which float64 cannot assemble.

    Example:
        >>> import torch
        >>> from numtok import NumberVocab
        >>> vocab = NumberVocab.from_values({i: str(i) for i in range(10)}, vocab_size=12)
        >>> labels = torch.tensor([1, 2, 10])  # "12" then a word
        >>> logits = torch.full((3, 12), -30.0)
        >>> logits[0, 1] = logits[1, 3] = logits[2, 10] = 30.0  # predicts "13"
        >>> # digit term (1.2·0 + 1·|3 - 2|) / 2 digits, value term |13 - 12| / 14
        >>> loss = ntil_loss(logits, labels, vocab, magnitude_weight=0.0, gumbel_noise=0.0)
        >>> round(float(loss), 4), round(0.5 + 0.2 / 14, 4)
        (0.5143, 0.5143)
    """
    spec = NTILSpec.build(
        vocab,
        digit_weight=digit_weight,
        value_weight=value_weight,
        magnitude_weight=magnitude_weight,
        place_base=place_base,
        temperature=temperature,
        gumbel_noise=gumbel_noise,
        ignore_index=ignore_index,
        reduction=reduction,
        shift=shift,
    )
    device = logits.device if isinstance(logits, torch.Tensor) else None
    tables = ntil_tables(vocab, spec.place_base, device)
    return _ntil_loss(logits, labels, tables, spec, loss_weights, num_items_in_batch, generator)


class NTILLoss(nn.Module):
    """``nn.Module`` form of :func:`ntil_loss`: settings validated once, the tables are buffers
    (``.to(device)``, ``state_dict``).

    ``forward(logits, labels, *, loss_weights=None, num_items_in_batch=None, generator=None)``.
    """

    ids: torch.Tensor
    values: torch.Tensor
    lengths: torch.Tensor
    position_of_id: torch.Tensor
    word_start: torch.Tensor
    costs: torch.Tensor

    def __init__(
        self,
        vocab: NumberVocab,
        *,
        digit_weight: float = 1.0,
        value_weight: float = 0.2,
        magnitude_weight: float = 0.2,
        place_base: float = 1.2,
        temperature: float = 0.1,
        gumbel_noise: float = 0.01,
        ignore_index: int = -100,
        reduction: str = "mean",
        shift: bool = False,
    ) -> None:
        super().__init__()
        self.spec = NTILSpec.build(
            vocab,
            digit_weight=digit_weight,
            value_weight=value_weight,
            magnitude_weight=magnitude_weight,
            place_base=place_base,
            temperature=temperature,
            gumbel_noise=gumbel_noise,
            ignore_index=ignore_index,
            reduction=reduction,
            shift=shift,
        )
        for name, tensor in ntil_tables(vocab, self.spec.place_base)._asdict().items():
            self.register_buffer(name, tensor.clone())

    def forward(
        self,
        logits: torch.Tensor,
        labels: torch.Tensor,
        *,
        loss_weights: torch.Tensor | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        tables = NTILTables(
            self.ids, self.values, self.lengths, self.position_of_id, self.word_start,
            self.costs.to(torch.float64),
        )  # fmt: skip
        return _ntil_loss(
            logits, labels, tables, self.spec, loss_weights, num_items_in_batch, generator
        )

    def extra_repr(self) -> str:
        spec = self.spec
        return (
            f"digit_weight={spec.digit_weight}, value_weight={spec.value_weight}, "
            f"magnitude_weight={spec.magnitude_weight}, place_base={spec.place_base}, "
            f"temperature={spec.temperature}, gumbel_noise={spec.gumbel_noise}, "
            f"ignore_index={spec.ignore_index}, reduction={spec.reduction!r}, "
            f"shift={spec.shift}, vocab_size={spec.vocab_size}"
        )
