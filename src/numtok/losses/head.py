"""The number head: the Number Token Loss straight from the hidden states, on top of whatever
computes the cross-entropy.

``linear_number_token_loss(hidden, weight, labels, vocab, bias=b, lse=lse, ...)`` has the value and
the gradients (for ``hidden``, ``weight``, ``bias`` and ``lse``) of

    number_token_loss(softcap(hidden @ weight.T + b), labels, vocab, ...)

without the (M, V) logits. NTL reads a row of logits only through its N number-token logits and,
for ``reweigh``, its log-sum-exp, and only where the label is a number token. At those P positions
the number logits are ``hidden[P] @ weight[ids].T + b[ids]``: a (P, H) × (H, N) product beside the
cross-entropy's (M, H) × (H, V), about ``P·N / (M·V)`` of its work (10⁻⁵ for 10 digits and 10 %
number labels; 3·10⁻³ for Llama-3's 1,110 number tokens and 30 %). The log-sum-exp comes from
the cross-entropy beside it: ``lse=`` as a kernel returns it (Cut Cross-Entropy's
``return_lse=True``), or ``label_log_probs=``, the labels' log-probabilities (TRL's fused LM
head's ``log_probs``), from which ``lse = z_label - log p_label`` at a number-labelled position.

So NTL rides on PyTorch's cross-entropy, Liger-Kernel's or Cut Cross-Entropy's kernels, TRL's
fused LM head or a model's own loss: ``loss = ce + ntl_weight * linear_number_token_loss(...)``.
The gradients reach only the P rows of ``hidden`` and the N number rows of ``weight`` and ``bias``
(autograd still hands them out as tensors of the full shapes, zero elsewhere).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from numtok._common.shift import shift_labels
from numtok._common.validation import (
    check_linear_inputs,
    check_logit_softcap,
    check_loss_weights,
    check_num_items,
    check_position_values,
    check_token_ids,
)
from numtok.losses.number_level import NumberLevelSpec, number_level_loss_of_rows
from numtok.maths.ntl import (
    NUMBER_LEVEL,
    Kind,
    LossSpec,
    check_number_level_capturable,
    check_number_level_squash,
)
from numtok.numbers.buffers import VocabBuffers
from numtok.numbers.spans import span_tables
from numtok.numbers.vocab import NumberTables, NumberVocab
from numtok.ops.number_logits import compute_dtype
from numtok.ops.rows import token_level_loss
from numtok.ops.sources import HeadRows

__all__ = ["LinearNumberTokenLoss", "NumberHeadSpec", "linear_number_token_loss"]


@dataclass(frozen=True)
class NumberHeadSpec:
    """The validated settings of the number head: those of the token-level loss (``token``) or,
    for ``kind="number"``, of the number-level loss (``number``), and the soft cap."""

    token: LossSpec | None
    number: NumberLevelSpec | None
    logit_softcap: float | None

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
        logit_softcap: float | None,
        capturable: bool = False,
    ) -> NumberHeadSpec:
        softcap = check_logit_softcap(logit_softcap)
        if isinstance(kind, str) and kind == NUMBER_LEVEL:
            check_number_level_squash(squash_factor)
            check_number_level_capturable(capturable)
            number = NumberLevelSpec.build(
                vocab,
                error="smape",
                reweigh=reweigh,
                ignore_index=ignore_index,
                reduction=reduction,
                shift=shift,
            )
            span_tables(vocab)  # refuses number tokens that are not digit strings, now
            return cls(token=None, number=number, logit_softcap=softcap)
        token = LossSpec.build(
            vocab,
            kind=kind,
            reweigh=reweigh,
            squash_factor=squash_factor,
            ignore_index=ignore_index,
            reduction=reduction,
            shift=shift,
            logit_softcap=softcap,
            capturable=capturable,
        )
        return cls(token=token, number=None, logit_softcap=softcap)

    @classmethod
    def of(cls, spec: LossSpec) -> NumberHeadSpec:
        """The number head of a token-level loss's validated settings (its soft cap included)."""
        return cls(token=spec, number=None, logit_softcap=spec.logit_softcap)

    @property
    def settings(self) -> LossSpec | NumberLevelSpec:
        settings = self.token if self.token is not None else self.number
        assert settings is not None
        return settings


def number_head_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    vocab: NumberVocab,
    spec: NumberHeadSpec,
    tables: NumberTables,
    *,
    bias: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    label_log_probs: torch.Tensor | None = None,
    loss_weights: torch.Tensor | None = None,
    num_items_in_batch: torch.Tensor | int | None = None,
) -> torch.Tensor:
    """:func:`linear_number_token_loss` with its settings already validated (``spec``) and the
    vocabulary's tables on the hidden states' device: what the module and the training routes
    call. Checks the tensors."""
    settings = spec.settings
    capturable = spec.token is not None and spec.token.capturable
    hidden, weight, bias, labels = check_linear_inputs(
        hidden, weight, bias, labels, settings.vocab_size
    )
    labels = check_token_ids(
        "labels", labels, vocab_size=settings.vocab_size, ignore_index=settings.ignore_index,
        on_device=capturable,
    )  # fmt: skip
    loss_weights = check_loss_weights(loss_weights, labels, on_device=capturable)
    num_items = check_num_items(num_items_in_batch, labels.device if capturable else None)
    lse = check_position_values("lse", lse, labels)
    label_log_probs = check_position_values("label_log_probs", label_log_probs, labels)
    if lse is not None and label_log_probs is not None:
        raise ValueError(
            "pass one of lse and label_log_probs (each gives the log-sum-exp), not both"
        )
    if settings.reweigh and lse is None and label_log_probs is None:
        raise ValueError(
            "reweigh=True needs each number position's full-vocabulary log-sum-exp, which the "
            "number head does not compute: pass lse= (the labels' shape; e.g. Cut "
            "Cross-Entropy's return_lse=True) or label_log_probs= (e.g. TRL's fused LM head's "
            "log_probs), or reweigh=False"
        )
    if spec.number is not None and labels.dim() < 1:
        raise ValueError("labels must have a sequence dimension (..., T), got a scalar")
    if settings.shift:
        labels, loss_weights = shift_labels(labels, loss_weights, settings.ignore_index)

    def flat(values: torch.Tensor | None) -> torch.Tensor | None:
        return None if values is None else values.reshape(-1)

    number_tables = span_tables(vocab, hidden.device) if spec.number is not None else None
    source = HeadRows(
        hidden.reshape(-1, hidden.shape[-1]),  # (M, H)
        weight,
        bias,
        tables.ids if number_tables is None else number_tables.ids,
        compute_dtype(hidden),
        softcap=spec.logit_softcap,
        lse=flat(lse),
        label_log_probs=flat(label_log_probs),
    )
    if spec.token is not None:
        return token_level_loss(source, labels, loss_weights, tables, spec.token, num_items)
    assert spec.number is not None and number_tables is not None
    return number_level_loss_of_rows(
        source, labels, loss_weights, number_tables, spec.number, num_items
    )


def linear_number_token_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    vocab: NumberVocab,
    *,
    bias: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    label_log_probs: torch.Tensor | None = None,
    kind: Kind = "was",
    reweigh: bool = False,
    squash_factor: float | None = None,
    loss_weights: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    num_items_in_batch: torch.Tensor | int | None = None,
    shift: bool = False,
    logit_softcap: float | None = None,
    capturable: bool = False,
) -> torch.Tensor:
    """The Number Token Loss of the logits ``softcap(hidden @ weight.T + bias)`` from the number
    rows of the output layer alone; add it to any cross-entropy: ``loss = ce + 0.3 * ntl``.

    Value and gradients equal ``number_token_loss(x, labels, vocab, ...)`` with
    ``x = c·tanh((hidden @ weight.T + bias)/c)`` (``x = hidden @ weight.T + bias`` without a soft
    cap) and every setting shared (see :func:`numtok.number_token_loss` for the definitions), and
    for ``reweigh`` the log-sum-exp ``lse = logsumexp(x, -1)`` handed in. Only the positions
    whose label is a number token are read: their hidden states, the N number rows of ``weight``
    and ``bias``, and their ``lse`` (or ``label_log_probs``); the (M, V) logits never exist.
    Finding those positions reads their count back from the device (one synchronisation), and
    the label and weight checks read one boolean each; ``capturable=True`` reads nothing back
    (every position's number logits, masked; see :func:`numtok.cross_entropy_with_ntl`).

    Args:
        hidden: (..., H) the hidden states the output layer reads (float32, bfloat16, float16
            or float64). The number logits are computed in float32 (float64 stays float64).
        weight: (V, H) the output layer's weight, the hidden states' dtype; V must equal
            ``vocab.vocab_size`` (a padded layer: build the vocabulary with its size). Tied
            embeddings are the same tensor.
        labels: (...) integer token ids in [0, V) or ``ignore_index``, the hidden states' shape
            without H.
        vocab: the :class:`~numtok.NumberVocab` of the tokenizer.
        bias: (V,) the output layer's bias, or None.
        lse: (...) the labels' shape: each position's log-sum-exp over the whole vocabulary of
            ``x`` (of the soft-capped logits when capped), as the cross-entropy beside the head
            computes it; read at number positions, only for ``reweigh``. It may carry a gradient
            (to the cross-entropy's kernel). With ``shift=True`` it is the logits' position, as
            ``hidden``, not the label's.
        label_log_probs: instead of ``lse``, (...) each position's log-probability of its label
            ``log softmax(x)[label]`` (0 elsewhere is fine), from which ``lse = x[label] -
            label_log_probs`` at number positions. With ``shift=True``, position ``t`` holds the
            log-probability of ``labels[t + 1]`` (TRL's ``log_probs`` padded with one 0 at the
            end).
        kind: as in :func:`numtok.number_token_loss` (``"number"``: the number-level loss).
        reweigh: as in :func:`numtok.number_token_loss`; needs ``lse`` or ``label_log_probs``
            (else a ``ValueError``).
        squash_factor: as in :func:`numtok.number_token_loss`.
        loss_weights: as in :func:`numtok.number_token_loss`.
        ignore_index: as in :func:`numtok.number_token_loss`.
        reduction: as in :func:`numtok.number_token_loss`.
        num_items_in_batch: as in :func:`numtok.number_token_loss`.
        shift: as in :func:`numtok.number_token_loss` (``hidden[..., t, :]`` against
            ``labels[..., t + 1]``).
        logit_softcap: ``c > 0`` when the model's logits are ``c·tanh(x/c)`` (Gemma 2's
            ``final_logit_softcapping``); None (default) for none.
        capturable: as in :func:`numtok.number_token_loss` (not with ``kind="number"``).

    Returns:
        A float32 scalar (float64 for float64 inputs), or the labels' shape for
        ``reduction="none"``. A batch without number positions gives 0, still connected to the
        graph.

    Example:
        >>> import torch
        >>> import torch.nn.functional as F
        >>> from numtok import NumberVocab, linear_number_token_loss, number_token_loss
        >>> vocab = NumberVocab.from_values({i: str(i) for i in range(10)}, vocab_size=12)
        >>> hidden, weight = torch.randn(2, 5, 8), torch.randn(12, 8)
        >>> labels = torch.tensor([[4, 11, 7, -100, 5]] * 2)
        >>> ntl = linear_number_token_loss(hidden, weight, labels, vocab, shift=True)
        >>> reference = number_token_loss(hidden @ weight.T, labels, vocab, shift=True)
        >>> bool(torch.isclose(ntl, reference))
        True
        >>> ce = F.cross_entropy((hidden @ weight.T)[:, :-1].reshape(-1, 12),
        ...                      labels[:, 1:].reshape(-1))  # any cross-entropy
        >>> loss = ce + 0.3 * ntl
    """
    spec = NumberHeadSpec.build(
        vocab,
        kind=kind,
        reweigh=reweigh,
        squash_factor=squash_factor,
        ignore_index=ignore_index,
        reduction=reduction,
        shift=shift,
        logit_softcap=logit_softcap,
        capturable=capturable,
    )
    device = hidden.device if isinstance(hidden, torch.Tensor) else None
    return number_head_loss(
        hidden,
        weight,
        labels,
        vocab,
        spec,
        vocab.tables(device),
        bias=bias,
        lse=lse,
        label_log_probs=label_log_probs,
        loss_weights=loss_weights,
        num_items_in_batch=num_items_in_batch,
    )


class LinearNumberTokenLoss(VocabBuffers):
    """``nn.Module`` form of :func:`linear_number_token_loss`: the settings are validated once
    here and the vocabulary's lookup tables are buffers (``.to(device)``, ``state_dict``).

    ``forward(hidden, weight, labels, *, bias=None, lse=None, label_log_probs=None,
    loss_weights=None, num_items_in_batch=None)`` returns NTL of the logits
    ``softcap(hidden @ weight.T + bias)``; add it to any cross-entropy.

    Example:
        >>> import torch
        >>> from numtok import LinearNumberTokenLoss, NumberVocab
        >>> vocab = NumberVocab.from_values({i: str(i) for i in range(10)}, vocab_size=12)
        >>> head = torch.nn.Linear(8, 12, bias=False)
        >>> ntl = LinearNumberTokenLoss(vocab, shift=True)
        >>> hidden, labels = torch.randn(2, 5, 8), torch.tensor([[4, 11, 7, -100, 5]] * 2)
        >>> ntl(hidden, head.weight, labels).shape
        torch.Size([])
    """

    def __init__(
        self,
        vocab: NumberVocab,
        *,
        kind: Kind = "was",
        reweigh: bool = False,
        squash_factor: float | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        shift: bool = False,
        logit_softcap: float | None = None,
        capturable: bool = False,
    ) -> None:
        super().__init__()
        self.vocab = vocab
        self.spec = NumberHeadSpec.build(
            vocab,
            kind=kind,
            reweigh=reweigh,
            squash_factor=squash_factor,
            ignore_index=ignore_index,
            reduction=reduction,
            shift=shift,
            logit_softcap=logit_softcap,
            capturable=capturable,
        )
        self.register_tables(vocab)

    def forward(
        self,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        labels: torch.Tensor,
        *,
        bias: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        label_log_probs: torch.Tensor | None = None,
        loss_weights: torch.Tensor | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor:
        return number_head_loss(
            hidden,
            weight,
            labels,
            self.vocab,
            self.spec,
            self.tables(),
            bias=bias,
            lse=lse,
            label_log_probs=label_log_probs,
            loss_weights=loss_weights,
            num_items_in_batch=num_items_in_batch,
        )

    def extra_repr(self) -> str:
        settings = self.spec.settings
        kind = self.spec.token.kind if self.spec.token is not None else NUMBER_LEVEL
        return (
            f"kind={kind!r}, reweigh={settings.reweigh}, ignore_index={settings.ignore_index}, "
            f"reduction={settings.reduction!r}, shift={settings.shift}, "
            f"logit_softcap={self.spec.logit_softcap}, number_tokens={self.ids.numel()}, "
            f"vocab_size={settings.vocab_size}"
        )
