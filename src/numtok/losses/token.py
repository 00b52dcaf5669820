"""Number Token Loss (NTL): :func:`number_token_loss`, the readable reference. Its ``nn.Module``
form is :class:`numtok.NumberTokenLoss` (:mod:`numtok.losses.module`); the maths every path shares
is in :mod:`numtok.maths.ntl`; CE + NTL in one pass is :mod:`numtok.losses.fused`.

Definitions (Zausinger et al., "Regress, Don't Guess", ICML 2025), at a position whose label ``y``
is a number token, with ``p = softmax(logits[number_token_ids])`` over the N number tokens only:

* ``kind="was"`` (NTL-WAS, the paper's default): the Wasserstein-1 distance between ``p`` and the
  one-hot label, ``Σ_j p_j · d(v_j, y)``.
* ``kind="mse" | "mae" | "huber"`` or a callable ``f(prediction, target)`` (NTL-Lp): the loss
  between the expected value ``ŷ = Σ_j p_j · v_j`` and ``y``.

Multi-digit tokens (``12``, ``Ġ123``: Llama-3, GPT-2, DeepSeek) are compared by *digit length*:
a label of length L is compared only with candidates of length L, on that length's scale
``v / 10**(L-1)`` (a 3-digit chunk's distances run 0-9.99, like a digit's), and mass on a number
token of another length costs the maximum distance ``D`` (the largest same-length distance). For
NTL-Lp the expected value is taken within the label's length, ``ŷ_L = Σ_{j∈L} q_j ṽ_j`` with ``q``
the softmax over those tokens, and the loss is ``P_L · f(ŷ_L, ỹ) + (1 - P_L) · D_f`` where
``P_L = Σ_{j∈L} p_j`` and ``D_f = max(|f(lo, hi)|, |f(hi, lo)|)`` over the scaled value range.
With single-digit number tokens only, ``P_L = 1`` and both flavours are exactly the plain
definitions above.

``kind="del" | "smmd" | "dist2"`` (or ``numtok.DEL(...)``, ``SMMD(...)``, ``DIST2(...)``) are the
number losses published since NTL — the digit entropy loss, smooth MMD alignment and the KL
divergence to a distance-smoothed target — defined (also for multi-digit tokens) in
:mod:`numtok.maths.kinds`; DEL and DIST2 weigh each position by its label's place in the number.

``kind="number"`` is the number-level loss of :mod:`numtok.losses.number_level` (whole numbers
assembled with their place values, sign and decimals, compared by smape), read with the same
:class:`NumberVocab`.
"""

from __future__ import annotations

import torch

from numtok._common.shift import shift_labels
from numtok._common.validation import (
    check_logits_and_labels,
    check_loss_weights,
    check_num_items,
)
from numtok.losses.number_level import number_level_loss
from numtok.maths.ntl import (
    NUMBER_LEVEL,
    Kind,
    LossSpec,
    check_number_level_capturable,
    check_number_level_squash,
)
from numtok.numbers.vocab import NumberTables, NumberVocab
from numtok.ops.number_logits import compute_dtype
from numtok.ops.rows import token_level_loss
from numtok.ops.sources import LogitsRows

__all__ = ["Kind", "number_token_loss", "number_token_loss_from_tables"]


def number_token_loss_from_tables(
    logits: torch.Tensor,
    labels: torch.Tensor,
    tables: NumberTables,
    spec: LossSpec,
    loss_weights: torch.Tensor | None,
    num_items_in_batch: torch.Tensor | int | None,
) -> torch.Tensor:
    """:func:`number_token_loss` with its settings already validated (``spec``) and the
    vocabulary's lookup tables already on the logits' device: what a module that holds the tables
    as buffers calls (:class:`~numtok.NumberTokenLoss`). Checks the tensors."""
    capturable = spec.capturable
    logits, labels = check_logits_and_labels(
        logits, labels, vocab_size=spec.vocab_size, ignore_index=spec.ignore_index,
        on_device=capturable,
    )  # fmt: skip
    loss_weights = check_loss_weights(loss_weights, labels, on_device=capturable)
    num_items = check_num_items(num_items_in_batch, labels.device if capturable else None)
    if spec.shift:
        labels, loss_weights = shift_labels(labels, loss_weights, spec.ignore_index)
    source = LogitsRows(logits, tables.ids, compute_dtype(logits))
    return token_level_loss(source, labels, loss_weights, tables, spec, num_items)


def number_token_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    vocab: NumberVocab,
    *,
    kind: Kind = "was",
    reweigh: bool = False,
    squash_factor: float | None = None,
    loss_weights: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    num_items_in_batch: torch.Tensor | int | None = None,
    shift: bool = False,
    capturable: bool = False,
) -> torch.Tensor:
    """Number Token Loss; add it to cross-entropy: ``loss = ce + 0.3 * ntl``.

    At a position whose label ``y`` is a number token, with ``p`` the softmax over the number-token
    logits only (see the module docstring for tokens of several digits):

    * ``kind="was"``: ``ℓ = Σ_j p_j · d(v_j, y)``, ``d = |v_j - y|`` (or its squashed form);
    * ``kind="mse"|"mae"|"huber"|callable``: ``ℓ = f(Σ_j p_j v_j, y)``;
    * ``kind="del"|"smmd"|"dist2"`` or their settings: the losses of :mod:`numtok.maths.kinds`;
    * ``kind="number"``: :func:`numtok.losses.number_level.number_level_loss` (smape) on whole
      numbers.

    Every other position (text labels, ``ignore_index``) contributes exactly 0.

    Args:
        logits: (..., V) float32, bfloat16, float16 or float64; V must equal ``vocab.vocab_size``.
            Only the N number-token columns are gathered and computed in float32 (float64 stays
            float64); the logits are never upcast or copied as a whole.
        labels: (...) integer token ids in [0, V) or ``ignore_index``.
        vocab: the :class:`NumberVocab` of the tokenizer.
        kind: ``"was"`` (NTL-WAS), ``"mse"``, ``"mae"``, ``"huber"`` (delta 1), ``"number"``
            (number level), a callable ``f(prediction, target) -> elementwise loss`` (NTL-Lp),
            or ``"del"``, ``"smmd"``, ``"dist2"`` with their authors' settings, or
            ``DEL(...)``, ``SMMD(...)``, ``DIST2(...)`` with others (:mod:`numtok.maths.kinds`; they
            take neither ``reweigh`` nor ``squash_factor``).
        reweigh: multiply by the full-vocabulary number mass ``m`` at the position and add
            ``1.01 · D · (1 - m)`` (ntloss's definition; ``D`` the largest cost), which penalises
            putting mass on text where a number is due. Off by default, as in the paper.
        squash_factor: ``s > 1`` rescales WAS distances so that the farthest wrong number costs
            ``s`` times the nearest wrong one: ``d' = 1 + (d - d_min)(s - 1)/(D - d_min)``.
        loss_weights: (...) non-negative weights, the labels' shape.
        ignore_index: label value that is skipped.
        reduction: ``"mean"`` (``Σ w ℓ / Σ w`` over number positions), ``"sum"`` or ``"none"``
            (``w · ℓ`` per position, the labels' shape, 0 at non-number positions).
        num_items_in_batch: replaces the mean's denominator, for exact gradient accumulation.
        shift: compare ``logits[..., t, :]`` with ``labels[..., t + 1]`` (causal LMs). The labels
            are shifted, not the logits: with ``"none"`` the result keeps the labels' shape and
            its last position is 0.
        capturable: compute without reading anything back from the device and in shapes that
            do not depend on the labels' values, for CUDA graphs and
            ``torch.compile(fullgraph=True)``: the label and weight checks become device-side
            asserts (on a GPU an error surfaces later, as a device-side assert), every
            position's number-token logits are read and the non-number ones masked (instead of
            gathering the number positions, whose count is read back), and a tensor
            ``num_items_in_batch`` must be on the labels' device. The same values; not with
            ``kind="number"``. Off by default: it has not run on a GPU yet.

    Returns:
        A float32 scalar (float64 for float64 logits), or the labels' shape for ``"none"``. A batch
        without number positions gives 0, still connected to the graph.

    Example:
        >>> import torch
        >>> from numtok import NumberVocab, number_token_loss
        >>> vocab = NumberVocab.from_values({i: str(i) for i in range(10)}, vocab_size=12)
        >>> logits = torch.full((1, 12), -30.0); logits[0, 4] = 30.0  # predicts "4"
        >>> float(number_token_loss(logits, torch.tensor([5]), vocab))  # label "5"
        1.0
    """
    if isinstance(kind, str) and kind == NUMBER_LEVEL:
        check_number_level_squash(squash_factor)
        check_number_level_capturable(capturable)
        return number_level_loss(
            logits,
            labels,
            vocab,
            reweigh=reweigh,
            loss_weights=loss_weights,
            ignore_index=ignore_index,
            reduction=reduction,
            num_items_in_batch=num_items_in_batch,
            shift=shift,
        )
    spec = LossSpec.build(
        vocab,
        kind=kind,
        reweigh=reweigh,
        squash_factor=squash_factor,
        ignore_index=ignore_index,
        reduction=reduction,
        shift=shift,
        capturable=capturable,
    )
    device = logits.device if isinstance(logits, torch.Tensor) else None
    return number_token_loss_from_tables(
        logits, labels, vocab.tables(device), spec, loss_weights, num_items_in_batch
    )
