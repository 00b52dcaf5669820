"""Cross-entropy plus the Number Token Loss in one pass over the logits.

``cross_entropy_with_ntl(logits, labels, vocab, ntl_weight=w, ...)`` computes exactly

    F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=..., reduction=...)
    + w * number_token_loss(logits, labels, vocab, ...)

(labels shifted first when ``shift=True``) at less than the cost of ``F.cross_entropy`` alone.
Both terms read a logits row only through its log-sum-exp, the label's logit and the N number-token
logits (see :mod:`numtok.ops.kernels.torch_rows`), and the logits' gradient is ``softmax · (per-row
coefficient)`` plus sparse fix-ups at the label and the number columns. At a number-labelled
position the number-token mass that ``reweigh`` needs comes free from the same log-sum-exp:
``log m = logsumexp(z) - lse``.

Two backends compute it (``impl=``, :mod:`numtok.ops.kernels.dispatch`): the torch row passes
(:mod:`numtok.ops.kernels.torch_rows`, the default on CPU) and Triton kernels
(:mod:`numtok.ops.kernels.triton_loss`, ``impl="triton"``: not yet run on a GPU, so opt-in). Off the
CPU, ``impl="auto"`` computes ``F.cross_entropy`` with NTL read from the logits' number columns
beside it (:mod:`numtok.ops.rows`), PyTorch's own kernels. On the torch path, when the
logits need a gradient, the forward pass computes it too
(:mod:`numtok.ops.kernels.gradient_in_forward`): the per-row coefficients come from
:func:`loss_and_row_gradients`'s formulas, the NTL part from the number logits before the pass,
and one pass over the logits turns each chunk into its rows of the gradient as soon as its
log-sum-exp is known; backward scales it (float16, ``reduction="none"`` and float16 autocast:
backward writes it, the upstream gradient known). Without a gradient one pass computes the
statistics and :func:`combine_terms` the values; under ``torch.compile`` (and for differentiable
``loss_weights``) autograd runs through :func:`combine_terms` and the statistics' custom op, whose
backward writes the gradient.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from numtok._common.reduction import reduce_losses
from numtok._common.shift import shift_labels
from numtok._common.validation import (
    check_bool,
    check_logits_and_labels,
    check_loss_weights,
    check_num_items,
)
from numtok.losses.settings import NUMBER_LEVEL_BESIDE_LOGITS, CEWithNTLSettings
from numtok.maths.ntl import (
    Kind,
    LossSpec,
)
from numtok.numbers.buffers import VocabBuffers
from numtok.numbers.vocab import NumberTables, NumberVocab
from numtok.ops.kernels.dispatch import (
    resolve_impl,
    triton_unsupported,
    unfused_by_default,
)
from numtok.ops.kernels.gradient_in_forward import (
    WriteGradient,
    gradient_in_backward,
    loss_with_gradient_in_backward,
    loss_with_gradient_in_forward,
)
from numtok.ops.kernels.torch_rows import (
    compute_row_statistics,
    gather_rows,
    row_statistics,
    scale_rows_in_place,
    statistics_and_gradient,
    write_row_gradient,
)
from numtok.ops.number_logits import compute_dtype
from numtok.ops.row_algebra import (
    CEWithNTLOutput,
    Rows,
    combine_terms,
    number_terms,
    prepare_rows,
    reduce_terms,
    reduction_scales,
    row_gradients,
    row_losses,
)
from numtok.ops.rows import token_level_loss
from numtok.ops.sources import LogitsRows

__all__ = [
    "CEWithNTLOutput",
    "CrossEntropyWithNTL",
    "cross_entropy_with_ntl",
    "cross_entropy_with_ntl_from_tables",
]


def _check_inplace(logits: torch.Tensor, vocab_size: int, weights_need_grad: bool) -> None:
    """``inplace_backward=True`` writes the gradient into the logits' memory through the view
    ``logits.view(-1, V)``: its rows must be distinct, contiguous memory, and nothing of ours may
    need the logits' values in backward."""
    if weights_need_grad:
        raise ValueError(
            "inplace_backward=True needs loss_weights that do not require grad: their gradient "
            "is computed in backward from the logits, which the in-place gradient overwrites; "
            "pass loss_weights.detach() or inplace_backward=False"
        )
    try:
        flat = logits.view(-1, vocab_size)
    except RuntimeError:
        flat = None
    if flat is None or flat.stride(1) != 1 or (flat.shape[0] > 1 and flat.stride(0) < vocab_size):
        raise ValueError(
            "inplace_backward=True writes the gradient into the logits' own memory, which needs "
            "rows of contiguous, non-overlapping memory (logits.view(-1, V) with strides "
            f"(>= V, 1)); got logits of shape {tuple(logits.shape)} and strides "
            f"{tuple(logits.stride())}. A slice such as logits[:, :-1] is not: pass the full "
            "logits with shift=True, or inplace_backward=False"
        )


def _loss_and_gradient_into(
    rows: Rows,
    tables: NumberTables,
    spec: LossSpec,
    ntl_weight: float,
    num_items: torch.Tensor | int | None,
    shape: torch.Size,
    flat: torch.Tensor,
    gradient: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The torch backend's pass for :func:`~numtok.ops.kernels.gradient_in_forward.
    loss_with_gradient_in_forward`: ``(loss, ce, ntl)`` of the logits ``flat`` (M, V), with their
    gradient for a unit upstream gradient written into ``gradient`` (M, V), which may be ``flat``.
    The NTL side of every row comes from its number logits, gathered before the pass; the pass
    turns each chunk into its rows of the gradient as soon as its log-sum-exp is known."""
    dtype = compute_dtype(flat)
    softcap = spec.logit_softcap
    target_logit, number_logits = gather_rows(flat, rows.target_ids, tables.ids, dtype, softcap)
    scales = reduction_scales(rows, spec, num_items)
    terms = number_terms(number_logits, rows, tables, spec, ntl_weight, scales)

    # Without reweigh the pieces do not depend on the log-sum-exp: computed once, sliced.
    pieces = None if spec.reweigh else row_gradients(None, terms, rows, spec, scales)

    def chunk_gradients(
        index: slice, lse: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if pieces is None:
            return row_gradients(lse, terms.take(index), rows.take(index), spec, scales)
        return pieces[0][index], pieces[1][index], pieces[2][index]

    lse = statistics_and_gradient(
        flat, gradient, rows.target_ids, tables.ids, dtype, chunk_gradients, softcap
    )
    ce, ntl = row_losses(lse, target_logit, terms.base, terms.number_lse, rows, spec)
    ce, ntl = reduce_terms(ce, ntl, rows, spec, num_items, shape)
    return ce + ntl_weight * ntl, ce, ntl


def _loss_then_gradient(
    rows: Rows,
    tables: NumberTables,
    spec: LossSpec,
    ntl_weight: float,
    num_items: torch.Tensor | int | None,
    shape: torch.Size,
    flat: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, WriteGradient]:
    """The torch backend's pass for :func:`~numtok.ops.kernels.gradient_in_forward.
    loss_with_gradient_in_backward` (where :func:`~numtok.ops.kernels.gradient_in_forward.
    gradient_in_backward` chooses it: float16 logits, ``reduction="none"``, float16 autocast):
    ``(loss, ce, ntl)`` of the logits ``flat`` (M, V) in one read, and the function that writes
    their gradient in backward, where the upstream gradient ``u`` (one value, or one per row)
    multiplies the pieces ``∂L/∂lse``, ``∂L/∂x[y]`` and ``∂L/∂z`` before
    :func:`~numtok.ops.kernels.torch_rows.write_row_gradient` rounds the gradient once. The pieces
    come again from the label's and the number logits (a gather of N + 1 columns), not kept
    from forward (an (M, N) buffer)."""
    dtype = compute_dtype(flat)
    softcap = spec.logit_softcap
    lse, target_logit, number_logits = compute_row_statistics(
        flat, rows.target_ids, tables.ids, dtype, softcap
    )
    scales = reduction_scales(rows, spec, num_items)
    terms = number_terms(number_logits, rows, tables, spec, ntl_weight, scales)
    ce, ntl = row_losses(lse, target_logit, terms.base, terms.number_lse, rows, spec)
    ce, ntl = reduce_terms(ce, ntl, rows, spec, num_items, shape)

    def write(logits: torch.Tensor, gradient: torch.Tensor, upstream: torch.Tensor) -> None:
        _, number_logits = gather_rows(logits, rows.target_ids, tables.ids, dtype, softcap)
        terms = number_terms(number_logits, rows, tables, spec, ntl_weight, scales)
        grad_lse, grad_target, grad_numbers = row_gradients(lse, terms, rows, spec, scales)
        per_row = upstream.reshape(-1).to(dtype)  # (1,) or (M,)
        write_row_gradient(
            gradient, logits, lse, rows.target_ids, tables.ids, grad_lse * per_row,
            grad_target * per_row, grad_numbers * per_row[:, None], softcap=softcap,
        )  # fmt: skip

    return ce + ntl_weight * ntl, ce, ntl, write


def cross_entropy_with_ntl_from_tables(
    logits: torch.Tensor,
    labels: torch.Tensor,
    tables: NumberTables,
    spec: LossSpec,
    ntl_weight: float,
    loss_weights: torch.Tensor | None,
    num_items_in_batch: torch.Tensor | int | None,
    inplace_backward: bool = False,
    impl: str = "auto",
) -> CEWithNTLOutput:
    """:func:`cross_entropy_with_ntl` with its settings already validated (``spec``,
    ``ntl_weight``, ``inplace_backward``, ``impl``) and the vocabulary's lookup tables already on
    the logits' device: what the module (:class:`~numtok.NumberTokenLoss`) and the Trainer
    adapter call. Checks the tensors and chooses the backend."""
    if unfused_by_default(impl, _device_of(logits)):
        return _cross_entropy_beside_the_number_head(
            logits, labels, tables, spec, ntl_weight, loss_weights, num_items_in_batch
        )
    weights_need_grad = isinstance(loss_weights, torch.Tensor) and loss_weights.requires_grad
    backend = resolve_impl(
        impl, _device_of(logits), triton_unsupported(spec, weights_need_grad=weights_need_grad)
    )
    # The Triton path checks label ids and weights on the GPU (no read-back to the host).
    check_values = backend == "torch" or logits.device.type != "cuda"
    capturable = spec.capturable
    logits, labels = check_logits_and_labels(
        logits,
        labels,
        vocab_size=spec.vocab_size,
        ignore_index=spec.ignore_index,
        check_values=check_values,
        on_device=capturable,
    )
    loss_weights = check_loss_weights(
        loss_weights, labels, check_values=check_values, on_device=capturable
    )
    num_items = check_num_items(num_items_in_batch, labels.device if capturable else None)
    needs_grad = torch.is_grad_enabled() and logits.requires_grad
    if inplace_backward and needs_grad:
        _check_inplace(logits, spec.vocab_size, weights_need_grad)
    if backend == "triton":
        from numtok.ops.kernels import triton_loss

        loss, ce, ntl = triton_loss.cross_entropy_with_ntl(
            logits, labels, loss_weights, tables, spec, ntl_weight, num_items,
            needs_grad=needs_grad, inplace=inplace_backward,
        )  # fmt: skip
        return CEWithNTLOutput(loss=loss, ce=ce, ntl=ntl)
    dtype = compute_dtype(logits)
    rows, shape = prepare_rows(labels, loss_weights, tables, spec, dtype)
    # Under torch.compile, and for loss weights that take a gradient themselves, autograd goes
    # through the row statistics: two opaque custom ops, the statistics in forward and the
    # logits' gradient in backward (one more read of the logits, into a fresh buffer).
    recompute = torch.compiler.is_compiling() or weights_need_grad
    if needs_grad and not recompute and gradient_in_backward(logits, spec.reduction):
        then_write = functools.partial(
            _loss_then_gradient, rows, tables, spec, ntl_weight, num_items, shape
        )
        loss, ce, ntl = loss_with_gradient_in_backward(
            logits, spec.vocab_size, inplace_backward, then_write
        )
        return CEWithNTLOutput(loss=loss, ce=ce, ntl=ntl)
    if needs_grad and not recompute:
        compute = functools.partial(
            _loss_and_gradient_into, rows, tables, spec, ntl_weight, num_items, shape
        )
        loss, ce, ntl = loss_with_gradient_in_forward(
            logits, spec.vocab_size, inplace_backward, compute, scale_rows_in_place
        )
        return CEWithNTLOutput(loss=loss, ce=ce, ntl=ntl)
    statistics = row_statistics if needs_grad else compute_row_statistics
    lse, target_logit, number_logits = statistics(
        logits.reshape(-1, spec.vocab_size), rows.target_ids, tables.ids, dtype, spec.logit_softcap
    )
    return combine_terms(
        lse, target_logit, number_logits, rows, tables, spec, ntl_weight, num_items, shape
    )


def _cross_entropy_beside_the_number_head(
    logits: torch.Tensor,
    labels: torch.Tensor,
    tables: NumberTables,
    spec: LossSpec,
    ntl_weight: float,
    loss_weights: torch.Tensor | None,
    num_items_in_batch: torch.Tensor | int | None,
) -> CEWithNTLOutput:
    """``F.cross_entropy`` of the (soft-capped) logits plus ``ntl_weight`` times NTL read from
    their number columns at the number-labelled positions (:mod:`numtok.ops.rows`): PyTorch's
    own kernels where numtok's fused passes have not been measured to be faster
    (:func:`~numtok.ops.kernels.dispatch.unfused_by_default`). The same values as the fused passes;
    autograd's memory (the cross-entropy's (M, V) gradient buffers, and a capped copy of the
    logits with a soft cap)."""
    capturable = spec.capturable
    logits, labels = check_logits_and_labels(
        logits, labels, vocab_size=spec.vocab_size, ignore_index=spec.ignore_index,
        on_device=capturable,
    )  # fmt: skip
    loss_weights = check_loss_weights(loss_weights, labels, on_device=capturable)
    num_items = check_num_items(num_items_in_batch, labels.device if capturable else None)
    if spec.shift:
        labels, loss_weights = shift_labels(labels, loss_weights, spec.ignore_index)
    dtype = compute_dtype(logits)
    cap = spec.logit_softcap
    capped = logits if cap is None else cap * torch.tanh(logits / cap)
    flat_labels = labels.reshape(-1)  # (M,)
    # Per position, summed in the compute dtype: a bfloat16 sum would round the reported value.
    ce_rows = F.cross_entropy(
        capped.reshape(-1, spec.vocab_size), flat_labels, ignore_index=spec.ignore_index,
        reduction="none",
    ).to(dtype)  # fmt: skip
    is_target = flat_labels != spec.ignore_index
    ce = reduce_losses(ce_rows, labels.shape, spec.reduction, num_items, is_target.sum())
    source = LogitsRows(capped, tables.ids, dtype)
    ntl = token_level_loss(source, labels, loss_weights, tables, spec, num_items)
    return CEWithNTLOutput(loss=ce + ntl_weight * ntl, ce=ce.detach(), ntl=ntl.detach())


def _device_of(tensor: object) -> torch.device:
    """The tensor's device (the CPU for what is not a tensor: the checks then reject it)."""
    return tensor.device if isinstance(tensor, torch.Tensor) else torch.device("cpu")


def cross_entropy_with_ntl(
    logits: torch.Tensor,
    labels: torch.Tensor,
    vocab: NumberVocab,
    *,
    ntl_weight: float = 0.3,
    kind: Kind = "was",
    reweigh: bool = False,
    squash_factor: float | None = None,
    loss_weights: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    num_items_in_batch: torch.Tensor | int | None = None,
    shift: bool = False,
    inplace_backward: bool = False,
    logit_softcap: float | None = None,
    impl: str = "auto",
    capturable: bool = False,
) -> CEWithNTLOutput:
    """Cross-entropy plus ``ntl_weight`` times the Number Token Loss, fused.

    Exactly ``F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=...,
    reduction=...) + ntl_weight * number_token_loss(logits, labels, vocab, ...)`` with every
    setting shared, except that a ``"mean"`` over a batch with no target at all is 0 (PyTorch
    gives NaN). Each term keeps its own ``"mean"`` denominator: the non-ignored positions for
    cross-entropy, ``Σ loss_weights`` over number positions for NTL; ``num_items_in_batch``
    replaces both. ``loss_weights`` weigh the NTL term only, as in ``number_token_loss``.

    Cost: when the logits need a gradient, forward reads them once, in cache-sized row chunks,
    and while a chunk is in cache turns it into its rows of the logits' gradient for a unit
    upstream gradient (the scheme of Liger-Kernel's cross-entropy): one read and one write of
    (M, V) in all, and the only (M, V) buffer is that gradient, in the logits' dtype. Backward
    only multiplies it by the upstream gradient (nothing to do for ``loss.backward()`` on CPU)
    and hands it out, so it can run once per call (``retain_graph=True`` and a second backward
    raise). Without a gradient (evaluation, ``torch.no_grad()``), forward reads the logits once
    and writes nothing of their size. bfloat16/float16 logits are upcast one chunk at a time into
    a reused float32 buffer, never as a whole, and the gradient is rounded to their dtype once
    (bfloat16: once more when a scalar loss's upstream gradient is not 1). Where forward knows
    that the upstream gradient will not be 1 (:func:`~numtok.ops.kernels.gradient_in_forward.
    gradient_in_backward`: ``reduction="none"``, float16 autocast's loss scale) and for float16
    logits, whose range ends where a unit-upstream gradient's small entries lie (2^-24), the
    logits are read once more instead: the gradient is written in backward, with the upstream
    gradient known, rounded once, into a fresh buffer or with ``inplace_backward`` into the
    logits. Under ``torch.compile``, and when
    ``loss_weights`` require grad, the loss runs as two opaque custom ops instead, the statistics
    in forward and the gradient in backward (one more read of the logits). The row passes
    never synchronise with the host; the argument checks do, once each: the label range check
    (and, when given, the check that ``loss_weights >= 0``) reads one boolean back from the
    device, and NTL beside ``F.cross_entropy`` (the default off the CPU) reads the count of
    number positions back; with ``capturable=True`` none of them does.

    Backends (``impl``): ``"auto"`` (default) runs the torch row passes described above on CPU,
    and on every other device ``F.cross_entropy`` of the logits with NTL read from their number
    columns at the number-labelled positions beside it (PyTorch's kernels and autograd's
    memory: ``inplace_backward`` has no effect there); ``$NUMTOK_IMPL`` says what ``"auto"``
    means. ``"torch"`` takes the row passes on any device; ``"triton"`` the Triton kernels (one
    program per row: one read and one write of the logits in a training step, nothing at all in
    backward for ``loss.backward()``; the label and weight checks become device-side asserts),
    which have not run on a GPU yet; on CPU tensors they need ``TRITON_INTERPRET=1`` (Triton's
    interpreter, for tests). A callable ``kind`` and ``loss_weights`` that require grad are
    refused by ``"triton"``. Every path gives the same values and gradients (tested against
    the float64 reference).

    ``inplace_backward=True`` writes that gradient into the logits' own memory: no (M, V)
    buffer at all. The logits' values are gone after the call, so it is for logits that nothing
    reads afterwards: compute metrics, argmax or other losses that need their values *before*
    the call. What the function can detect, it refuses: logits whose rows are not distinct
    contiguous memory (a slice such as ``logits[:, :-1]``: use ``shift=True`` on the full logits;
    an ``expand``) and ``loss_weights`` that require grad (their gradient needs the logits in
    backward) raise a ``ValueError``; an autograd node that saved the logits (or a view
    of their memory) for its own backward raises PyTorch's "modified by an inplace operation"
    error in backward, because the call bumps the logits' version counter. Other terms
    differentiable in the logits that do not save them (``logits.sum()``, a soft cap
    ``c·tanh(x/c)`` before the call) still get exact gradients. A plain read of the logits after
    the call cannot be detected: it sees the gradient. Without a gradient to compute, and where
    ``torch.compile`` traces the call (see above), the logits are left untouched. A leaf tensor's
    ``.grad`` shares its memory afterwards.

    Args:
        logits: (..., V) float32, bfloat16, float16 or float64; V must equal ``vocab.vocab_size``.
        labels: (...) integer token ids in [0, V) or ``ignore_index``.
        vocab: the :class:`~numtok.NumberVocab` of the tokenizer.
        ntl_weight: the factor ``w >= 0`` of the NTL term (the paper uses 0.3).
        kind: as in :func:`~numtok.number_token_loss`, but for ``"number"``, which has no fused
            pass (a ``ValueError`` names what computes it).
        reweigh: as in :func:`~numtok.number_token_loss`.
        squash_factor: as in :func:`~numtok.number_token_loss`.
        loss_weights: as in :func:`~numtok.number_token_loss`.
        ignore_index: as in :func:`~numtok.number_token_loss`, for both terms.
        reduction: as in :func:`~numtok.number_token_loss`, for both terms.
        num_items_in_batch: as in :func:`~numtok.number_token_loss`, for both terms.
        shift: as in :func:`~numtok.number_token_loss`, for both terms.
        inplace_backward: write the logits' gradient into the logits' memory (see above).
        logit_softcap: ``c > 0`` to compute both terms of ``c·tanh(logits/c)`` instead of the
            logits (Gemma 2's ``final_logit_softcapping``), with the cap's slope in the
            gradient, without building the capped logits; None (default) for the logits as they
            are.
        impl: ``"auto"``, ``"torch"`` or ``"triton"``: the backend (see above).
        capturable: compute without reading anything back from the device, in shapes that do
            not depend on the labels' values: for CUDA graphs (``torch.cuda.graph``,
            ``torch.compile(mode="reduce-overhead")``) and ``torch.compile(fullgraph=True)``.
            The label and weight checks become device-side asserts (on a GPU an error surfaces
            at a later synchronisation, as a device-side assert), NTL beside ``F.cross_entropy``
            (the default off the CPU) reads every position's number-token logits and masks the
            others instead of gathering the number positions (whose count is read back), and
            a tensor ``num_items_in_batch`` must be on the labels' device (an int is fine). The
            same values. Off by default: it has not run on a GPU yet (``benchmarks/gpu.sh``
            counts each path's synchronisations). ``impl="triton"`` on CUDA reads nothing back
            either way.

    Returns:
        :class:`CEWithNTLOutput` with ``loss`` (differentiable) and the detached ``ce`` and
        ``ntl``: float32 scalars (float64 for float64 logits), or the labels' shape for
        ``reduction="none"``.

    Example:
        >>> import torch
        >>> import torch.nn.functional as F
        >>> from numtok import NumberVocab, number_token_loss
        >>> from numtok.losses.fused import cross_entropy_with_ntl
        >>> vocab = NumberVocab.from_values({i: str(i) for i in range(10)}, vocab_size=12)
        >>> logits, labels = torch.randn(2, 5, 12), torch.tensor([[4, 11, 7, -100, 5]] * 2)
        >>> out = cross_entropy_with_ntl(logits, labels, vocab, ntl_weight=0.3)
        >>> reference = F.cross_entropy(logits.reshape(-1, 12), labels.reshape(-1))
        >>> reference = reference + 0.3 * number_token_loss(logits, labels, vocab)
        >>> bool(torch.isclose(out.loss, reference))
        True
    """
    settings = CEWithNTLSettings.build(
        "cross_entropy_with_ntl",
        NUMBER_LEVEL_BESIDE_LOGITS,
        vocab,
        ntl_weight=ntl_weight,
        kind=kind,
        reweigh=reweigh,
        squash_factor=squash_factor,
        ignore_index=ignore_index,
        reduction=reduction,
        shift=shift,
        logit_softcap=logit_softcap,
        impl=impl,
        capturable=capturable,
    )
    inplace = check_bool("inplace_backward", inplace_backward)
    device = logits.device if isinstance(logits, torch.Tensor) else None
    return cross_entropy_with_ntl_from_tables(
        logits,
        labels,
        vocab.tables(device),
        settings.spec,
        settings.ntl_weight,
        loss_weights,
        num_items_in_batch,
        inplace,
        settings.impl,
    )


class CrossEntropyWithNTL(VocabBuffers):
    """``nn.Module`` form of :func:`cross_entropy_with_ntl`, for a training loop that holds its
    loss as a module: the settings are checked once here and the vocabulary's lookup tables are
    buffers (``.to(device)``, ``state_dict`` and ``torch.compile`` work as for any module; the
    value table stays float64 under ``.to(dtype)``).

    ``forward(logits (..., V), labels (...), *, loss_weights=None, num_items_in_batch=None)``
    returns the :class:`~numtok.CEWithNTLOutput` of :func:`cross_entropy_with_ntl` with the
    module's settings: ``.loss = F.cross_entropy(...) + ntl_weight · number_token_loss(...)`` to
    back-propagate, and the detached terms ``.ce`` and ``.ntl`` to log. The settings are those of
    the function (``kind="number"`` is refused as there).

    Example:
        >>> import torch
        >>> from numtok import CrossEntropyWithNTL, NumberVocab, cross_entropy_with_ntl
        >>> vocab = NumberVocab.from_values({i: str(i) for i in range(10)}, vocab_size=12)
        >>> logits, labels = torch.randn(2, 5, 12), torch.tensor([[4, 11, 7, -100, 5]] * 2)
        >>> loss_fn = CrossEntropyWithNTL(vocab, ntl_weight=0.3, shift=True)
        >>> out = loss_fn(logits, labels)
        >>> reference = cross_entropy_with_ntl(logits, labels, vocab, ntl_weight=0.3, shift=True)
        >>> bool(out.loss == reference.loss)
        True
    """

    def __init__(
        self,
        vocab: NumberVocab,
        *,
        ntl_weight: float = 0.3,
        kind: Kind = "was",
        reweigh: bool = False,
        squash_factor: float | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        shift: bool = False,
        inplace_backward: bool = False,
        logit_softcap: float | None = None,
        impl: str = "auto",
        capturable: bool = False,
    ) -> None:
        super().__init__()
        self.settings = CEWithNTLSettings.build(
            "CrossEntropyWithNTL",
            NUMBER_LEVEL_BESIDE_LOGITS,
            vocab,
            ntl_weight=ntl_weight,
            kind=kind,
            reweigh=reweigh,
            squash_factor=squash_factor,
            ignore_index=ignore_index,
            reduction=reduction,
            shift=shift,
            logit_softcap=logit_softcap,
            impl=impl,
            capturable=capturable,
        )
        self.inplace_backward = check_bool("inplace_backward", inplace_backward)
        self.register_tables(vocab)

    def forward(
        self,
        logits: torch.Tensor,
        labels: torch.Tensor,
        *,
        loss_weights: torch.Tensor | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> CEWithNTLOutput:
        return cross_entropy_with_ntl_from_tables(
            logits,
            labels,
            self.tables(),
            self.settings.spec,
            self.settings.ntl_weight,
            loss_weights,
            num_items_in_batch,
            self.inplace_backward,
            self.settings.impl,
        )

    def extra_repr(self) -> str:
        return self.settings.describe(number_tokens=self.ids.numel()) + (
            ", inplace_backward=True" if self.inplace_backward else ""
        )
