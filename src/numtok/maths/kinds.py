"""The number losses published since NTL, as kinds of :func:`numtok.number_token_loss` (and of
every entry point that takes ``kind``): ``kind="del"``, ``kind="smmd"`` and ``kind="dist2"``
with their authors' defaults, or ``kind=DEL(...)``, ``kind=SMMD(...)``, ``kind=DIST2(...)`` with
other settings.

Notation at one position whose label is a number token: ``z`` (N,) the logits of the N number
tokens of the :class:`~numtok.NumberVocab`, ``p = softmax(z)``, ``t`` the label's index among
them, ``v`` the tokens' values and ``ṽ`` the values on their digit length's scale (as NTL's).
On a digit tokenizer N = 10 and every formula below is the authors' (``shared`` definitions:
``number-losses.md``); the generalisation to multi-digit tokens is stated with each.

Each settings class below states its formula: :class:`DEL`, :class:`SMMD`, :class:`DIST2`.

DEL and DIST2 read the label sequence for the place weights (``place_weights=False``: ``w = 1``);
none of the three takes ``reweigh`` or ``squash_factor`` (SMMD has its own).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch
import torch.nn.functional as F

from numtok._common.validation import check_bool, check_number

__all__ = [
    "DEL",
    "DIST2",
    "SMMD",
    "KindSettings",
    "SMMDTables",
    "kind_losses",
    "settings_for",
    "smmd_tables",
]


@dataclass(frozen=True)
class DEL:
    """Settings of the digit entropy loss (``kind="del"``).

    **DEL** (digit entropy loss, arXiv 2605.20369):
    ``ℓ = w · Σ_c p_c · BCE_c / N`` with ``BCE_c = -[1{c=t}·log σ(z_c) + 1{c≠t}·log(1 - σ(z_c))]``
    (σ the sigmoid of the raw logit) and ``w`` the label's place weight: ``2k`` for the integer
    digit at place ``k`` (units 1, tens 2) and ``1.02^-(m+1)`` for the ``m``-th decimal, read
    from the label sequence. The mean over number positions is then the authors' mean over the
    (positions × 10 columns) matrix. Multi-digit tokens: the sum runs over all N number tokens and
    a token's place is that of its last digit (``123|45``: 6 and 2).

    Args:
        place_weights: weigh each position by its label's place (``2k`` for integer digits,
            ``1.02^-(m+1)`` for decimals), as the authors do; ``False``: every position 1.
    """

    name: ClassVar[str] = "del"
    place_weights: bool = True

    def __post_init__(self) -> None:
        check_bool("DEL(place_weights=...)", self.place_weights)


@dataclass(frozen=True)
class SMMD:
    """Settings of the smooth MMD alignment loss (``kind="smmd"``), with the authors' defaults.

    **SMMD** (smooth MMD alignment, arXiv 2606.27731): ``r = p - onehot(t)``,
    ``ℓ = max(0, rᵀKr + α·rᵀLr)`` (``mode="smmd"``; ``"mmd"`` keeps ``rᵀKr``, ``"smooth"``
    ``α·rᵀLr``) with the kernel ``K_ij = mean_σ k(d̃_ij)`` clamped to [0, 1] (``"gaussian"``:
    ``exp(-d̃²/(2σ²))``, ``"laplace"``: ``exp(-d̃/σ)``), ``d̃`` the distance ``|v_i - v_j|`` of the
    tokens' integer values, its non-zero values mapped affinely onto ``[1, s]`` (the squash factor,
    the identity on digits with ``s = 9``), the graph Laplacian ``L = diag(deg) - K``,
    ``deg_i = Σ_j K_ij`` and ``α = 1 / (2·mean(deg))`` (``"auto"``) or a given value. Multi-digit
    tokens: the numeric vocabulary is every number token of the NumberVocab with its value (the
    authors' ``0…999`` single-token integers for a Llama-3-style tokenizer; tokens of equal value,
    ``7`` and ``007``, are at distance 0).

    Args:
        kernel: ``"gaussian"`` or ``"laplace"``.
        sigmas: the kernel's bandwidths, averaged over (a non-empty tuple of numbers > 0).
        squash_factor: ``s > 1`` maps the non-zero distances onto ``[1, s]``; None leaves them.
        mode: ``"smmd"`` (``rᵀKr + α·rᵀLr``), ``"mmd"`` (``rᵀKr``) or ``"smooth"`` (``α·rᵀLr``).
        alpha: the smoothness weight ``α``, a number ≥ 0 or ``"auto"`` (``1/(2·mean degree)``).
    """

    name: ClassVar[str] = "smmd"
    kernel: str = "gaussian"
    sigmas: tuple[float, ...] = (2.0,)
    squash_factor: float | None = 9.0
    mode: str = "smmd"
    alpha: float | str = "auto"

    def __post_init__(self) -> None:
        if self.kernel not in ("gaussian", "laplace"):
            raise ValueError(
                f"SMMD(kernel=...) must be 'gaussian' or 'laplace', got {self.kernel!r}"
            )
        if not isinstance(self.sigmas, tuple) or not self.sigmas:
            raise TypeError(
                f"SMMD(sigmas=...) must be a non-empty tuple of numbers, got {self.sigmas!r}"
            )
        for sigma in self.sigmas:
            check_number("SMMD(sigmas=...) entries", sigma, minimum=0, inclusive=False)
        if self.squash_factor is not None:
            check_number(
                "SMMD(squash_factor=...)", self.squash_factor, minimum=1, inclusive=False,
                or_none=True,
            )  # fmt: skip
        if self.mode not in ("smmd", "mmd", "smooth"):
            raise ValueError(f"SMMD(mode=...) must be 'smmd', 'mmd' or 'smooth', got {self.mode!r}")
        if self.alpha != "auto" and (
            isinstance(self.alpha, (bool, str))
            or not isinstance(self.alpha, (int, float))
            or not math.isfinite(self.alpha)
            or self.alpha < 0
        ):
            raise ValueError(f"SMMD(alpha=...) must be 'auto' or a number >= 0, got {self.alpha!r}")


@dataclass(frozen=True)
class DIST2:
    """Settings of DIST2, the KL divergence to a distance-smoothed target (``kind="dist2"``).

    **DIST2** (the distance-smoothed target of DEL's scripts): the soft target
    ``q_j = softmax_j(-(ṽ_j - ṽ_t)² / τ)`` over the tokens of the label's digit length (the ten
    digits), ``ℓ = u · Σ_j q_j·(log q_j - log p_j) / N`` (a KL divergence) with ``u`` the place
    within the run of number tokens (units 1, tens 2, …; the decimal point ends a run). Mass on
    number tokens of another length lowers ``p`` of the target's tokens and so costs too.

    Args:
        place_weights: weigh each position by its place in its run of number tokens (units 1,
            tens 2, …), as DEL's scripts do; ``False``: every position 1.
        temperature: ``τ`` of the soft target ``softmax(-(ṽ - ṽ_t)²/τ)`` (1 in the scripts).
    """

    name: ClassVar[str] = "dist2"
    place_weights: bool = True
    temperature: float = 1.0

    def __post_init__(self) -> None:
        check_bool("DIST2(place_weights=...)", self.place_weights)
        check_number("DIST2(temperature=...)", self.temperature, minimum=0, inclusive=False)


KindSettings = DEL | SMMD | DIST2
_DEFAULTS: dict[str, KindSettings] = {"del": DEL(), "smmd": SMMD(), "dist2": DIST2()}
#: The names of these kinds.
NAMES = tuple(_DEFAULTS)


def settings_for(kind: object) -> KindSettings | None:
    """The settings of one of these kinds (a name or a settings object), None for any other."""
    if isinstance(kind, (DEL, SMMD, DIST2)):
        return kind
    if isinstance(kind, str):
        return _DEFAULTS.get(kind)
    return None


def uses_places(settings: KindSettings | None) -> bool:
    """Whether the kind weighs positions by their place in the number (DEL and DIST2)."""
    return isinstance(settings, (DEL, DIST2)) and settings.place_weights


def _log_softmax(z: torch.Tensor) -> torch.Tensor:
    # Written out, as NTL's softmax is (numtok.maths.ntl): faster on 10 columns on a CPU.
    return z - torch.logsumexp(z, dim=-1, keepdim=True)


def _digit_entropy(z: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """``Σ_c p_c · BCE_c / N`` per row; ``-log σ(x) = softplus(-x)``, ``-log(1-σ(x)) =
    softplus(x)``."""
    columns = torch.arange(z.shape[-1], device=z.device)
    is_label = position[:, None] == columns[None, :]  # (M, N)
    cross_entropy = torch.where(is_label, F.softplus(-z), F.softplus(z))
    return (torch.exp(_log_softmax(z)) * cross_entropy).sum(dim=-1) / z.shape[-1]


def smmd_kernel(values: torch.Tensor, settings: SMMD) -> torch.Tensor:
    """The (N, N) kernel ``K`` of the values (N,): squashed distances, averaged bandwidths,
    clamped to [0, 1]."""
    distance = (values[:, None] - values[None, :]).abs()
    if settings.squash_factor is not None:
        # Without reading anything back from the device: where no distance is 0 < d, the
        # nearest is inf and nothing is mapped.
        nonzero = distance > 0
        nearest = torch.where(nonzero, distance, torch.full_like(distance, torch.inf)).min()
        spread = distance.max() - nearest
        slope = torch.where(
            spread > 0, (settings.squash_factor - 1.0) / spread, torch.zeros_like(spread)
        )
        distance = torch.where(nonzero, 1.0 + (distance - nearest) * slope, distance)
    # One (N, N) kernel per bandwidth (plain floats: no tensor to copy to the device per call).
    each = [
        torch.exp(-0.5 * (distance / sigma).square())
        if settings.kernel == "gaussian"
        else torch.exp(-distance / sigma)
        for sigma in settings.sigmas
    ]
    return (sum(each[1:], each[0]) / len(each)).clamp(0.0, 1.0)


class SMMDTables(NamedTuple):
    """What SMMD needs of the vocabulary, in the compute dtype: the kernel ``K`` (N, N), the
    degrees ``deg = K·1`` (N,) and ``(A, B)`` (2,) with ``rᵀKr + α·rᵀLr = A·rᵀKr + B·Σ deg r²``
    for the mode (``rᵀLr = Σ deg r² - rᵀKr``): smmd ``(1 - α, α)``, mmd ``(1, 0)``, smooth
    ``(-α, α)``."""

    kernel: torch.Tensor
    degree: torch.Tensor
    coefficients: torch.Tensor


def smmd_tables(values: torch.Tensor, settings: SMMD) -> SMMDTables:
    """:class:`SMMDTables` of the tokens' values (N,), built on their device without reading
    anything back."""
    kernel = smmd_kernel(values, settings)
    degree = kernel.sum(dim=-1)
    alpha = (
        1.0 / (2.0 * degree.mean())
        if settings.alpha == "auto"
        else torch.full((), float(settings.alpha), dtype=values.dtype, device=values.device)
    )
    one = torch.ones_like(alpha)
    zero = torch.zeros_like(alpha)
    pairs = {"smmd": (one - alpha, alpha), "mmd": (one, zero), "smooth": (-alpha, alpha)}
    return SMMDTables(kernel, degree, torch.stack(pairs[settings.mode]))


def _smmd(z: torch.Tensor, position: torch.Tensor, tables: SMMDTables) -> torch.Tensor:
    residual = torch.exp(_log_softmax(z)) - F.one_hot(position, z.shape[-1]).to(z.dtype)
    mmd = (residual * (residual @ tables.kernel)).sum(dim=-1)  # rᵀKr (K symmetric)
    spread = (tables.degree * residual.square()).sum(dim=-1)  # Σ deg r²
    return (tables.coefficients[0] * mmd + tables.coefficients[1] * spread).clamp_min(0.0)


def _dist2(
    z: torch.Tensor,
    position: torch.Tensor,
    scaled_values: torch.Tensor,
    groups: torch.Tensor,
    settings: DIST2,
) -> torch.Tensor:
    same_length = groups[position][:, None] == groups[None, :]  # (M, N)
    closeness = -(scaled_values[None, :] - scaled_values[position][:, None]).square()
    target_logits = torch.where(
        same_length, closeness / settings.temperature, torch.full_like(closeness, -torch.inf)
    )
    log_target = _log_softmax(target_logits)
    divergence = torch.exp(log_target) * (log_target - _log_softmax(z))
    return (
        torch.where(same_length, divergence, torch.zeros_like(divergence)).sum(dim=-1) / z.shape[-1]
    )


def kind_losses(
    settings: KindSettings,
    number_logits: torch.Tensor,
    position: torch.Tensor,
    *,
    values: torch.Tensor,
    scaled_values: torch.Tensor,
    groups: torch.Tensor,
    place: torch.Tensor | None,
    smmd: SMMDTables | None = None,
) -> torch.Tensor:
    """The loss per position (M,) before loss weights, from the finite number logits (M, N) in
    the compute dtype, each label's index among the N number tokens (M,), the tokens' values,
    scaled values and length groups (N,), the place weights (M,) (None: 1) and, for SMMD, its
    tables (None: built from ``values``)."""
    if isinstance(settings, SMMD):
        return _smmd(number_logits, position, smmd or smmd_tables(values, settings))
    if isinstance(settings, DEL):
        loss = _digit_entropy(number_logits, position)
    else:
        loss = _dist2(number_logits, position, scaled_values, groups, settings)
    return loss if place is None else loss * place
