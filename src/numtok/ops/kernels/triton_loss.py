"""The Triton backend of cross-entropy + NTL: launches of :mod:`numtok.ops.kernels.triton_rows`, the
eager autograd and the ``torch.compile`` custom ops (what ``impl="triton"`` runs).

Eager, when the logits need a gradient (the common training step), three launches in forward (and
on CUDA one or two device-side asserts) and one in backward:

1. ``prepare_rows`` (one program): the reduction's scales and the checks of the labels and loss
   weights, as flags the device asserts on (no read-back to the host);
2. ``ce_ntl_rows`` (one program per row): each row's cross-entropy and NTL and its rows of the
   logits' gradient for a unit upstream gradient: one read and one write of (M, V), or one write
   into the logits themselves with ``inplace``;
3. ``sum_terms``: the reduced terms, in a fixed order;
4. in backward, ``scale_rows`` multiplies the gradient by the upstream gradient, and does
   nothing at all where that is exactly 1 (``loss.backward()``), decided on the device.

Where forward knows that the upstream gradient will not be 1 (:func:`~numtok.ops.kernels.
gradient_in_forward.gradient_in_backward`: ``reduction="none"``, float16 logits, float16
autocast), step 2 writes no gradient, and backward runs ``ce_ntl_rows`` from the saved
log-sum-exp with the upstream gradient in its coefficients (one read, one write, rounded once)
instead of step 4 re-reading and re-writing a gradient from forward. Rows whose label is
ignored are read by no kernel (each program masks its loads by its own label) and get zeros
as their gradient. Every launch runs with its tensors' GPU current (Triton launches on the
current one).

Without a gradient, step 2 writes no gradient (one read of the logits). Under ``torch.compile``
the loss is one custom op (the per-row terms and their reduction, one read) whose backward is
another (the gradient from the saved log-sum-exp and the upstream gradient, one read and one
write), so that a compiled model keeps one graph.

Block sizes: a row of up to 32,768 columns stays in registers (read once); longer rows are read
twice in blocks of 32,768 (an online log-sum-exp, then the gradient), as Liger-Kernel's
cross-entropy does. These were chosen from the kernels' shape, not measured here:
``benchmarks/gpu.sh`` measures them.
"""

# No `from __future__ import annotations` here: torch.library.custom_op reads the ops' annotations
# as types, and torch before 2.5 cannot read them as strings (ValueError: infer_schema(func)).

import contextlib
import functools
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

from numtok._common.shift import shift_left
from numtok.maths.kinds import DIST2, SMMDTables, uses_places
from numtok.maths.ntl import LossSpec, place_weights, smmd_tables_for
from numtok.numbers.vocab import NumberTables
from numtok.ops.kernels import triton_rows
from numtok.ops.kernels.gradient_in_forward import (
    ScaleBy,
    WriteGradient,
    gradient_in_backward,
    loss_with_gradient_in_backward,
    loss_with_gradient_in_forward,
)
from numtok.ops.number_logits import compute_dtype

__all__ = [
    "KIND_CODES",
    "ChunkRows",
    "check_launch",
    "cross_entropy_with_ntl",
    "scale_gradient",
]

#: The named kinds the kernels compute, and their codes there (numtok.maths.kinds: 4-6).
KIND_CODES = {"was": 0, "mse": 1, "mae": 2, "huber": 3, "del": 4, "smmd": 5, "dist2": 6}
# How prepare_rows finds the reduction's scales: 1/denominator, 1/num_items (a tensor) or 1/counts.
_SCALE_CONSTANT, _SCALE_NUM_ITEMS, _SCALE_COUNTS = 0, 1, 2
# Columns a program holds in registers at once: 32 float32 per thread at 32 warps (ptxas for
# sm_90: 61-64 registers a thread, no spills, in the variants tests/test_fused_triton.py compiles).
_MAX_BLOCK_V = 1 << 15
# Labels per step of the one-program kernels.
_LABEL_BLOCK = 1024
# Values of SMMD's (K, K) kernel a row program holds at once.
_PAIR_TILE = 1 << 13


class RowSettings(NamedTuple):
    """The integer settings of one call, in the order the custom ops take them as a list."""

    kind: int
    squash: int
    reweigh: int
    shift: int
    single_group: int
    softcap: int
    ignore_index: int
    seq_len: int
    scale_mode: int
    denominator: int


class _Call(NamedTuple):
    """Everything a launch needs besides the logits: flat labels (M,) int64, loss weights (M,) in
    the compute dtype or None, the tables, the integer settings, the float settings
    ``(ntl_weight, D, max distance, nearest distance, squash slope, soft cap)`` (a device tensor
    of them in the compute dtype is :meth:`constants`: their exact values, also in float64),
    ``num_items_in_batch`` as a tensor or None, the reduction with the labels' shape, and for the
    kinds of numtok.maths.kinds the place weights (M,) of the shifted labels (DEL, DIST2) and SMMD's
    tables, else None."""

    labels: torch.Tensor
    weights: torch.Tensor | None
    tables: NumberTables
    settings: RowSettings
    float_settings: tuple[float, ...]
    num_items: torch.Tensor | None
    reduction: str
    shape: torch.Size
    place: torch.Tensor | None
    smmd: SMMDTables | None

    def constants(self, dtype: torch.dtype) -> torch.Tensor:
        return _constants_on(self.float_settings, self.labels.device, dtype)


def _row_settings(
    spec: LossSpec, shape: torch.Size, num_items: torch.Tensor | int | None
) -> RowSettings:
    if spec.reduction != "mean":
        scale_mode, denominator = _SCALE_CONSTANT, 1
    elif num_items is None:
        scale_mode, denominator = _SCALE_COUNTS, 1
    elif isinstance(num_items, torch.Tensor):
        scale_mode, denominator = _SCALE_NUM_ITEMS, 1
    else:
        scale_mode, denominator = _SCALE_CONSTANT, num_items
    return RowSettings(
        kind=KIND_CODES[spec.kind],
        squash=int(spec.squash_factor is not None),
        reweigh=int(spec.reweigh),
        shift=int(spec.shift),
        single_group=int(spec.single_group),
        softcap=int(spec.logit_softcap is not None),
        ignore_index=spec.ignore_index,
        seq_len=shape[-1] if len(shape) else 1,
        scale_mode=scale_mode,
        denominator=denominator,
    )


def _float_settings(spec: LossSpec, ntl_weight: float) -> tuple[float, ...]:
    return (
        ntl_weight,
        spec.max_cost,
        spec.max_distance,
        spec.min_nonzero_distance,
        spec.squash_slope,
        1.0 if spec.logit_softcap is None else spec.logit_softcap,
        spec.settings.temperature if isinstance(spec.settings, DIST2) else 1.0,
    )


@functools.lru_cache(maxsize=64)
def _constants_on(
    values: tuple[float, ...], device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """``values`` as a tensor on ``device``, built once per setting: filled on the device (one
    small kernel each, no copy from the host)."""
    constants = torch.empty(len(values), dtype=dtype, device=device)
    for index, value in enumerate(values):
        constants[index].fill_(value)
    return constants


def _triton_dtype(dtype: torch.dtype) -> Any:
    return tl.float64 if dtype == torch.float64 else tl.float32


def _call(
    device: torch.device,
    dtype: torch.dtype,
    labels: torch.Tensor,
    loss_weights: torch.Tensor | None,
    tables: NumberTables,
    spec: LossSpec,
    ntl_weight: float,
    num_items: torch.Tensor | int | None,
) -> _Call:
    """The call's facts on ``device`` with the compute dtype ``dtype``."""
    weights = None if loss_weights is None else loss_weights.reshape(-1).to(device, dtype)
    place = None
    if uses_places(spec.settings):  # DEL's and DIST2's, of the labels as the loss sees them
        shifted = shift_left(labels, spec.ignore_index) if spec.shift else labels
        place = place_weights(shifted, tables, spec, dtype)
    return _Call(
        labels=labels.reshape(-1).contiguous(),
        weights=None if weights is None else weights.contiguous(),
        tables=tables,
        settings=_row_settings(spec, labels.shape, num_items),
        float_settings=_float_settings(spec, ntl_weight),
        num_items=num_items.reshape(()).to(device) if isinstance(num_items, torch.Tensor) else None,
        reduction=spec.reduction,
        shape=labels.shape,
        place=None if place is None else place.reshape(-1).contiguous(),
        smmd=smmd_tables_for(tables, spec, dtype) if spec.kind == "smmd" else None,
    )


def _on_the_gpu_of(tensor: torch.Tensor) -> contextlib.AbstractContextManager[Any]:
    """The context to launch a kernel over tensors on ``tensor``'s device in. Triton launches
    on the current CUDA device (its driver's ``get_current_device()``), not on its tensors', so
    on CUDA the tensor's device is made current (logits on cuda:1 of a model split over GPUs,
    with cuda:0 current, would be read on the wrong GPU); nothing elsewhere. A call's launches
    take its labels' device (all its tensors share it: checked before)."""
    if tensor.device.type == "cuda":
        return torch.cuda.device(tensor.device)
    return contextlib.nullcontext()


def _prepare(call: _Call, vocab_size: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scales (3,), status (2,))`` of :func:`~numtok.ops.kernels.triton_rows.prepare_rows`."""
    scales = call.labels.new_empty(3, dtype=dtype)
    status = call.labels.new_empty(2, dtype=torch.int32)
    settings = call.settings
    with _on_the_gpu_of(call.labels):
        triton_rows.prepare_rows[(1,)](
            call.labels,
            call.labels if call.weights is None else call.weights,
            call.tables.position_of_id,
            call.labels if call.num_items is None else call.num_items,
            scales,
            status,
            call.labels.numel(),
            vocab_size,
            settings.seq_len,
            settings.ignore_index,
            call.constants(dtype),
            settings.denominator,
            SHIFT=bool(settings.shift),
            HAS_WEIGHTS=call.weights is not None,
            SCALE_MODE=settings.scale_mode,
            C=_triton_dtype(dtype),
            TINY=torch.finfo(dtype).tiny,
            BLOCK=_LABEL_BLOCK,
            num_warps=4,
        )
    return scales, status


def _assert_valid(status: torch.Tensor, call: _Call, vocab_size: int) -> None:
    """On a GPU, the device asserts on the flags of :func:`_prepare` (on CPU the values were
    checked before: there the check that reads back costs nothing)."""
    if status.device.type != "cuda":
        return
    torch._assert_async(
        status[0],
        f"labels must be token ids in [0, {vocab_size}) or "
        f"ignore_index={call.settings.ignore_index}",
    )
    if call.weights is not None:
        torch._assert_async(status[1], "loss_weights must be >= 0")


def _row_launch(vocab_size: int, num_numbers: int, dtype: torch.dtype) -> tuple[int, int, int, int]:
    """``(BLOCK_V, BLOCK_K, BLOCK_J, num_warps)`` of a row program: ``BLOCK_V / 1,024`` warps,
    at least 4 and at most :func:`_most_warps`; float64 rows in half the columns (twice the
    registers per value); SMMD's (K, K) kernel in tiles of ``BLOCK_K × BLOCK_J`` of at most
    8,192 values."""
    widest = _MAX_BLOCK_V // 2 if dtype == torch.float64 else _MAX_BLOCK_V
    block_v = min(triton.next_power_of_2(vocab_size), widest)
    block_k = triton.next_power_of_2(max(1, num_numbers))
    block_j = max(2, min(block_k, _PAIR_TILE // block_k))
    return block_v, block_k, block_j, min(_most_warps(), max(4, block_v // 1024))


def _most_warps() -> int:
    """The warps of a program of 1,024 threads, the most a GPU launches: 32 of 32 threads on
    NVIDIA GPUs, 16 wavefronts of 64 on AMD's (a ROCm build of torch: ``torch.version.hip``),
    32 columns a thread either way at the widest block."""
    return 16 if torch.version.hip else 32


def _launch_rows(
    call: _Call,
    logits: torch.Tensor,
    gradient: torch.Tensor | None,
    scales: torch.Tensor,
    lse: torch.Tensor,
    ce_rows: torch.Tensor,
    ntl_rows: torch.Tensor,
    upstream: torch.Tensor | None,
    first_row: int = 0,
) -> None:
    """:func:`~numtok.ops.kernels.triton_rows.ce_ntl_rows` over the rows of ``logits`` (m, V), the
    positions ``first_row ..`` of the call: with ``upstream`` None the loss terms are written
    (and the gradient for a unit upstream gradient when ``gradient`` is given), else ``lse`` is
    read and ``gradient`` gets the logits' gradient for that upstream gradient (one value, or
    one per row)."""
    num_rows, vocab_size = logits.shape
    settings, tables = call.settings, call.tables
    block_v, block_k, block_j, num_warps = _row_launch(vocab_size, tables.ids.numel(), lse.dtype)
    upstream_stride = 0 if upstream is None or upstream.numel() == 1 else upstream.stride(0)
    output = logits if gradient is None else gradient
    constants = call.constants(lse.dtype)
    smmd = call.smmd or SMMDTables(constants, constants, constants)
    with _on_the_gpu_of(call.labels):
        triton_rows.ce_ntl_rows[(num_rows,)](
            logits,
            logits.stride(0),
            logits.stride(1),
            output,
            output.stride(0),
            output.stride(1),
            call.labels,
            call.labels if call.weights is None else call.weights,
            tables.position_of_id,
            tables.ids,
            tables.scaled_values,
            tables.groups,
            constants if call.place is None else call.place,
            smmd.kernel,
            smmd.degree,
            smmd.coefficients,
            lse,
            ce_rows,
            ntl_rows,
            scales,
            scales if upstream is None else upstream,
            upstream_stride,
            vocab_size,
            tables.ids.numel(),
            settings.seq_len,
            settings.ignore_index,
            constants,
            first_row,
            KIND=settings.kind,
            SQUASH=bool(settings.squash),
            REWEIGH=bool(settings.reweigh),
            SHIFT=bool(settings.shift),
            HAS_WEIGHTS=call.weights is not None,
            HAS_PLACE=call.place is not None,
            SINGLE_GROUP=bool(settings.single_group),
            SOFTCAP=bool(settings.softcap),
            LSE_KNOWN=upstream is not None,
            WRITE_GRAD=gradient is not None,
            HAS_UPSTREAM=upstream is not None,
            ROW_ON_CHIP=block_v >= vocab_size,
            STRIDED_COLUMNS=logits.stride(1) != 1 or output.stride(1) != 1,
            C=_triton_dtype(lse.dtype),
            FINITE_MIN=torch.finfo(lse.dtype).min,
            BLOCK_V=block_v,
            BLOCK_K=block_k,
            BLOCK_J=block_j,
            num_warps=num_warps,
        )


def _reduce(
    call: _Call, scales: torch.Tensor, ce_rows: torch.Tensor, ntl_rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, ce, ntl)``: per row (M,) for ``"none"``, else the scaled sums."""
    if call.reduction == "none":
        return torch.add(ce_rows, ntl_rows, alpha=call.float_settings[0]), ce_rows, ntl_rows
    loss, ce, ntl = (ce_rows.new_empty(()) for _ in range(3))
    with _on_the_gpu_of(call.labels):
        triton_rows.sum_terms[(1,)](
            ce_rows,
            ntl_rows,
            scales,
            loss,
            ce,
            ntl,
            ce_rows.numel(),
            call.constants(ce_rows.dtype),
            C=_triton_dtype(ce_rows.dtype),
            BLOCK=_LABEL_BLOCK,
            num_warps=4,
        )
    return loss, ce, ntl


class _RowPass:
    """The rows of one call: the reduction's scales and the checks (``prepare_rows``), then the
    per-row terms (M,) that ``ce_ntl_rows`` writes, as many launches as there are chunks of rows,
    then their reduction."""

    def __init__(self, call: _Call, vocab_size: int, dtype: torch.dtype) -> None:
        self.call, self.vocab_size = call, vocab_size
        self.scales, self.status = _prepare(call, vocab_size, dtype)
        num_rows = call.labels.numel()
        self.lse, self.ce_rows, self.ntl_rows = (
            call.labels.new_empty(num_rows, dtype=dtype) for _ in range(3)
        )

    def run(self, logits: torch.Tensor, gradient: torch.Tensor | None, first_row: int) -> None:
        """The positions ``first_row ..`` from their logits (m, V), their gradient for a unit
        upstream gradient written into ``gradient`` (m, V) when given (it may be ``logits``)."""
        if logits.shape[0]:
            rows = (self.lse, self.ce_rows, self.ntl_rows)
            _launch_rows(self.call, logits, gradient, self.scales, *rows, None, first_row)

    def reduced(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(loss, ce, ntl)`` of every position, per position (M,) for ``"none"``."""
        _assert_valid(self.status, self.call, self.vocab_size)
        return _reduce(self.call, self.scales, self.ce_rows, self.ntl_rows)


def _terms(
    call: _Call, logits: torch.Tensor, gradient: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, ce, ntl, lse, scales)`` of the logits (M, V), the gradient for a unit upstream
    gradient written into ``gradient`` (M, V) when given (it may be ``logits``)."""
    rows = _RowPass(call, logits.shape[1], compute_dtype(logits))
    rows.run(logits, gradient, 0)
    return (*rows.reduced(), rows.lse, rows.scales)


def _terms_into(
    call: _Call, logits: torch.Tensor, gradient: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _terms(call, logits, gradient)[:3]


def _terms_then_gradient(
    call: _Call, logits: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, WriteGradient]:
    """``(loss, ce, ntl)`` of the logits (M, V) without a gradient (one read), and the function
    that writes their gradient in backward: ``ce_ntl_rows`` from the saved log-sum-exp with the
    upstream gradient ``u`` (one value, or one per row) in its coefficients, ``u·∂L/∂x`` rounded
    once (one read, one write; where :func:`~numtok.ops.kernels.gradient_in_forward.
    gradient_in_backward` chooses it)."""
    loss, ce, ntl, lse, scales = _terms(call, logits, None)

    def write(logits: torch.Tensor, gradient: torch.Tensor, upstream: torch.Tensor) -> None:
        if logits.shape[0]:
            _launch_rows(call, logits, gradient, scales, lse, lse, lse, upstream.reshape(-1))

    return loss, ce, ntl, write


def _in_labels_shape(
    call: _Call, terms: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, ce, ntl)`` in the labels' shape for ``"none"`` (per position), else as they are."""
    if call.reduction != "none":
        return terms
    loss, ce, ntl = terms
    return loss.view(call.shape), ce.view(call.shape), ntl.view(call.shape)


def scale_gradient(
    gradient: torch.Tensor,
    upstream: torch.Tensor,
    labels: torch.Tensor,
    *,
    seq_len: int = 1,
    ignore_index: int = -100,
    shift: bool = False,
) -> None:
    """``gradient`` (M, V) times ``upstream`` (one value, or M), in place and in the compute
    dtype, rounded once; rows whose upstream gradient is exactly 1, and rows whose label among
    ``labels`` (M,) (the next position's with ``shift``, in sequences of ``seq_len``) is
    ``ignore_index`` (their gradient is 0), are left alone, decided on the device (no
    read-back)."""
    num_rows, vocab_size = gradient.shape
    upstream = upstream.reshape(-1)
    block_v = min(triton.next_power_of_2(vocab_size), 1 << 13)
    if num_rows == 0:
        return
    with _on_the_gpu_of(gradient):
        triton_rows.scale_rows[(num_rows,)](
            gradient,
            gradient.stride(0),
            gradient.stride(1),
            upstream,
            0 if upstream.numel() == 1 else upstream.stride(0),
            labels,
            vocab_size,
            seq_len,
            ignore_index,
            SHIFT=shift,
            STRIDED_COLUMNS=gradient.stride(1) != 1,
            C=_triton_dtype(gradient.dtype),
            BLOCK_V=block_v,
            num_warps=min(8, max(1, block_v // 256)),
        )


def _scale_by(call: _Call) -> ScaleBy:
    """The backward of the gradient written in forward for ``call``: :func:`scale_gradient`
    with the call's labels."""
    settings = call.settings
    return functools.partial(
        scale_gradient,
        labels=call.labels,
        seq_len=settings.seq_len,
        ignore_index=settings.ignore_index,
        shift=bool(settings.shift),
    )


def check_launch(device: torch.device) -> None:
    """One launch on ``device`` (``scale_rows`` on a (1, 1) tensor): Triton compiles for the
    device's architecture and builds its launcher with the host's C compiler at a first
    launch, so that what fails there fails here, before any loss (see
    :func:`numtok.ops.kernels.dispatch.resolve_impl`)."""
    scale_gradient(
        torch.zeros(1, 1, device=device),
        torch.full((1,), 2.0, device=device),
        torch.zeros(1, dtype=torch.long, device=device),
    )


# ---------------------------------------------------------------------- torch.compile custom ops


def _call_of_op(
    labels: torch.Tensor,
    weights: torch.Tensor | None,
    tables: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    num_items: torch.Tensor | None,
    constants: list[float],
    settings: list[int],
    reduction: str,
    place: torch.Tensor | None,
    smmd: list[torch.Tensor],
) -> _Call:
    return _Call(
        labels=labels,
        weights=weights,
        tables=NumberTables(*tables),
        settings=RowSettings(*settings),
        float_settings=tuple(constants),
        num_items=num_items,
        reduction=reduction,
        shape=labels.shape,
        place=place,
        smmd=SMMDTables(*smmd) if smmd else None,
    )


@torch.library.custom_op("numtok::triton_ce_ntl", mutates_args=())
def _ce_ntl_op(
    logits: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor | None,
    ids: torch.Tensor,
    values: torch.Tensor,
    groups: torch.Tensor,
    position_of_id: torch.Tensor,
    num_items: torch.Tensor | None,
    constants: list[float],
    settings: list[int],
    reduction: str,
    place: torch.Tensor | None,
    smmd: list[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    tables = (ids, values, groups, position_of_id)
    call = _call_of_op(
        labels, weights, tables, num_items, constants, settings, reduction, place, smmd
    )
    return _terms(call, logits, None)


@_ce_ntl_op.register_fake
def _(
    logits: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor | None,
    ids: torch.Tensor,
    values: torch.Tensor,
    groups: torch.Tensor,
    position_of_id: torch.Tensor,
    num_items: torch.Tensor | None,
    constants: list[float],
    settings: list[int],
    reduction: str,
    place: torch.Tensor | None,
    smmd: list[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    dtype = compute_dtype(logits)
    num_rows = logits.shape[0]
    loss, ce, ntl = (
        logits.new_empty((num_rows,) if reduction == "none" else (), dtype=dtype) for _ in range(3)
    )
    return loss, ce, ntl, logits.new_empty(num_rows, dtype=dtype), logits.new_empty(3, dtype=dtype)


@torch.library.custom_op("numtok::triton_ce_ntl_backward", mutates_args=())
def _ce_ntl_backward_op(
    logits: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor | None,
    ids: torch.Tensor,
    values: torch.Tensor,
    groups: torch.Tensor,
    position_of_id: torch.Tensor,
    constants: list[float],
    settings: list[int],
    place: torch.Tensor | None,
    smmd: list[torch.Tensor],
    lse: torch.Tensor,
    scales: torch.Tensor,
    grad_loss: torch.Tensor,
) -> torch.Tensor:
    tables = (ids, values, groups, position_of_id)
    call = _call_of_op(labels, weights, tables, None, constants, settings, "sum", place, smmd)
    gradient = torch.empty_like(logits)
    if logits.shape[0]:
        upstream = grad_loss.reshape(-1)
        _launch_rows(call, logits, gradient, scales, lse, lse, lse, upstream)
    return gradient


@_ce_ntl_backward_op.register_fake
def _(
    logits: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor | None,
    ids: torch.Tensor,
    values: torch.Tensor,
    groups: torch.Tensor,
    position_of_id: torch.Tensor,
    constants: list[float],
    settings: list[int],
    place: torch.Tensor | None,
    smmd: list[torch.Tensor],
    lse: torch.Tensor,
    scales: torch.Tensor,
    grad_loss: torch.Tensor,
) -> torch.Tensor:
    return torch.empty_like(logits)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    (logits, labels, weights, ids, values, groups, position_of_id, _, constants, settings, _,
     place, smmd) = inputs  # fmt: skip
    ctx.save_for_backward(
        logits, labels, weights, ids, values, groups, position_of_id, place, output[3], output[4],
        *smmd,
    )  # fmt: skip
    ctx.constants, ctx.settings = constants, settings


def _backward(ctx: Any, grad_loss: torch.Tensor | None, *_: Any) -> tuple[Any, ...]:
    (logits, labels, weights, ids, values, groups, position_of_id, place, lse, scales,
     *smmd) = ctx.saved_tensors  # fmt: skip
    gradient = None
    if grad_loss is not None:
        gradient = _ce_ntl_backward_op(
            logits, labels, weights, ids, values, groups, position_of_id,
            ctx.constants, ctx.settings, place, smmd, lse, scales, grad_loss,
        )  # fmt: skip
    # One entry per input, a list for the list of SMMD's tables.
    return gradient, *[None] * 11, [None] * len(smmd)


_ce_ntl_op.register_autograd(_backward, setup_context=_setup_context)


def _compiled(
    call: _Call, logits: torch.Tensor, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    tables = call.tables
    loss, ce, ntl, _, _ = _ce_ntl_op(
        logits.reshape(-1, vocab_size),
        call.labels,
        call.weights,
        tables.ids,
        tables.scaled_values,
        tables.groups,
        tables.position_of_id,
        call.num_items,
        list(call.float_settings),
        list(call.settings),
        call.reduction,
        call.place,
        [] if call.smmd is None else list(call.smmd),
    )
    return loss, ce.detach(), ntl.detach()


# ---------------------------------------------------------------------- chunks of rows (linear)


class ChunkRows(_RowPass):
    """The Triton backend's row pass for the logits-free path (:mod:`numtok.ops.linear_in_forward`):
    the logits come a chunk of rows at a time, each chunk is turned into its rows of the
    gradient in place (``ce_ntl_rows`` with an offset into the call's M positions), and
    :meth:`terms` reduces the per-row terms at the end. The scales and checks of the whole call
    come first (``prepare_rows``), so that every chunk's gradient has its final scale."""

    def __init__(
        self,
        labels: torch.Tensor,
        loss_weights: torch.Tensor | None,
        tables: NumberTables,
        spec: LossSpec,
        ntl_weight: float,
        num_items: torch.Tensor | int | None,
        dtype: torch.dtype,
    ) -> None:
        call = _call(
            labels.device, dtype, labels, loss_weights, tables, spec, ntl_weight, num_items
        )
        super().__init__(call, spec.vocab_size, dtype)

    def __call__(self, index: slice, logits: torch.Tensor, write_gradient: bool) -> None:
        """The rows ``index`` (a slice of the M positions) from their logits (m, V), which
        become their gradient for a unit upstream gradient with ``write_gradient``."""
        self.run(logits, logits if write_gradient else None, index.start)

    def terms(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(loss, ce, ntl)`` of every row passed so far (all M), in the labels' shape for
        ``reduction="none"``."""
        return _in_labels_shape(self.call, self.reduced())


# ---------------------------------------------------------------------------------- entry point


def cross_entropy_with_ntl(
    logits: torch.Tensor,
    labels: torch.Tensor,
    loss_weights: torch.Tensor | None,
    tables: NumberTables,
    spec: LossSpec,
    ntl_weight: float,
    num_items: torch.Tensor | int | None,
    *,
    needs_grad: bool,
    inplace: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, ce, ntl)`` of :func:`numtok.losses.fused.cross_entropy_with_ntl` for validated
    inputs and a named ``kind`` (``spec.kind`` in :data:`KIND_CODES`), ``loss_weights`` without a
    gradient; ``needs_grad``: autograd records and the logits require grad; ``inplace``: the
    gradient goes into the logits' memory (checked by the caller)."""
    dtype = compute_dtype(logits)
    call = _call(logits.device, dtype, labels, loss_weights, tables, spec, ntl_weight, num_items)
    if torch.compiler.is_compiling():
        terms = _compiled(call, logits, spec.vocab_size)
    elif needs_grad and gradient_in_backward(logits, spec.reduction):
        then_write = functools.partial(_terms_then_gradient, call)
        terms = loss_with_gradient_in_backward(logits, spec.vocab_size, inplace, then_write)
    elif needs_grad:
        compute = functools.partial(_terms_into, call)
        terms = loss_with_gradient_in_forward(
            logits, spec.vocab_size, inplace, compute, _scale_by(call)
        )
    else:
        terms = _terms(call, logits.reshape(-1, spec.vocab_size), None)[:3]
    return _in_labels_shape(call, terms)
