"""Row statistics of a logits matrix for cross-entropy + NTL, and their gradient.

Cross-entropy and the Number Token Loss read a logits row ``x`` (V,) only through

* ``lse = log Σ_v exp(x_v)`` (full-vocabulary log-sum-exp),
* ``x[y]`` (the label's logit) and
* ``z = x[number_ids]`` (the N number-token logits),

so one pass over the logits gives everything the loss needs. The gradient is the transpose of
those three maps: with ``g_lse`` (M,), ``g_y`` (M,) and ``g_z`` (M, N) the loss's derivatives by
them,

    ∂L/∂x[r] = g_lse[r] · softmax(x[r]) + g_y[r] · onehot(y[r]) + scatter(g_z[r] -> number_ids)

i.e. one dense term (softmax times a per-row coefficient) and N + 1 sparse fix-ups per row.

* :func:`compute_row_statistics`: the three statistics, one read of the logits (evaluation).
* :func:`statistics_and_gradient`: the log-sum-exp and, in the same pass, the gradient, given a
  function from a chunk's log-sum-exp to its ``g_*`` (the gradient-in-forward path): each chunk
  is read once and turned into its gradient rows while it is in cache.
* :func:`write_row_gradient`: the gradient from known ``lse`` and ``g_*`` (a backward pass, and
  blocks of vocabulary columns for the linear path).
* :func:`row_statistics`: the statistics as a differentiable ``torch.library`` custom op whose
  backward is :func:`write_row_gradient`, so that ``torch.compile`` sees one opaque node each way
  instead of unrolling the chunk loop.

Rows are processed in chunks small enough to stay in cache; bfloat16/float16 chunks are upcast to
float32 one at a time into a reused buffer, never the whole tensor. On CPU the chunks of a pass
are shared among the torch threads (see :func:`_in_row_blocks`).

With a soft cap ``c`` (``softcap``, Gemma 2's ``final_logit_softcapping``) every function reads
the capped logits ``x' = c·tanh(x/c)`` where it reads ``x`` above, and the gradient by ``x`` is
the gradient by ``x'`` times ``dx'/dx = 1 - (x'/c)²``, element by element, fix-ups included.
"""

# No `from __future__ import annotations` here: torch.library.custom_op reads the ops' annotations
# as types, and torch before 2.5 cannot read them as strings (ValueError: infer_schema(func)).

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

__all__ = [
    "RowGradientsOf",
    "compute_row_statistics",
    "entropy_and_top1",
    "gather_rows",
    "row_statistics",
    "rows_per_chunk",
    "scale_rows_in_place",
    "statistics_and_gradient",
    "write_row_gradient",
]

# A chunk of about a million elements (4 MiB in float32) stays in a CPU core's cache across the
# element-wise passes (max, exp, sum, scale). Measured once (4096 x 32768, 1 thread, loaded
# machine): 2^19 to 2^21 within 10%; 2^22 20% slower in bfloat16; 2^16 nearly 2x slower from the
# per-chunk overhead. GPUs want large launches; 2^24 elements keep the float32 buffer
# of a bfloat16 pass at 64 MiB (2^26 would be 1x the logits of 4096 x 32768).
_CPU_CHUNK_ELEMENTS = 1 << 20
_GPU_CHUNK_ELEMENTS = 1 << 24


def rows_per_chunk(num_columns: int, device: torch.device) -> int:
    budget = _CPU_CHUNK_ELEMENTS if device.type == "cpu" else _GPU_CHUNK_ELEMENTS
    return max(1, budget // max(1, num_columns))


def gather_rows(
    logits: torch.Tensor,
    target_ids: torch.Tensor,
    number_ids: torch.Tensor,
    compute_dtype: torch.dtype,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits[r, target_ids[r]] (M,), logits[:, number_ids] (M, N))`` of a 2-D ``logits``
    (M, V) in ``compute_dtype`` (soft-capped with ``softcap``). ``-inf`` number logits (masked
    vocabulary entries) are raised to the most negative finite value, so that no softmax over
    them can produce NaN."""
    target_logit = logits.gather(1, target_ids[:, None]).squeeze(1).to(compute_dtype)  # (M,)
    number_logits = logits.index_select(1, number_ids).to(compute_dtype)  # (M, N)
    if softcap is not None:  # both are fresh tensors: capped in place
        _soft_capped(target_logit, softcap, out=target_logit)
        _soft_capped(number_logits, softcap, out=number_logits)
    return target_logit, number_logits.clamp_min(torch.finfo(compute_dtype).min)


def _soft_capped(x: torch.Tensor, softcap: float, out: torch.Tensor) -> torch.Tensor:
    """``out = c·tanh(x/c)``; ``out`` may be ``x``."""
    return torch.div(x, softcap, out=out).tanh_().mul_(softcap)


def _times_cap_slope(gradient: torch.Tensor, capped: torch.Tensor, softcap: float) -> None:
    """``gradient *= 1 - (capped/c)²``, the derivative of ``c·tanh(x/c)`` by ``x`` from its
    value ``capped`` (overwritten), in place."""
    gradient.mul_(capped.div_(softcap).square_().neg_().add_(1.0))


def _chunk_source(
    block: torch.Tensor,
    work: torch.Tensor,
    upcast: bool,
    capped: torch.Tensor | None,
    softcap: float | None,
) -> torch.Tensor:
    """What a chunk's softmax is taken of: ``block`` (rows, C) itself, with ``upcast`` its copy
    in ``work`` (upcast first: CPU kernels that mix dtypes, bf16 - f32 -> f32, skip
    vectorisation and take 3x the time of the conversion and the float32 pass), and with a soft
    cap that capped into ``capped`` (which keeps it for the chain rule)."""
    source = work.copy_(block) if upcast else block
    if softcap is None:
        return source
    assert capped is not None
    return _soft_capped(source, softcap, out=capped)


def _capped_buffer(
    logits: torch.Tensor, softcap: float | None, compute_dtype: torch.dtype, rows: int
) -> torch.Tensor | None:
    """A (rows, C) buffer for a chunk's soft-capped logits, reused by every chunk; None without
    a soft cap."""
    if softcap is None:
        return None
    return logits.new_empty((min(rows, logits.shape[0]), logits.shape[1]), dtype=compute_dtype)


def _work_buffer(
    logits: torch.Tensor, out: torch.Tensor | None, compute_dtype: torch.dtype, rows: int
) -> torch.Tensor | None:
    """A (rows, C) buffer in ``compute_dtype`` for one chunk, reused by every chunk; None when
    the work can be done in ``out``'s own rows (``out`` has the compute dtype)."""
    if out is not None and out.dtype == compute_dtype:
        return None
    return logits.new_empty((min(rows, logits.shape[0]), logits.shape[1]), dtype=compute_dtype)


def _in_row_blocks(
    num_rows: int, step: int, device: torch.device, work: Callable[[int, int], None]
) -> None:
    """Call ``work(start, stop)`` on row blocks covering ``range(num_rows)``, each a whole
    number of chunks of ``step`` rows.

    On CPU with T > 1 torch threads, T blocks run at once in T threads (this one and T - 1
    workers), each calling single-threaded torch kernels: one fork and one join per pass
    instead of a parallel region (and its barrier) for every kernel of every chunk, which
    scales with the threads and degrades gracefully when other processes take cores. The
    thread count is set to 1 meanwhile and restored. Elsewhere one block, in this thread."""
    threads = torch.get_num_threads() if device.type == "cpu" else 1
    chunks = -(-num_rows // step)
    if min(threads, chunks) <= 1:
        work(0, num_rows)
        return
    per_block = -(-chunks // min(threads, chunks)) * step
    bounds = [(start, min(start + per_block, num_rows)) for start in range(0, num_rows, per_block)]
    grad_mode = torch.is_grad_enabled()  # thread-local: the workers run in the caller's mode

    def in_worker(start: int, stop: int) -> None:
        with torch.set_grad_enabled(grad_mode):
            work(start, stop)

    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(len(bounds) - 1) as pool:
            others = [pool.submit(in_worker, start, stop) for start, stop in bounds[1:]]
            work(*bounds[0])
            for future in others:
                future.result()
    finally:
        torch.set_num_threads(threads)


_LOG2_E = 1.4426950408889634


def _exp_minus(x: torch.Tensor, shift: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out = exp(x - shift)`` for ``x`` (rows, C) and ``shift`` (rows, 1) of ``out``'s dtype,
    as ``exp2(log2(e)·x - log2(e)·shift)``: one fused multiply-add pass, and PyTorch's CPU
    ``exp2`` takes 0.6x the time of its ``exp`` (AVX2, float32). ``out`` may be ``x``."""
    return torch.add(shift * -_LOG2_E, x, alpha=_LOG2_E, out=out).exp2_()


def _exp_chunks(
    logits: torch.Tensor,
    lse: torch.Tensor,
    out: torch.Tensor | None,
    start: int,
    stop: int,
    softcap: float | None = None,
) -> Iterator[tuple[slice, torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """Go over the rows ``start:stop`` of ``logits`` (M, V) in chunks, filling ``lse`` (M,) (in
    the compute dtype) and yielding ``(rows, work, total, capped)``: ``work`` (rows, V) =
    ``exp(x - max_v x)`` and ``total`` (rows,) its row sums, so that ``softmax(x) = work / total``
    and ``lse = max + log total``; with a soft cap ``x`` is ``c·tanh(logits/c)``, which
    ``capped`` (rows, V) holds (None without).

    ``work`` is ``out[rows]`` itself when ``out`` (M, V) has the compute dtype (``out`` may be
    ``logits``: then the chunk is overwritten), else one reused buffer of a chunk's size:
    bfloat16/float16 logits are upcast a chunk at a time. Each chunk is read from memory once;
    its passes (max, subtract, exp, sum and the caller's) run on data in cache. A row whose
    logits are all ``-inf`` gets ``work = 0``, ``total = 0``, ``lse = -inf``.
    """
    step = rows_per_chunk(logits.shape[1], logits.device)
    buffer = _work_buffer(logits, out, lse.dtype, min(step, stop - start))
    capped_buffer = _capped_buffer(logits, softcap, lse.dtype, min(step, stop - start))
    for first in range(start, stop, step):
        rows = slice(first, min(first + step, stop))
        block = logits[rows]  # (rows, V)
        work = out[rows] if buffer is None else buffer[: block.shape[0]]  # type: ignore[index]
        capped = None if capped_buffer is None else capped_buffer[: block.shape[0]]
        source = _chunk_source(block, work, buffer is not None, capped, softcap)
        peak = source.amax(dim=1, keepdim=True)  # (rows, 1)
        peak = torch.where(peak.isfinite(), peak, 0.0)
        _exp_minus(source, peak, out=work)
        total = work.sum(dim=1)  # (rows,)
        torch.add(peak.squeeze(1), total.log(), out=lse[rows])
        yield rows, work, total, capped


def compute_row_statistics(
    logits: torch.Tensor,
    target_ids: torch.Tensor,
    number_ids: torch.Tensor,
    compute_dtype: torch.dtype,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(lse (M,), logits[r, target_ids[r]] (M,), logits[:, number_ids] (M, N))`` of a 2-D
    ``logits`` (M, V), all in ``compute_dtype``, in one read of the logits (see
    :func:`gather_rows` for ``-inf`` number logits); of the soft-capped logits with ``softcap``."""
    lse = logits.new_empty(logits.shape[0], dtype=compute_dtype)

    def block(start: int, stop: int) -> None:
        for _ in _exp_chunks(logits, lse, None, start, stop, softcap):
            pass

    step = rows_per_chunk(logits.shape[1], logits.device)
    _in_row_blocks(logits.shape[0], step, logits.device, block)
    return lse, *gather_rows(logits, target_ids, number_ids, compute_dtype, softcap)


def entropy_and_top1(
    logits: torch.Tensor,
    lse: torch.Tensor,
    target_ids: torch.Tensor,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(H (M,), is_top1 (M,) bool)`` of a 2-D ``logits`` (M, V) whose log-sum-exp is ``lse``
    (M,), in ``lse``'s dtype: each row's entropy ``H = lse - Σ_v softmax(x)_v · x_v`` and whether
    its label ``target_ids`` is its most likely token (``argmax``, the first of equal maxima), of
    the soft-capped logits with ``softcap``; one more read of the logits, in cache-sized chunks.
    What TRL's fused LM head logs as ``entropy`` and ``mean_token_accuracy``."""
    entropy = torch.empty_like(lse)
    is_top1 = torch.empty(logits.shape[0], dtype=torch.bool, device=logits.device)
    finite_lse = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    step = rows_per_chunk(logits.shape[1], logits.device)

    upcast = logits.dtype != lse.dtype

    def block(start: int, stop: int) -> None:
        rows_at_once = min(step, stop - start)
        buffer = _work_buffer(logits, None, lse.dtype, rows_at_once) if upcast else None
        probs = logits.new_empty((rows_at_once, logits.shape[1]), dtype=lse.dtype)
        capped_buffer = _capped_buffer(logits, softcap, lse.dtype, rows_at_once)
        for first in range(start, stop, step):
            rows = slice(first, min(first + step, stop))
            chunk = logits[rows]  # (rows, V)
            work = chunk if buffer is None else buffer[: chunk.shape[0]]
            capped = None if capped_buffer is None else capped_buffer[: chunk.shape[0]]
            source = _chunk_source(chunk, work, upcast, capped, softcap)
            is_top1[rows] = source.argmax(dim=1) == target_ids[rows]
            p = _exp_minus(source, finite_lse[rows, None], out=probs[: chunk.shape[0]])
            # Σ_v p_v x_v as one batched dot product per row: (rows, 1, V) @ (rows, V, 1).
            expected = torch.bmm(p[:, None, :], source[:, :, None]).reshape(-1)
            entropy[rows] = lse[rows] - expected

    _in_row_blocks(logits.shape[0], step, logits.device, block)
    return entropy, is_top1


#: ``row_gradients(rows, lse[rows]) -> (grad_lse, grad_target, grad_numbers)`` for a chunk.
RowGradientsOf = Callable[[slice, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def statistics_and_gradient(
    logits: torch.Tensor,
    out: torch.Tensor,
    target_ids: torch.Tensor,
    number_ids: torch.Tensor,
    compute_dtype: torch.dtype,
    row_gradients: RowGradientsOf,
    softcap: float | None = None,
) -> torch.Tensor:
    """The log-sum-exp (M,) of a 2-D ``logits`` (M, V) in ``compute_dtype``, and the logits'
    gradient written into ``out`` (M, V) (the logits' dtype; ``out`` may be ``logits`` itself)
    in the same pass: each chunk of rows is read once, its log-sum-exp computed, then
    ``row_gradients(rows, lse[rows])`` gives the chunk's gradient pieces (compute dtype)

        grad_lse (rows,), grad_target (rows,), grad_numbers (rows, N)

    and the chunk, still in cache, becomes ``grad_lse·softmax(x) + grad_target·onehot(target)
    + scatter(grad_numbers -> number_ids)``, rounded once to the logits' dtype. Rows whose
    logits are all ``-inf`` get softmax 0. Gather the label's and the number logits first
    (:func:`gather_rows`) when ``out`` is ``logits``. On CPU, ``row_gradients`` is called from
    several threads at once (on disjoint chunks). With ``softcap`` all of it is of the capped
    logits, and the gradient by the logits carries the cap's slope."""
    lse = logits.new_empty(logits.shape[0], dtype=compute_dtype)

    def block(start: int, stop: int) -> None:
        for rows, work, total, capped in _exp_chunks(logits, lse, out, start, stop, softcap):
            grad_lse, grad_target, grad_numbers = row_gradients(rows, lse[rows])
            scale = torch.where(total > 0, grad_lse / total, 0.0)  # (rows,)
            work.mul_(scale[:, None])
            _add_fixups(work, target_ids[rows], grad_target, number_ids, grad_numbers)
            if capped is not None and softcap is not None:
                _times_cap_slope(work, capped, softcap)
            if work.dtype != out.dtype:
                out[rows].copy_(work)

    step = rows_per_chunk(logits.shape[1], logits.device)
    _in_row_blocks(logits.shape[0], step, logits.device, block)
    return lse


def scale_rows_in_place(gradient: torch.Tensor, upstream: torch.Tensor) -> None:
    """``gradient`` (M, V) times ``upstream`` (one value, or M: one per row), in place. A scalar
    upstream gradient of exactly 1 (``loss.backward()``) needs no pass over the gradient;
    checking costs a device sync, so only on CPU. The (M, 1) shape makes the product compute in
    float32 for bfloat16/float16 gradients (rounded once more)."""
    upstream = upstream.reshape(-1, 1)
    if not (upstream.numel() == 1 and upstream.device.type == "cpu" and bool(upstream == 1)):
        gradient.mul_(upstream)


def _add_fixups(
    work: torch.Tensor,
    target_column: torch.Tensor,
    grad_target: torch.Tensor,
    number_column: torch.Tensor,
    grad_numbers: torch.Tensor,
) -> None:
    """``work[r, target_column[r]] += grad_target[r]`` and ``work[r, number_column[j]] +=
    grad_numbers[r, j]``, in place."""
    work.scatter_add_(1, target_column[:, None], grad_target[:, None])
    work.index_add_(1, number_column, grad_numbers)


def write_row_gradient(
    out: torch.Tensor,
    logits: torch.Tensor,
    lse: torch.Tensor,
    target_ids: torch.Tensor,
    number_ids: torch.Tensor,
    grad_lse: torch.Tensor,
    grad_target: torch.Tensor,
    grad_numbers: torch.Tensor,
    first_column: int = 0,
    softcap: float | None = None,
) -> None:
    """Write ``grad_lse[r]·softmax(x[r]) + grad_target[r]·onehot(target_ids[r])
    + scatter(grad_numbers[r] -> number_ids)`` into ``out``, which may be ``logits`` itself
    (with ``softcap``: of the capped logits, times the cap's slope).

    ``logits`` (M, C) holds the columns ``first_column .. first_column + C - 1`` of the full rows
    ``x`` (M, V), whose log-sum-exp is ``lse`` (M,); fix-ups at ids outside those columns are
    skipped. ``lse`` and ``grad_*`` are in the compute dtype, ``out`` has the logits' dtype. A row
    whose log-sum-exp is ``-inf`` (every logit masked) gets softmax 0 instead of NaN.
    """
    width = logits.shape[1]
    # A fix-up whose column lies outside this block adds 0 at a clamped column inside it.
    target_column = target_ids - first_column  # (M,)
    target_inside = (target_column >= 0) & (target_column < width)
    grad_target = torch.where(target_inside, grad_target, torch.zeros_like(grad_target))
    target_column = target_column.clamp(0, width - 1)
    number_column = number_ids - first_column  # (N,)
    number_inside = (number_column >= 0) & (number_column < width)
    grad_numbers = torch.where(number_inside, grad_numbers, torch.zeros_like(grad_numbers))
    number_column = number_column.clamp(0, width - 1)

    finite_lse = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    step = rows_per_chunk(width, logits.device)

    def block(start: int, stop: int) -> None:
        buffer = _work_buffer(logits, out, lse.dtype, min(step, stop - start))
        capped_buffer = _capped_buffer(logits, softcap, lse.dtype, min(step, stop - start))
        for first in range(start, stop, step):
            rows = slice(first, min(first + step, stop))
            chunk = logits[rows]  # (rows, C)
            work = out[rows] if buffer is None else buffer[: chunk.shape[0]]
            capped = None if capped_buffer is None else capped_buffer[: chunk.shape[0]]
            source = _chunk_source(chunk, work, buffer is not None, capped, softcap)
            _exp_minus(source, finite_lse[rows, None], out=work)
            work.mul_(grad_lse[rows, None])  # (rows, C)
            _add_fixups(
                work, target_column[rows], grad_target[rows], number_column, grad_numbers[rows]
            )
            if capped is not None and softcap is not None:
                _times_cap_slope(work, capped, softcap)
            if buffer is not None:
                out[rows].copy_(work)

    _in_row_blocks(logits.shape[0], step, logits.device, block)


@torch.library.custom_op("numtok::row_statistics", mutates_args=())
def _row_statistics(
    logits: torch.Tensor,
    target_ids: torch.Tensor,
    number_ids: torch.Tensor,
    compute_dtype: torch.dtype,
    softcap: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return compute_row_statistics(logits, target_ids, number_ids, compute_dtype, softcap)


@_row_statistics.register_fake
def _(
    logits: torch.Tensor,
    target_ids: torch.Tensor,
    number_ids: torch.Tensor,
    compute_dtype: torch.dtype,
    softcap: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    num_rows = logits.shape[0]
    return (
        logits.new_empty(num_rows, dtype=compute_dtype),
        logits.new_empty(num_rows, dtype=compute_dtype),
        logits.new_empty(num_rows, number_ids.shape[0], dtype=compute_dtype),
    )


@torch.library.custom_op("numtok::row_statistics_backward", mutates_args=())
def _row_statistics_backward(
    logits: torch.Tensor,
    lse: torch.Tensor,
    target_ids: torch.Tensor,
    number_ids: torch.Tensor,
    grad_lse: torch.Tensor,
    grad_target: torch.Tensor,
    grad_numbers: torch.Tensor,
    softcap: float | None,
) -> torch.Tensor:
    grad_logits = torch.empty_like(logits)
    write_row_gradient(
        grad_logits, logits, lse, target_ids, number_ids, grad_lse, grad_target, grad_numbers,
        softcap=softcap,
    )  # fmt: skip
    return grad_logits


@_row_statistics_backward.register_fake
def _(
    logits: torch.Tensor,
    lse: torch.Tensor,
    target_ids: torch.Tensor,
    number_ids: torch.Tensor,
    grad_lse: torch.Tensor,
    grad_target: torch.Tensor,
    grad_numbers: torch.Tensor,
    softcap: float | None,
) -> torch.Tensor:
    return torch.empty_like(logits)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    logits, target_ids, number_ids, _, softcap = inputs
    ctx.save_for_backward(logits, output[0], target_ids, number_ids)
    ctx.softcap = softcap


def _backward(
    ctx: Any, grad_lse: torch.Tensor, grad_target: torch.Tensor, grad_numbers: torch.Tensor
) -> tuple[torch.Tensor, None, None, None, None]:
    logits, lse, target_ids, number_ids = ctx.saved_tensors
    grad_logits = _row_statistics_backward(
        logits, lse, target_ids, number_ids, grad_lse, grad_target, grad_numbers, ctx.softcap
    )
    return grad_logits, None, None, None, None


_row_statistics.register_autograd(_backward, setup_context=_setup_context)


def row_statistics(
    logits: torch.Tensor,
    target_ids: torch.Tensor,
    number_ids: torch.Tensor,
    compute_dtype: torch.dtype,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Differentiable :func:`compute_row_statistics` of a 2-D ``logits`` (M, V): its backward
    writes the logits' gradient into one fresh (M, V) buffer with :func:`write_row_gradient`."""
    lse, target_logit, number_logits = _row_statistics(
        logits, target_ids, number_ids, compute_dtype, softcap
    )
    return lse, target_logit, number_logits
