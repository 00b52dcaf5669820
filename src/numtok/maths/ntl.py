"""The Number Token Loss itself, shared by every path that computes it: the validated settings
(:class:`LossSpec`) and the loss at each position from its number-token logits
(:func:`position_losses`, :func:`reweighed`).

The reference (:func:`numtok.number_token_loss`, whose module docstring gives the definitions),
the fused pass over the logits (:mod:`numtok.losses.fused`), the pass over hidden states
(:mod:`numtok.losses.linear`), the ``nn.Module`` (:mod:`numtok.losses.module`) and the Trainer
adapter (:mod:`numtok.hf`) import this module as peers, so that every path computes the same number.

At a position whose label ``y`` is a number token, with ``z`` its N number-token logits,
``p = softmax(z)``, ``ṽ`` the tokens' values on their length's scale and ``ỹ`` the label's:

* ``kind="was"``: ``Σ_j p_j · d(ṽ_j, ỹ)`` with ``d = |ṽ_j - ỹ|`` (squashed when asked), and the
  largest distance ``D`` for tokens of another digit length;
* NTL-Lp (``"mse"``, ``"mae"``, ``"huber"`` or a callable ``f``):
  ``P_L · f(ŷ_L, ỹ) + (1 - P_L) · D_f`` with ``ŷ_L`` the expected value within the label's
  length ``L``, ``P_L`` that length's share of the number mass (``P_L = 1`` with single-digit
  tokens only) and ``D_f`` the largest value of ``f`` over the value range;
* ``reweigh``: ``ℓ · m + 1.01 · D · (1 - m)`` with ``m`` the full-vocabulary number mass;
* ``"del"``, ``"smmd"``, ``"dist2"`` (or their settings objects): the losses of
  :mod:`numtok.maths.kinds`, DEL and DIST2 times the place weights of
  :mod:`numtok.maths.place_weights`.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from numtok._common.validation import (
    check_bool,
    check_elementwise_callable,
    check_int,
    check_logit_softcap,
    check_reduction,
    check_squash_factor,
)
from numtok.maths.kinds import (
    DEL,
    DIST2,
    SMMD,
    KindSettings,
    SMMDTables,
    kind_losses,
    settings_for,
    smmd_tables,
    uses_places,
)
from numtok.maths.kinds import NAMES as OTHER_KINDS
from numtok.maths.place_weights import del_place_weights, run_place_weights
from numtok.numbers.vocab import NumberTables, NumberVocab, check_number_vocab

PointwiseLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
#: ``"was"``, ``"mse"``, ``"mae"``, ``"huber"``, ``"del"``, ``"smmd"``, ``"dist2"``, ``"number"``
#: (number level), a callable ``f(prediction, target)`` returning an elementwise loss, or the
#: settings of one of numtok.maths.kinds (``DEL(...)``, ``SMMD(...)``, ``DIST2(...)``).
Kind = str | PointwiseLoss | DEL | SMMD | DIST2

_POINTWISE: dict[str, PointwiseLoss] = {
    "mse": lambda prediction, target: (prediction - target).square(),
    "mae": lambda prediction, target: (prediction - target).abs(),
    "huber": lambda prediction, target: F.huber_loss(prediction, target, reduction="none"),
}
_KINDS = ("was", *_POINTWISE)
#: The number-level kind, served by numtok.losses.number_level.
NUMBER_LEVEL = "number"


def refuse_number_level(kind: Kind, entry_point: str, instead: str) -> None:
    """Raise a ``ValueError`` for ``kind="number"`` at an entry point that has no number-level
    path, naming the entry point and what computes that loss instead (``instead``)."""
    if isinstance(kind, str) and kind == NUMBER_LEVEL:
        raise ValueError(
            f"{entry_point} does not take kind='number' (the number-level loss over whole "
            f"numbers): it has no fused or logits-free path. {instead}"
        )


def check_number_level_capturable(capturable: bool) -> None:
    """``kind="number"`` has no capturable path: how many whole numbers the labels hold (and so
    the shapes of its computation) is read back from the device."""
    if check_bool("capturable", capturable):
        raise ValueError(
            "capturable=True is not available with kind='number': the number-level loss finds "
            "the whole numbers in the labels, whose count the host must read back; use a "
            "token-level kind for CUDA graphs and torch.compile(fullgraph=True)"
        )


def check_number_level_squash(squash_factor: float | None) -> None:
    if squash_factor is not None:
        raise ValueError(
            f"squash_factor applies to kind='was' only, got squash_factor={squash_factor!r} "
            "with kind='number'"
        )


# Reweighing charges mass outside the number tokens slightly more than the worst number token
# (ntloss's constant), so that any number token beats any text token.
_REWEIGH_MARGIN = 1.01


@dataclass(frozen=True)
class LossSpec:
    """The validated settings of a token-level NTL plus the scalars derived from the vocabulary
    (no tensors): what every path needs besides the logits, the labels and the lookup tables.

    ``logit_softcap`` (the fused and logits-free paths only): the logits ``x`` enter both losses
    as ``c·tanh(x/c)`` (Gemma 2's ``final_logit_softcapping``), None for ``x`` itself.
    ``capturable``: the computation may neither read anything back from the device nor depend
    on it for a shape (CUDA graphs, ``torch.compile(fullgraph=True)``): the value checks become
    device-side asserts and the number positions a mask over every position (see
    :func:`numtok.cross_entropy_with_ntl`).
    ``settings``: those of a kind of :mod:`numtok.maths.kinds` (None for NTL's kinds);
    ``group_lengths`` the digit length of each scale group, and, for the kinds with place
    weights, the vocabulary's decimal-point and word-start ids.

    :meth:`build` checks the settings once (in a function call or a module's ``__init__``) and
    raises a ``ValueError``/``TypeError`` naming the bad argument. ``kind="number"`` is refused
    here: the number-level loss (:mod:`numtok.losses.number_level`) has its own settings, and the
    callers that serve it (``number_token_loss``, ``NumberTokenLoss``) dispatch before building a
    spec.
    """

    kind: str
    pointwise: PointwiseLoss | None
    reweigh: bool
    squash_factor: float | None
    ignore_index: int
    reduction: str
    shift: bool
    vocab_size: int
    single_group: bool
    max_distance: float
    min_nonzero_distance: float
    max_cost: float
    logit_softcap: float | None = None
    settings: KindSettings | None = None
    group_lengths: tuple[int, ...] = (1,)
    decimal_point_ids: tuple[int, ...] = ()
    word_start_ids: tuple[int, ...] = ()
    capturable: bool = False

    @classmethod
    def build(
        cls,
        vocab: NumberVocab,
        *,
        kind: Kind,
        reweigh: bool,
        squash_factor: float | None,
        ignore_index: int,
        reduction: str,
        shift: bool,
        logit_softcap: float | None = None,
        capturable: bool = False,
    ) -> LossSpec:
        check_number_vocab(vocab)
        pointwise: PointwiseLoss | None
        settings = settings_for(kind)
        if settings is not None:
            pointwise, kind_name = None, settings.name
            for name, value, off in (
                ("reweigh", reweigh, False),
                ("squash_factor", squash_factor, None),
            ):
                if value is not off:
                    raise ValueError(
                        f"{name} applies to NTL's kinds, got {name}={value!r} with "
                        f"kind={kind_name!r}"
                        + (
                            " (SMMD's own is SMMD(squash_factor=...))"
                            if kind_name == "smmd"
                            else ""
                        )
                    )
        elif callable(kind):
            check_elementwise_callable("kind", kind)
            pointwise, kind_name = kind, getattr(kind, "__name__", "callable")
        elif kind in _KINDS:
            pointwise, kind_name = _POINTWISE.get(str(kind)), str(kind)
        elif kind == NUMBER_LEVEL:
            raise ValueError(
                "kind='number' (the number-level loss over whole numbers) has no fused path; use "
                "F.cross_entropy + number_token_loss(..., kind='number')"
            )
        else:
            raise ValueError(
                f"kind must be one of {(*_KINDS, *OTHER_KINDS, NUMBER_LEVEL)}, a settings object "
                f"of numtok.maths.kinds (DEL, SMMD, DIST2) or a callable, got {kind!r}"
            )
        squash = check_squash_factor(squash_factor)
        if squash is not None and pointwise is not None:
            raise ValueError(
                f"squash_factor applies to kind='was' only, got squash_factor={squash_factor!r} "
                f"with kind={kind_name!r}"
            )
        if settings is not None:
            max_cost = 0.0  # read by reweigh only, which these kinds refuse
        elif pointwise is None:
            farthest = torch.tensor(vocab.max_distance, dtype=torch.float64)
            max_cost = float(
                _squashed(farthest, squash, vocab.min_nonzero_distance, vocab.max_distance)
            )
        else:
            lo = vocab.scaled_values.min().reshape(1)
            hi = vocab.scaled_values.max().reshape(1)
            max_cost = max(float(pointwise(lo, hi).abs()), float(pointwise(hi, lo).abs()))
        return cls(
            kind=kind_name,
            pointwise=pointwise,
            reweigh=check_bool("reweigh", reweigh),
            squash_factor=squash,
            ignore_index=check_int("ignore_index", ignore_index),
            reduction=check_reduction(reduction),
            shift=check_bool("shift", shift),
            vocab_size=vocab.vocab_size,
            single_group=len(vocab.group_lengths) == 1,
            max_distance=vocab.max_distance,
            min_nonzero_distance=vocab.min_nonzero_distance,
            max_cost=max_cost,
            logit_softcap=check_logit_softcap(logit_softcap),
            settings=settings,
            group_lengths=tuple(vocab.group_lengths),
            decimal_point_ids=vocab.decimal_point_ids if uses_places(settings) else (),
            word_start_ids=vocab.word_start_ids if uses_places(settings) else (),
            capturable=check_bool("capturable", capturable),
        )

    def describe(self, number_tokens: int) -> str:
        """The settings as a module's ``extra_repr`` shows them (the defaults of the optional
        ones left out), with the vocabulary's count of number tokens."""
        return (
            f"kind={self.kind!r}, reweigh={self.reweigh}, squash_factor={self.squash_factor}, "
            f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, shift={self.shift}, "
            f"number_tokens={number_tokens}, vocab_size={self.vocab_size}"
            + ("" if self.logit_softcap is None else f", logit_softcap={self.logit_softcap}")
            + (", capturable=True" if self.capturable else "")
        )

    @property
    def callable_kind(self) -> bool:
        """Whether ``kind`` is the caller's own function rather than one of the named kinds."""
        return self.pointwise is not None and _POINTWISE.get(self.kind) is not self.pointwise

    def squash(self, distance: torch.Tensor) -> torch.Tensor:
        return _squashed(distance, self.squash_factor, self.min_nonzero_distance, self.max_distance)

    @property
    def squash_slope(self) -> float:
        """The slope of :meth:`squash` between the nearest and the farthest distance (0 without
        squashing)."""
        if self.squash_factor is None:
            return 0.0
        return _squash_slope(self.squash_factor, self.min_nonzero_distance, self.max_distance)


def _squash_slope(squash_factor: float, nearest: float, farthest: float) -> float:
    """``(s - 1)/(D - d_min)``, 0 where all distances are equal."""
    spread = farthest - nearest
    return (squash_factor - 1.0) / spread if spread > 0 else 0.0


def _squashed(
    distance: torch.Tensor, squash_factor: float | None, nearest: float, farthest: float
) -> torch.Tensor:
    """ntloss's squashing: 0 stays 0; the nearest wrong value costs 1 and the farthest costs
    ``squash_factor``, affinely in between: ``1 + (d - d_min)·(s - 1)/(D - d_min)``. The result
    does not change when all values are multiplied by a constant."""
    if squash_factor is None:
        return distance
    squashed = 1.0 + (distance - nearest) * _squash_slope(squash_factor, nearest, farthest)
    return torch.where(distance == 0, torch.zeros_like(distance), squashed)


def _wasserstein(
    probs: torch.Tensor,
    target: torch.Tensor,
    values: torch.Tensor,
    same_group: torch.Tensor | None,
    spec: LossSpec,
) -> torch.Tensor:
    """``Σ_j p_j · d(v_j, y)`` per position: probs (M, N), target (M,), values (N,) -> (M,)."""
    distance = (target[:, None] - values[None, :]).abs()  # (M, N)
    if same_group is not None:
        distance = torch.where(same_group, distance, torch.full_like(distance, spec.max_distance))
    return (probs * spec.squash(distance)).sum(dim=-1)


def _expected_value_loss(
    number_logits: torch.Tensor,
    probs: torch.Tensor,
    target: torch.Tensor,
    values: torch.Tensor,
    same_group: torch.Tensor | None,
    spec: LossSpec,
) -> torch.Tensor:
    """``f(ŷ, y)`` with ``ŷ = Σ_j p_j v_j``; per length group as in the module docstring."""
    assert spec.pointwise is not None
    if same_group is None:
        return spec.pointwise(probs @ values, target)  # (M,)
    # Conditional distribution within the label's length, q = softmax(z restricted to L), and
    # the share of number mass it holds, P_L = exp(lse_L - lse_all_numbers).
    group_logits = torch.where(
        same_group, number_logits, torch.full_like(number_logits, -torch.inf)
    )
    group_lse = torch.logsumexp(group_logits, dim=-1)  # (M,)
    prediction = (torch.exp(group_logits - group_lse[:, None]) * values).sum(dim=-1)
    share = torch.exp(group_lse - torch.logsumexp(number_logits, dim=-1))
    return share * spec.pointwise(prediction, target) + (1.0 - share) * spec.max_cost


def number_positions(
    flat_labels: torch.Tensor, tables: NumberTables, spec: LossSpec
) -> tuple[torch.Tensor, torch.Tensor]:
    """Whether each label (M,) is a number token, and its index among the N number tokens (0
    where it is not)."""
    is_target = flat_labels != spec.ignore_index
    position = tables.position_of_id[torch.where(is_target, flat_labels, 0)]  # (M,) in [-1, N)
    return is_target & (position >= 0), position.clamp_min(0)


def position_losses(
    number_logits: torch.Tensor,
    position: torch.Tensor,
    tables: NumberTables,
    spec: LossSpec,
    place: torch.Tensor | None = None,
) -> torch.Tensor:
    """NTL per position before reweighing and weights, (M,), from the finite number logits
    (M, N) in the compute dtype, each label's index among the number tokens (M,) and, for the
    kinds with place weights, those of the labels (M,) (:func:`place_weights`)."""
    if spec.settings is not None:
        scaled = tables.scaled_values.to(number_logits.dtype)
        return kind_losses(
            spec.settings,
            number_logits,
            position,
            values=token_values(tables, spec).to(number_logits.dtype),
            scaled_values=scaled,
            groups=tables.groups,
            place=place,
            smmd=smmd_tables_for(tables, spec, number_logits.dtype)
            if isinstance(spec.settings, SMMD)
            else None,
        )
    values = tables.scaled_values.to(number_logits.dtype)  # (N,)
    target = values[position]  # (M,)
    same_group = (
        None
        if spec.single_group
        else tables.groups[position][:, None] == tables.groups[None, :]  # (M, N)
    )
    # p = exp(z - logsumexp(z)), the softmax written out: torch.softmax's CPU kernel is ~4x
    # slower for the 10 columns of a digit vocabulary (torch 2.13; 3072 x 10, forward + backward:
    # 841 us vs 354 us), and every digit tokenizer has exactly those 10 columns.
    probs = torch.exp(number_logits - torch.logsumexp(number_logits, dim=-1, keepdim=True))
    if spec.pointwise is None:
        return _wasserstein(probs, target, values, same_group, spec)
    return _expected_value_loss(number_logits, probs, target, values, same_group, spec)


# SMMD's tables per vocabulary (its tables' scaled values, which live as long as the tables),
# settings and dtype; a few entries (the (N, N) kernel of 1,110 tokens is 4.9 MB in float32).
_SMMD_TABLES: dict[tuple[object, ...], tuple[weakref.ref[torch.Tensor], SMMDTables]] = {}
_SMMD_TABLES_KEPT = 16


def smmd_tables_for(tables: NumberTables, spec: LossSpec, dtype: torch.dtype) -> SMMDTables:
    """SMMD's kernel, degrees and mode coefficients (:func:`numtok.maths.kinds.smmd_tables`) for the
    vocabulary of ``tables`` in ``dtype``, built once and kept (every chunk of rows of every call
    reuses them); under ``torch.compile`` built in the graph."""
    settings = spec.settings
    if not isinstance(settings, SMMD):
        raise TypeError(f"smmd_tables_for needs an SMMD kind, got {spec.kind!r}")
    if torch.compiler.is_compiling():
        return smmd_tables(token_values(tables, spec).to(dtype), settings)
    key = (id(tables.scaled_values), spec.group_lengths, settings, dtype)
    kept = _SMMD_TABLES.get(key)
    if kept is not None and kept[0]() is tables.scaled_values:
        return kept[1]
    built = smmd_tables(token_values(tables, spec).to(dtype), settings)
    if len(_SMMD_TABLES) >= _SMMD_TABLES_KEPT:
        _SMMD_TABLES.clear()
    _SMMD_TABLES[key] = (weakref.ref(tables.scaled_values), built)
    return built


def _ids_tensor(ids: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return torch.tensor(ids, dtype=torch.long, device=device)


_kept_ids_tensor = functools.lru_cache(maxsize=64)(_ids_tensor)


def _ids_on(ids: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """``ids`` (a LossSpec's small table) as a long tensor on ``device``, built once: a new one
    on every call would be a host-to-device copy per chunk of rows on a GPU. Under
    ``torch.compile`` a constant of the graph (Dynamo does not trace through a cache)."""
    if torch.compiler.is_compiling():
        return _ids_tensor(ids, device)
    return _kept_ids_tensor(ids, device)


def _token_lengths(tables: NumberTables, spec: LossSpec) -> torch.Tensor:
    """(N,) long, the digit length of each number token."""
    return _ids_on(spec.group_lengths, tables.groups.device)[tables.groups]


def token_values(tables: NumberTables, spec: LossSpec) -> torch.Tensor:
    """(N,) float64, what each number token is worth (``"007"`` 7), from its scaled value:
    multi-digit tokens are integers, so the product is rounded back to one."""
    lengths = _token_lengths(tables, spec)
    values = tables.scaled_values * torch.pow(10.0, (lengths - 1).to(tables.scaled_values.dtype))
    return torch.where(lengths > 1, values.round(), values)


def place_weights(
    labels: torch.Tensor, tables: NumberTables, spec: LossSpec, dtype: torch.dtype
) -> torch.Tensor | None:
    """The place weights (labels' shape, ``dtype``) of the kinds that use them (DEL, DIST2; see
    :mod:`numtok.maths.place_weights`), None for the others. ``labels`` (..., T), already shifted:
    numbers are read along the last dimension."""
    settings = spec.settings
    if not uses_places(settings):
        return None
    rows = labels.reshape(-1, labels.shape[-1]) if labels.dim() else labels.reshape(1, 1)
    device = rows.device
    known = rows != spec.ignore_index
    safe = torch.where(known, rows, 0)
    position = tables.position_of_id[safe]
    is_number = known & (position >= 0)
    digits = torch.where(is_number, _token_lengths(tables, spec)[position.clamp_min(0)], 0)

    def among(ids: tuple[int, ...]) -> torch.Tensor:
        return known & torch.isin(safe, _ids_on(ids, device))

    starts_word = among(spec.word_start_ids)
    if isinstance(settings, DEL):
        weights = del_place_weights(
            is_number, among(spec.decimal_point_ids), digits, starts_word, dtype
        )
    else:
        weights = run_place_weights(is_number, digits, starts_word).to(dtype)
    return weights.reshape(labels.shape)


def reweighed(loss: torch.Tensor, log_number_mass: torch.Tensor, spec: LossSpec) -> torch.Tensor:
    """``loss·m + 1.01·D·(1 - m)`` with ``m = exp(log_number_mass)`` the full-vocabulary mass on
    number tokens; ``m <= 1``, also where rounding (or a row of -inf logits) says otherwise."""
    mass = torch.exp(log_number_mass.clamp_max(0.0))
    return loss * mass + _REWEIGH_MARGIN * spec.max_cost * (1 - mass)


def reweighed_derivatives(
    loss: torch.Tensor, log_number_mass: torch.Tensor, spec: LossSpec
) -> tuple[torch.Tensor, torch.Tensor]:
    """The partial derivatives of :func:`reweighed` with respect to ``loss`` and to
    ``log_number_mass``: ``m`` and ``(loss - 1.01·D)·m``, the latter 0 where ``log m > 0`` (there
    the clamp holds ``m`` at 1, as autograd through :func:`reweighed` has it)."""
    mass = torch.exp(log_number_mass.clamp_max(0.0))
    slope = (loss - _REWEIGH_MARGIN * spec.max_cost) * mass
    return mass, torch.where(log_number_mass <= 0, slope, torch.zeros_like(slope))
