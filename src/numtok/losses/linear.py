"""Cross-entropy plus the Number Token Loss straight from the hidden states: the (M, V) logits of
the output layer never exist.

``linear_cross_entropy_with_ntl(hidden, weight, labels, vocab, bias=b, ...)`` has the value and the
gradients (for ``hidden``, ``weight`` and ``bias``) of ``cross_entropy_with_ntl(hidden @ weight.T
+ b, labels, vocab, ...)``. Both passes go over chunks of ``c`` tokens, compute each chunk's
logits (c, V) into one reused buffer and keep only what the loss reads of them: the row
statistics (log-sum-exp, the label's logit, the N number-token logits; see
:mod:`numtok.ops.kernels.torch_rows`). Which pass runs:

* **gradient in the forward pass** (:mod:`numtok.ops.linear_in_forward`, Liger-Kernel's scheme):
  when autograd records, a gradient is wanted and the loss is a scalar (``"mean"``, ``"sum"``).
  Each chunk's logits are turned into their gradient as soon as their statistics are known and
  multiplied out at once; backward only scales the stored gradients. Three (M, H, V) matrix
  products, as for the materialised logits.
* **recompute in backward** (:mod:`numtok.ops.linear_recompute`): for ``reduction="none"`` (the
  upstream gradient differs per position, so the weight's gradient cannot be summed before it is
  known), for float16 (whose gradient entries, rounded before a loss scale multiplies them,
  would flush to 0), for differentiable ``loss_weights``, under ``torch.compile`` (two custom
  ops in the graph) and under saved-tensor hooks. Forward keeps the statistics; backward
  recomputes the logits block by block of vocabulary columns. Four products.
* **statistics only**: without gradients (evaluation, ``torch.no_grad()``), one product.

Each chunk's row pass runs on the torch row passes (``impl="auto"``, on every device) or, with
``impl="triton"``, the Triton row kernel, not yet run on a GPU (it serves the
gradient-in-forward pass and evaluation; the recompute pass stays on torch).

Peak memory: one (c, V) buffer plus the gradients themselves (on a GPU, for bfloat16/float16
weights, the weight's gradient summed in a float32 buffer: 4 bytes a weight more), instead of
several (M, V) buffers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from numtok._common.validation import (
    check_linear_inputs,
    check_logits_and_labels,
    check_loss_weights,
    check_num_items,
)
from numtok.losses.settings import NUMBER_LEVEL_BESIDE_HIDDEN, CEWithNTLSettings
from numtok.maths.ntl import Kind, LossSpec
from numtok.numbers.buffers import VocabBuffers
from numtok.numbers.vocab import NumberTables, NumberVocab
from numtok.ops.kernels.dispatch import resolve_impl, triton_unsupported
from numtok.ops.kernels.gradient_in_forward import gradient_waits_for_upstream
from numtok.ops.linear_in_forward import (
    ChunkRows,
    RowTerms,
    TorchChunkRows,
    linear_loss_in_forward,
)
from numtok.ops.linear_recompute import linear_row_statistics
from numtok.ops.number_logits import compute_dtype
from numtok.ops.row_algebra import CEWithNTLOutput, combine_terms, prepare_rows

__all__ = [
    "LinearCrossEntropyWithNTL",
    "linear_cross_entropy_with_ntl",
    "linear_cross_entropy_with_ntl_from_tables",
    "linear_loss_and_row_terms",
]

# Below about 256 rows a (rows, H) @ (H, V) product is limited by streaming the (V, H) weight, not
# by arithmetic (measured on CPU: 67 GFLOP/s at 32 rows, 125-150 at 256-1024).
_MIN_CHUNK_ROWS = 256


def default_chunk_size(num_tokens: int, hidden_size: int) -> int:
    """Rows per chunk: H, so that a chunk's logits (H, V) take as much memory as the weight
    (V, H) and its gradient, which exist anyway; at least 256 rows, so that the matrix products
    stay compute-bound (on CPU, a (4096, 1024) @ (1024, 131072) product in chunks of 256 rows
    took 16% longer than in chunks of 1024); and at most M."""
    return max(1, min(num_tokens, max(_MIN_CHUNK_ROWS, hidden_size)))


def _gradients_in_forward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    loss_weights: torch.Tensor | None,
    spec: LossSpec,
) -> bool:
    """Compute the gradients in the forward pass (three matrix products instead of four) when
    autograd records, a gradient is wanted and the loss is a scalar; ``reduction="none"`` (a
    gradient per position, known only in backward), differentiable ``loss_weights``,
    ``torch.compile`` (whose graph holds the recompute pass's two custom ops, as the fused path
    does) and saved-tensor hooks take the pass that recomputes the logits in backward, and
    evaluation (no gradient) pays for neither."""
    wanted = any(t is not None and t.requires_grad for t in (hidden, weight, bias))
    return (
        wanted
        and torch.is_grad_enabled()
        and spec.reduction != "none"
        and not (loss_weights is not None and loss_weights.requires_grad)
        and not torch.compiler.is_compiling()
        and not _saved_tensors_hooks_active()
    )


def _saved_tensors_hooks_active() -> bool:
    """Whether saved-tensor hooks are installed (``torch.autograd.graph.save_on_cpu``, activation
    offloading): the gradient-in-forward pass differentiates NTL with ``torch.func.vjp``, which
    refuses to run under them, so the recompute pass serves those calls. (PyTorch has no public
    query; the private one exists since torch 2.8. Before, a probe: a one-element product saves
    its input through the hooks, if any, and a saved tensor whose hooks are set refuses a second
    pair.)"""
    if _top_saved_tensors_hooks is not None:
        return bool(_top_saved_tensors_hooks(False) is not None)
    probe = torch.zeros(1, requires_grad=True)
    with torch.enable_grad():
        grad_fn: Any = (probe * probe).grad_fn
    try:
        grad_fn._raw_saved_self.register_hooks(_identity, _identity)
    except RuntimeError:
        return True
    return False


def _identity(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


# torch 2.8 and later; None before (tests/test_linear.py sets it to None to run the probe).
_top_saved_tensors_hooks: Callable[[bool], object] | None = getattr(
    torch._C._autograd, "_top_saved_tensors_default_hooks", None
)


def _check_chunk_size(chunk_size: object) -> int | None:
    if chunk_size is None:
        return None
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        raise TypeError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size}")
    return chunk_size


def linear_cross_entropy_with_ntl(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    vocab: NumberVocab,
    *,
    bias: torch.Tensor | None = None,
    chunk_size: int | None = None,
    ntl_weight: float = 0.3,
    kind: Kind = "was",
    reweigh: bool = False,
    squash_factor: float | None = None,
    loss_weights: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    num_items_in_batch: torch.Tensor | int | None = None,
    shift: bool = False,
    logit_softcap: float | None = None,
    impl: str = "auto",
    capturable: bool = False,
) -> CEWithNTLOutput:
    """Cross-entropy plus ``ntl_weight`` times the Number Token Loss of the logits
    ``hidden @ weight.T + bias``, without materialising them.

    Value and gradients (for ``hidden``, ``weight`` and ``bias``) equal
    ``cross_entropy_with_ntl(hidden @ weight.T + bias, labels, vocab, ...)``; see
    :func:`~numtok.losses.fused.cross_entropy_with_ntl` for the exact formula and the settings.

    Memory: one buffer of ``chunk_size·V`` logits, the row statistics (M + M·N numbers) and the
    gradients themselves, instead of the (M, V) logits and the buffers of their backward. Time:
    the three (M, H, V) matrix products of the materialised path when the gradients are computed
    in the forward pass (scalar reductions), four for ``reduction="none"`` (backward recomputes
    the logits), one without gradients; see the module docstring. For bfloat16/float16 the
    weight's gradient is summed over the ``⌈M / chunk_size⌉`` chunks in float32 on a GPU and in
    its own dtype on CPU (gradient in forward), or written once per block of columns
    (recompute). As in ``cross_entropy_with_ntl``, only the argument checks synchronise with the
    host, and on the Triton path not even those.

    Backends (``impl``, as in :func:`~numtok.losses.fused.cross_entropy_with_ntl`): ``"auto"`` runs
    the torch row passes on every device (each chunk's logits from one matrix product, cuBLAS on a
    GPU); with ``"triton"`` the Triton row kernel (not yet run on a GPU) turns them into their
    gradient in place (training, scalar reductions) or reads the loss off them (evaluation);
    the pass that recomputes the logits in backward (``reduction="none"`` with a gradient,
    ``torch.compile``, saved-tensor hooks, differentiable ``loss_weights``) and a callable
    ``kind`` need the torch row passes, and ``impl="triton"`` refuses them.

    Args:
        hidden: (..., H) the hidden states before the output layer; float dtype.
        weight: (V, H) the output layer's weight, same dtype; V must equal ``vocab.vocab_size``.
        labels: (...) integer token ids in [0, V) or ``ignore_index``, the hidden states' shape
            without H.
        vocab: the :class:`~numtok.NumberVocab` of the tokenizer.
        bias: (V,) the output layer's bias, or None.
        chunk_size: tokens per forward chunk; backward blocks hold as many logits
            (``chunk_size·V / M`` columns). Default: H tokens, so that the logits buffer is as
            large as the weight; at least 256 (the matrix products stay compute-bound) and at
            most all of them.
        ntl_weight: as in :func:`~numtok.cross_entropy_with_ntl`.
        kind: as in :func:`~numtok.cross_entropy_with_ntl`.
        reweigh: as in :func:`~numtok.cross_entropy_with_ntl`.
        squash_factor: as in :func:`~numtok.cross_entropy_with_ntl`.
        loss_weights: as in :func:`~numtok.cross_entropy_with_ntl`.
        ignore_index: as in :func:`~numtok.cross_entropy_with_ntl`.
        reduction: as in :func:`~numtok.cross_entropy_with_ntl`.
        num_items_in_batch: as in :func:`~numtok.cross_entropy_with_ntl`.
        shift: as in :func:`~numtok.cross_entropy_with_ntl`.
        logit_softcap: as in :func:`~numtok.cross_entropy_with_ntl`, applied to
            ``hidden @ weight.T + bias``.
        impl: ``"auto"``, ``"torch"`` or ``"triton"``: the backend of the row pass (see above).
        capturable: as in :func:`~numtok.losses.fused.cross_entropy_with_ntl`: the label and weight
            checks become device-side asserts, and a tensor ``num_items_in_batch`` must be on
            the labels' device (the chunked passes have static shapes either way).

    Returns:
        :class:`~numtok.losses.fused.CEWithNTLOutput` (``loss``, detached ``ce`` and ``ntl``).

    Example:
        >>> import torch
        >>> from numtok import NumberVocab
        >>> from numtok.losses.fused import cross_entropy_with_ntl
        >>> from numtok.losses.linear import linear_cross_entropy_with_ntl
        >>> vocab = NumberVocab.from_values({i: str(i) for i in range(10)}, vocab_size=12)
        >>> hidden, weight = torch.randn(2, 5, 8), torch.randn(12, 8)
        >>> labels = torch.tensor([[4, 11, 7, -100, 5]] * 2)
        >>> out = linear_cross_entropy_with_ntl(hidden, weight, labels, vocab, chunk_size=3)
        >>> reference = cross_entropy_with_ntl(hidden @ weight.T, labels, vocab)
        >>> bool(torch.isclose(out.loss, reference.loss))
        True
    """
    settings = CEWithNTLSettings.build(
        "linear_cross_entropy_with_ntl",
        NUMBER_LEVEL_BESIDE_HIDDEN,
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
    device = hidden.device if isinstance(hidden, torch.Tensor) else None
    return linear_cross_entropy_with_ntl_from_tables(
        hidden,
        weight,
        labels,
        vocab.tables(device),
        settings.spec,
        settings.ntl_weight,
        loss_weights,
        num_items_in_batch,
        bias=bias,
        chunk_size=chunk_size,
        impl=settings.impl,
    )


class LinearCrossEntropyWithNTL(VocabBuffers):
    """``nn.Module`` form of :func:`linear_cross_entropy_with_ntl`: the settings are checked once
    here and the vocabulary's lookup tables are buffers, as in
    :class:`~numtok.CrossEntropyWithNTL`.

    ``forward(hidden (..., H), weight (V, H), labels (...), *, bias=None, loss_weights=None,
    num_items_in_batch=None)`` returns the :class:`~numtok.CEWithNTLOutput` of
    :func:`linear_cross_entropy_with_ntl` with the module's settings: CE + ``ntl_weight`` · NTL of
    the logits ``hidden @ weight.T + bias``, which are never held whole (``chunk_size`` rows at a
    time).

    Example:
        >>> import torch
        >>> from numtok import LinearCrossEntropyWithNTL, NumberVocab, cross_entropy_with_ntl
        >>> vocab = NumberVocab.from_values({i: str(i) for i in range(10)}, vocab_size=12)
        >>> hidden, weight = torch.randn(2, 5, 8), torch.randn(12, 8)
        >>> labels = torch.tensor([[4, 11, 7, -100, 5]] * 2)
        >>> loss_fn = LinearCrossEntropyWithNTL(vocab, ntl_weight=0.3, chunk_size=3)
        >>> out = loss_fn(hidden, weight, labels)
        >>> reference = cross_entropy_with_ntl(hidden @ weight.T, labels, vocab, ntl_weight=0.3)
        >>> bool(torch.isclose(out.loss, reference.loss))
        True
    """

    def __init__(
        self,
        vocab: NumberVocab,
        *,
        chunk_size: int | None = None,
        ntl_weight: float = 0.3,
        kind: Kind = "was",
        reweigh: bool = False,
        squash_factor: float | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        shift: bool = False,
        logit_softcap: float | None = None,
        impl: str = "auto",
        capturable: bool = False,
    ) -> None:
        super().__init__()
        self.settings = CEWithNTLSettings.build(
            "LinearCrossEntropyWithNTL",
            NUMBER_LEVEL_BESIDE_HIDDEN,
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
        self.chunk_size = _check_chunk_size(chunk_size)
        self.register_tables(vocab)

    def forward(
        self,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        labels: torch.Tensor,
        *,
        bias: torch.Tensor | None = None,
        loss_weights: torch.Tensor | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> CEWithNTLOutput:
        return linear_cross_entropy_with_ntl_from_tables(
            hidden,
            weight,
            labels,
            self.tables(),
            self.settings.spec,
            self.settings.ntl_weight,
            loss_weights,
            num_items_in_batch,
            bias=bias,
            chunk_size=self.chunk_size,
            impl=self.settings.impl,
        )

    def extra_repr(self) -> str:
        return self.settings.describe(number_tokens=self.ids.numel()) + (
            "" if self.chunk_size is None else f", chunk_size={self.chunk_size}"
        )


def linear_cross_entropy_with_ntl_from_tables(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    tables: NumberTables,
    spec: LossSpec,
    ntl_weight: float,
    loss_weights: torch.Tensor | None,
    num_items_in_batch: torch.Tensor | int | None,
    *,
    bias: torch.Tensor | None = None,
    chunk_size: int | None = None,
    impl: str = "auto",
) -> CEWithNTLOutput:
    """:func:`linear_cross_entropy_with_ntl` with its settings already validated (``spec``,
    ``ntl_weight``, ``impl``) and the vocabulary's lookup tables already on the hidden states'
    device: what the Trainer adapter calls for logits-free training. Checks the tensors and
    ``chunk_size``, and chooses the backend."""
    hidden, weight, bias, labels = check_linear_inputs(
        hidden, weight, bias, labels, spec.vocab_size
    )
    rows_per_chunk = _check_chunk_size(chunk_size)
    # float16 waits for the upstream gradient (GradScaler's 2^16) before rounding a gradient:
    # the recompute pass, whose backward has it.
    in_forward = _gradients_in_forward(hidden, weight, bias, loss_weights, spec)
    in_forward = in_forward and not gradient_waits_for_upstream(hidden.dtype)
    evaluation = not (
        torch.is_grad_enabled()
        and any(t is not None and t.requires_grad for t in (hidden, weight, bias))
    )
    weights_need_grad = isinstance(loss_weights, torch.Tensor) and loss_weights.requires_grad
    unsupported = triton_unsupported(spec, weights_need_grad=weights_need_grad)
    if unsupported is None and not (in_forward or (evaluation and not _compiling())):
        unsupported = (
            "the pass that recomputes the logits in backward (reduction='none' or float16 with "
            "a gradient, torch.compile, saved-tensor hooks)"
        )
    backend = resolve_impl(impl, hidden.device, unsupported)
    # The Triton path checks the values on the GPU (no read-back to the host).
    check_values = backend == "torch" or hidden.device.type != "cuda"
    labels, loss_weights, num_items = _check_targets(
        hidden, labels, loss_weights, num_items_in_batch, spec, check_values
    )

    dtype = compute_dtype(hidden)
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])  # (M, H)
    num_tokens = flat_hidden.shape[0]
    if rows_per_chunk is None:
        rows_per_chunk = default_chunk_size(num_tokens, hidden.shape[-1])
    if backend == "triton" or in_forward:
        chunk_rows = _chunk_rows(backend)(
            labels, loss_weights, tables, spec, ntl_weight, num_items, dtype
        )
        loss, ce, ntl = linear_loss_in_forward(
            flat_hidden, weight, bias, chunk_rows, rows_per_chunk, gradients=in_forward
        )
        return CEWithNTLOutput(loss=loss, ce=ce, ntl=ntl)
    rows, shape = prepare_rows(labels, loss_weights, tables, spec, dtype)
    lse, target_logit, number_logits = linear_row_statistics(
        flat_hidden, weight, bias, rows.target_ids, tables.ids, rows_per_chunk, dtype,
        spec.logit_softcap,
    )  # fmt: skip
    return combine_terms(
        lse, target_logit, number_logits, rows, tables, spec, ntl_weight, num_items, shape
    )


def _check_targets(
    hidden: torch.Tensor,
    labels: torch.Tensor,
    loss_weights: torch.Tensor | None,
    num_items_in_batch: torch.Tensor | int | None,
    spec: LossSpec,
    check_values: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | int | None]:
    """The labels, loss weights and ``num_items_in_batch`` checked. The label checks (integer
    dtype, ids in range) need only the logits' shape and dtype: a zero-stride view stands in for
    the logits that are never built."""
    logits_like = hidden.new_empty(()).expand(*labels.shape, spec.vocab_size)
    capturable = spec.capturable
    _, labels = check_logits_and_labels(
        logits_like,
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
    return labels, loss_weights, num_items


def linear_loss_and_row_terms(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    tables: NumberTables,
    spec: LossSpec,
    ntl_weight: float,
    loss_weights: torch.Tensor | None,
    num_items_in_batch: torch.Tensor | int | None,
    *,
    bias: torch.Tensor | None = None,
) -> tuple[CEWithNTLOutput, RowTerms]:
    """:func:`linear_cross_entropy_with_ntl_from_tables` on the torch row passes, with each
    position's terms and the entropy and top-1 of its next-token distribution beside the loss
    (:class:`~numtok.ops.linear_in_forward.RowTerms`: the per-token values a trainer logs), for a
    scalar reduction (``"mean"``, ``"sum"``) with the gradients computed in the forward pass,
    or without gradients. The entropy costs one more read of each chunk's logits. float16 with
    gradients is refused: they would be rounded before the upstream gradient (a GradScaler's
    2^16) lifts their small entries above float16's 2^-24."""
    hidden, weight, bias, labels = check_linear_inputs(
        hidden, weight, bias, labels, spec.vocab_size
    )
    wanted = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (hidden, weight, bias)
    )
    if wanted and gradient_waits_for_upstream(hidden.dtype):
        raise ValueError(
            f"the terms of each position come from the pass that computes the gradients in the "
            f"forward pass, before the upstream gradient (a loss scale) is known: in "
            f"{hidden.dtype} their entries below 2^-24 would be 0 by then; pass float32 or "
            f"bfloat16 hidden states and weight, or use linear_cross_entropy_with_ntl (whose "
            f"float16 gradient waits for the upstream gradient)"
        )
    if wanted and not _gradients_in_forward(hidden, weight, bias, loss_weights, spec):
        raise ValueError(
            "the terms of each position come from the pass that computes the gradients in the "
            f"forward pass, which needs a scalar reduction and loss weights without a gradient "
            f"(not torch.compile or saved-tensor hooks); got reduction={spec.reduction!r}"
        )
    labels, loss_weights, num_items = _check_targets(
        hidden, labels, loss_weights, num_items_in_batch, spec, check_values=True
    )
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])  # (M, H)
    chunk_rows = TorchChunkRows(
        labels, loss_weights, tables, spec, ntl_weight, num_items, compute_dtype(hidden),
        metrics=True,
    )  # fmt: skip
    chunk_size = default_chunk_size(flat_hidden.shape[0], hidden.shape[-1])
    loss, ce, ntl = linear_loss_in_forward(
        flat_hidden, weight, bias, chunk_rows, chunk_size, gradients=wanted
    )
    return CEWithNTLOutput(loss=loss, ce=ce, ntl=ntl), chunk_rows.row_terms()


def _compiling() -> bool:
    return torch.compiler.is_compiling()


def _chunk_rows(backend: str) -> Callable[..., ChunkRows]:
    """The row pass of the backend (the Triton one imports triton)."""
    if backend == "torch":
        return TorchChunkRows
    from numtok.ops.kernels.triton_loss import ChunkRows as TritonChunkRows

    return TritonChunkRows
