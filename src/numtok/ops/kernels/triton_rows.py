"""Triton kernels for cross-entropy + NTL over a logits matrix (M, V), one program per row.

A row ``x`` (V,) enters the loss only through its log-sum-exp ``lse``, the label's logit ``x[y]``
and the K number-token logits ``z = x[number_ids]`` (see :mod:`numtok.ops.kernels.torch_rows`), and
its gradient is

    ∂L/∂x = g_lse · softmax(x) + g_y · onehot(y) + scatter(g_z -> number_ids)

so :func:`ce_ntl_rows` reads the row once for an online log-sum-exp (max and sum in float32, or
float64 for float64 logits), gathers ``z`` with one indexed load, computes the row's NTL and its
derivatives by ``z`` in registers, and, when asked, writes the gradient: the dense part block by
block, then, after a barrier, the K + 1 sparse columns *overwritten* with values recomputed in the
compute dtype from ``z`` and ``x[y]`` (never a read-modify-write of rounded bfloat16). A row that
fits in one block is loaded once and kept on chip for both passes. The gradient may be written
into the logits themselves (in place): everything the fix-ups need is read before the dense pass.

The coefficients of the gradient are ``g_y = -s·t``, ``g_lse = s·t - c·∂R/∂log m`` and
``g_z = c·(∂R/∂ℓ · ∂ℓ/∂z + ∂R/∂log m · softmax(z))``
(:func:`numtok.ops.row_algebra.loss_and_row_gradients` derives them), with ``t`` = 1 where the label
counts, ``s = u·s_ce`` and ``c = u·w·s_ntl·a``: ``s_ce``, ``s_ntl`` the reduction's scales
(:func:`prepare_rows`), ``w`` the NTL weight, ``a`` the row's loss weight (0 unless its label is a
number token) and ``u`` the upstream gradient of the row's loss: 1 when the gradient is written in
the forward pass (``HAS_UPSTREAM`` off), else read with a row stride (0: one value for every row, a
scalar loss's; 1: ``reduction="none"``).

The other kernels: :func:`prepare_rows` (one program: the ``"mean"`` denominators, the scales, and
flags for labels out of range or negative weights, so that no check reads data back to the host),
:func:`sum_terms` (one program: the reduced terms in a fixed order, deterministic) and
:func:`scale_rows` (the backward of a gradient computed in forward: multiply by the upstream
gradient, nothing at all where it is exactly 1 or the row's label is ignored, decided on the
device).

Ignored rows (label ``ignore_index``) have no loss and a zero gradient, so no kernel reads their
logits: each row program checks its own label and masks its loads (no host sync, no compaction),
and :func:`ce_ntl_rows` writes zeros as their gradient rows. With half the labels ignored (an SFT
batch's prompts) that halves the reads.

Kinds (``KIND``): 0 NTL-WAS, 1 MSE, 2 MAE, 3 Huber (δ = 1), as in :mod:`numtok.maths.ntl`, and
the kinds of :mod:`numtok.maths.kinds`: 4 DEL, 5 SMMD, 6 DIST2 (:func:`_kind_terms`), whose place
weights (a row's factor on ℓ and ∂ℓ/∂z, not on the reduction's denominators) come per row.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["ce_ntl_rows", "prepare_rows", "scale_rows", "sum_terms"]

# Reweighing charges mass outside the number tokens 1.01 times the largest cost (ntloss's
# constant; numtok.maths.ntl._REWEIGH_MARGIN).
_REWEIGH_MARGIN = tl.constexpr(1.01)


@triton.jit
def _label_and_weight(
    labels_ptr,
    weights_ptr,
    rows,
    valid,
    seq_len,
    ignore_index,
    SHIFT: tl.constexpr,
    HAS_WEIGHTS: tl.constexpr,
    C: tl.constexpr,
):
    """The label and loss weight of each row (scalars or vectors): with ``SHIFT`` those of the
    next position in the row's sequence, ``ignore_index`` and 0 at a sequence's last position."""
    if SHIFT:
        valid = valid & ((rows % seq_len) != (seq_len - 1))
        rows = rows + 1
    label = tl.load(labels_ptr + rows, mask=valid, other=ignore_index)
    if HAS_WEIGHTS:
        weight = tl.load(weights_ptr + rows, mask=valid, other=0.0).to(C)
    else:
        weight = tl.where(valid, 1.0, 0.0).to(C)
    return label, weight


@triton.jit
def _classify(label, position_ptr, V, ignore_index):
    """``(is_target, is_number, column, position)``: the label counts for cross-entropy, it is a
    number token, the column to read (0 where no valid label), its index among the number tokens
    (0 where none). Out-of-range labels count as targets of nothing: no memory outside the row is
    touched (the caller's checks report them)."""
    is_target = label != ignore_index
    in_range = (label >= 0) & (label < V)
    column = tl.where(is_target & in_range, label, 0)
    position = tl.load(position_ptr + column)
    is_number = is_target & in_range & (position >= 0)
    return is_target & in_range, is_number, column, tl.maximum(position, 0)


@triton.jit
def prepare_rows(
    labels_ptr,
    weights_ptr,
    position_ptr,
    num_items_ptr,
    scales_ptr,
    status_ptr,
    n_rows,
    V,
    seq_len,
    ignore_index,
    constants_ptr,
    denominator,
    SHIFT: tl.constexpr,
    HAS_WEIGHTS: tl.constexpr,
    SCALE_MODE: tl.constexpr,
    C: tl.constexpr,
    TINY: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One program over all labels (M,). Writes ``scales = (s_ce, s_ntl, ntl_weight·s_ntl)``:
    ``1 / denominator`` for both with ``SCALE_MODE`` 0 (1 for ``"sum"`` and ``"none"``, an int
    ``num_items_in_batch``), ``1 / num_items`` with 1 (a tensor), and with 2 (``"mean"``) one over
    the number of counted labels and over ``Σ loss_weights`` at number positions (each at least
    ``TINY``); ``ntl_weight`` is ``constants[0]``. ``status = (no label out of range, no
    negative weight)`` as 0/1, of the labels and weights as given (before the shift)."""
    offsets = tl.arange(0, BLOCK)
    targets = tl.zeros([BLOCK], C)
    number_weight = tl.zeros([BLOCK], C)
    bad_labels = tl.zeros([BLOCK], tl.int32)
    negative_weights = tl.zeros([BLOCK], tl.int32)
    for start in range(0, n_rows, BLOCK):
        rows = start + offsets
        valid = rows < n_rows
        given = tl.load(labels_ptr + rows, mask=valid, other=ignore_index)
        out_of_range = (given != ignore_index) & ((given < 0) | (given >= V))
        bad_labels += out_of_range.to(tl.int32)
        if HAS_WEIGHTS:
            given_weight = tl.load(weights_ptr + rows, mask=valid, other=0.0)
            negative_weights += (given_weight < 0).to(tl.int32)
        if SCALE_MODE == 2:
            label, weight = _label_and_weight(
                labels_ptr, weights_ptr, rows, valid, seq_len, ignore_index, SHIFT, HAS_WEIGHTS, C
            )
            is_target, is_number, _, _ = _classify(label, position_ptr, V, ignore_index)
            targets += tl.where(is_target, 1.0, 0.0).to(C)
            number_weight += tl.where(is_number, weight, 0.0)
    if SCALE_MODE == 0:
        # tl.cast, not denominator.to: the JIT passes a denominator of 1 as the Python int 1.
        ce_scale = 1.0 / tl.cast(denominator, C)
        ntl_scale = ce_scale
    elif SCALE_MODE == 1:
        ce_scale = 1.0 / tl.load(num_items_ptr).to(C)
        ntl_scale = ce_scale
    else:
        ce_scale = 1.0 / tl.maximum(tl.sum(targets, 0), TINY)
        ntl_scale = 1.0 / tl.maximum(tl.sum(number_weight, 0), TINY)
    tl.store(scales_ptr, ce_scale)
    tl.store(scales_ptr + 1, ntl_scale)
    tl.store(scales_ptr + 2, tl.load(constants_ptr) * ntl_scale)
    tl.store(status_ptr, (tl.sum(bad_labels, 0) == 0).to(tl.int32))
    tl.store(status_ptr + 1, (tl.sum(negative_weights, 0) == 0).to(tl.int32))


@triton.jit
def _soft_capped(x, softcap):
    """``c·tanh(x/c)`` as ``±c·(1 - e)/(1 + e)`` with ``e = exp(-2|x|/c)``: no overflow, and an
    absolute error of about ``c`` times the dtype's epsilon where ``x`` is small (libdevice's
    ``tanh`` does not run in Triton's interpreter)."""
    e = tl.exp(-2.0 * tl.abs(x) / softcap)
    magnitude = softcap * (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -magnitude, magnitude)


@triton.jit
def _cap_slope(capped, softcap):
    """``d(c·tanh(x/c))/dx = 1 - (x'/c)²`` from the capped value ``x'``."""
    ratio = capped / softcap
    return 1.0 - ratio * ratio


@triton.jit
def _column_offsets(columns, column_stride, STRIDED_COLUMNS: tl.constexpr):
    """``columns · column_stride`` in int64 with ``STRIDED_COLUMNS`` (a stride other than 1,
    such as the rows of a transposed buffer, whose ``stride · V`` passes 2^31 once M·V does:
    int32 would wrap), else ``columns`` (a unit stride; they stay below V)."""
    if STRIDED_COLUMNS:  # noqa: SIM108 (a compile-time branch: the other one is not compiled)
        offsets = columns.to(tl.int64) * column_stride
    else:
        offsets = columns
    return offsets


@triton.jit
def _row_block(
    row_logits,
    columns,
    V,
    column_stride,
    softcap,
    SOFTCAP: tl.constexpr,
    C,
    STRIDED_COLUMNS: tl.constexpr,
):
    """The logits of one row at ``columns`` in the compute dtype ``C``, soft-capped with
    ``SOFTCAP``; -inf at columns from V on, which are not read (a masked load touches no
    memory: ``V = 0`` reads nothing)."""
    inside = columns < V
    at = row_logits + _column_offsets(columns, column_stride, STRIDED_COLUMNS)
    block = tl.load(at, mask=inside, other=float("-inf")).to(C)
    if SOFTCAP:
        block = tl.where(inside, _soft_capped(block, softcap), float("-inf"))
    return block


@triton.jit
def _number_softmax(z):
    """``(logsumexp(z), softmax(z))`` of a row's number logits (-inf lanes get probability 0)."""
    peak = tl.max(z, 0)
    exp_z = tl.exp(z - peak)
    total = tl.sum(exp_z, 0)
    return peak + tl.log(total), exp_z / total


@triton.jit
def _number_terms(
    z,
    in_number_block,
    values,
    groups,
    target_value,
    target_group,
    max_cost,
    max_distance,
    nearest,
    squash_slope,
    KIND: tl.constexpr,
    SQUASH: tl.constexpr,
    SINGLE_GROUP: tl.constexpr,
):
    """``(ℓ, ∂ℓ/∂z (K,), logsumexp(z), softmax(z) (K,))`` of one row's number logits ``z`` (lanes
    outside the K tokens hold -inf), with ``ṽ = values``, the label's ``ỹ = target_value`` and
    digit-length group ``target_group`` (see numtok.maths.ntl):

    * WAS: ``ℓ = Σ_j p_j d_j``, ``d_j = |ṽ_j - ỹ|`` within the label's group, ``D`` outside,
      squashed to ``1 + (d - d_min)·slope`` (0 stays 0); ``∂ℓ/∂z_j = p_j (d_j - ℓ)``.
    * Lp: ``ℓ = P·f(ŷ, ỹ) + (1 - P)·D_f`` with ``q`` the softmax within the group (of ``z``
      there), ``P`` its share of the number mass and ``ŷ = Σ q_j ṽ_j``; with ``1_j`` = token j
      is in the group, ``∂P/∂z_j = p_j (1_j - P)`` and ``P·∂ŷ/∂z_j = p_j (ṽ_j - ŷ) 1_j``, so
      ``∂ℓ/∂z_j = p_j (1_j - P)(f - D_f) + f'(ŷ)·p_j (ṽ_j - ŷ) 1_j``.
    """
    number_lse, probs = _number_softmax(z)
    if SINGLE_GROUP:  # noqa: SIM108 (a compile-time branch: the other one is not compiled)
        same = in_number_block
    else:
        same = in_number_block & (groups == target_group)
    if KIND == 0:
        distance = tl.where(same, tl.abs(values - target_value), max_distance)
        if SQUASH:
            distance = tl.where(distance == 0, 0.0, 1.0 + (distance - nearest) * squash_slope)
        distance = tl.where(in_number_block, distance, 0.0)
        base = tl.sum(probs * distance, 0)
        grad_base = probs * (distance - base)
    else:
        # ŷ from the softmax within the group, taken from the group's own maximum: P is 0 in
        # float32 for a length whose logits lie over 103 below another's, and Σ_G p_j ṽ_j / P
        # would be 0/0 there; ŷ stays the group's mean and ℓ = D_f (float64's limit).
        group_z = tl.where(same, z, float("-inf"))
        in_group_exp = tl.exp(group_z - tl.max(group_z, 0))
        prediction = tl.sum(in_group_exp * values, 0) / tl.sum(in_group_exp, 0)
        share = tl.sum(tl.where(same, probs, 0.0), 0)
        error = prediction - target_value
        if KIND == 1:
            cost = error * error
            slope = 2.0 * error
        elif KIND == 2:
            cost = tl.abs(error)
            slope = tl.where(error > 0, 1.0, tl.where(error < 0, -1.0, 0.0))
        else:
            small = tl.abs(error) < 1.0
            cost = tl.where(small, 0.5 * error * error, tl.abs(error) - 0.5)
            slope = tl.minimum(tl.maximum(error, -1.0), 1.0)
        base = share * cost + (1.0 - share) * max_cost
        in_group = tl.where(same, 1.0, 0.0)
        grad_base = probs * (in_group - share) * (cost - max_cost)
        grad_base += in_group * slope * probs * (values - prediction)
    return base, grad_base, number_lse, probs


@triton.jit
def _softplus(x):
    """``log(1 + exp(x))`` without overflow: ``max(x, 0) + log(1 + exp(-|x|))``."""
    return tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x)))


@triton.jit
def _number_logits(
    row_logits,
    logits_column_stride,
    number_ids_ptr,
    indices,
    is_number,
    K,
    softcap,
    SOFTCAP: tl.constexpr,
    C: tl.constexpr,
    FINITE_MIN: tl.constexpr,
):
    """``(gathered, number_ids, z)`` of the number tokens at ``indices`` (among the K): which
    lanes were read (none where the label is no number token: no memory traffic), their ids and
    logits in ``C``, -inf (masked) logits raised to the most negative finite value, soft-capped
    with ``SOFTCAP``; 0 at lanes not read."""
    gathered = indices < tl.where(is_number, K, 0)
    number_ids = tl.load(number_ids_ptr + indices, mask=gathered, other=0)
    z = tl.load(row_logits + number_ids * logits_column_stride, mask=gathered, other=0.0).to(C)
    z = tl.maximum(z, FINITE_MIN)
    if SOFTCAP:
        z = _soft_capped(z, softcap)
    return gathered, number_ids, z


@triton.jit
def _smmd_kernel_times_residual(
    residual,
    in_number_block,
    lanes,
    position,
    number_lse,
    row_logits,
    logits_column_stride,
    number_ids_ptr,
    pair_kernel_ptr,
    is_number,
    K,
    softcap,
    SOFTCAP: tl.constexpr,
    C: tl.constexpr,
    FINITE_MIN: tl.constexpr,
    BLOCK_J: tl.constexpr,
):
    """``K·r`` (K,) with the (K, K) kernel read ``BLOCK_J`` columns at a time, ``r_j = p_j -
    1{j = t}`` of those columns recomputed from their logits as the row's ``z`` is
    (:func:`_number_logits`: a register vector cannot be indexed); nothing is read where the label
    is no number token. ``K`` is symmetric, so the
    columns are read as contiguous rows."""
    product = tl.zeros_like(residual)
    for start in range(0, K, BLOCK_J):
        columns = start + tl.arange(0, BLOCK_J)
        present, _, z = _number_logits(
            row_logits, logits_column_stride, number_ids_ptr, columns, is_number, K, softcap,
            SOFTCAP, C, FINITE_MIN,
        )  # fmt: skip
        at_label = tl.where(columns == position, 1.0, 0.0)
        residual_j = tl.where(present, tl.exp(z - number_lse) - at_label, 0.0)
        tile = tl.load(
            pair_kernel_ptr + columns[None, :] * K + lanes[:, None],
            mask=in_number_block[:, None] & present[None, :],
            other=0.0,
        ).to(C)
        product += tl.sum(tile * residual_j[None, :], 1)
    return product


@triton.jit
def _kind_terms(
    z,
    probs,
    number_lse,
    in_number_block,
    lanes,
    position,
    values,
    groups,
    target_value,
    target_group,
    temperature,
    row_logits,
    logits_column_stride,
    number_ids_ptr,
    pair_kernel_ptr,
    pair_degree_ptr,
    pair_coefficients_ptr,
    is_number,
    K,
    softcap,
    KIND: tl.constexpr,
    SINGLE_GROUP: tl.constexpr,
    SOFTCAP: tl.constexpr,
    C: tl.constexpr,
    FINITE_MIN: tl.constexpr,
    BLOCK_J: tl.constexpr,
):
    """``(ℓ, ∂ℓ/∂z (K,))`` of the kinds of :mod:`numtok.maths.kinds` before the place weight, from
    the row's number logits ``z``, ``p = softmax(z)`` and ``logsumexp(z)``, with ``t = position``
    (their formulas: numtok.maths.kinds):

    * DEL (4): ``ℓ = Σ_c p_c B_c / K``, ``B_c = softplus(∓z_c)`` (− at ``c = t``), so
      ``∂ℓ/∂z_j = p_j (B_j - K·ℓ + B'_j) / K`` with ``B'_j = σ(z_j) - 1{j = t}``.
    * SMMD (5): ``r = p - onehot(t)``, ``ℓ = max(0, A·rᵀKr + B·Σ deg r²)``; with
      ``g = 2A·Kr + 2B·deg∘r`` (K symmetric) ``∂ℓ/∂z_j = p_j (g_j - Σ_i p_i g_i)`` where the value
      is ≥ 0 (the clamp's gradient passes at 0, as ``clamp_min``'s does), else 0.
    * DIST2 (6): ``q = softmax(-(ṽ - ṽ_t)²/τ)`` over the label's group ``G``,
      ``ℓ = Σ_G q_j (log q_j - log p_j) / K`` and, since ``Σ_G q = 1``,
      ``∂ℓ/∂z_j = (p_j - q_j 1_G(j)) / K``.
    """
    if KIND == 4:
        is_label = lanes == position
        entropy = tl.where(in_number_block, _softplus(tl.where(is_label, -z, z)), 0.0)
        sigmoid = 1.0 / (1.0 + tl.exp(-z))
        slope = tl.where(is_label, sigmoid - 1.0, sigmoid)
        total = tl.sum(probs * entropy, 0)
        base = total / K
        grad_base = tl.where(in_number_block, probs * (entropy - total + slope), 0.0) / K
    elif KIND == 5:
        residual = tl.where(in_number_block, probs - tl.where(lanes == position, 1.0, 0.0), 0.0)
        product = _smmd_kernel_times_residual(
            residual,
            in_number_block,
            lanes,
            position,
            number_lse,
            row_logits,
            logits_column_stride,
            number_ids_ptr,
            pair_kernel_ptr,
            is_number,
            K,
            softcap,
            SOFTCAP,
            C,
            FINITE_MIN,
            BLOCK_J,
        )
        degree = tl.load(pair_degree_ptr + lanes, mask=in_number_block, other=0.0).to(C)
        first = tl.load(pair_coefficients_ptr).to(C)
        second = tl.load(pair_coefficients_ptr + 1).to(C)
        value = first * tl.sum(residual * product, 0) + second * tl.sum(
            degree * residual * residual, 0
        )
        base = tl.maximum(value, 0.0)
        outer = 2.0 * first * product + 2.0 * second * degree * residual
        grad_base = probs * (outer - tl.sum(probs * outer, 0))
        grad_base = tl.where(value >= 0, grad_base, 0.0)
    else:
        if SINGLE_GROUP:  # noqa: SIM108 (a compile-time branch: the other one is not compiled)
            same = in_number_block
        else:
            same = in_number_block & (groups == target_group)
        gap = values - target_value
        closeness = tl.where(same, -(gap * gap) / temperature, float("-inf"))
        peak = tl.max(closeness, 0)
        exp_closeness = tl.exp(closeness - peak)
        closeness_total = tl.sum(exp_closeness, 0)
        target = exp_closeness / closeness_total
        # Both logs finite outside G too (0 there), so that no lane computes inf - inf.
        log_target = tl.where(same, closeness - peak - tl.log(closeness_total), 0.0)
        log_probs = tl.where(in_number_block, z - number_lse, 0.0)
        divergence = tl.where(same, target * (log_target - log_probs), 0.0)
        base = tl.sum(divergence, 0) / K
        grad_base = tl.where(in_number_block, probs - tl.where(same, target, 0.0), 0.0) / K
    return base, grad_base


@triton.jit
def ce_ntl_rows(
    logits_ptr,
    logits_row_stride,
    logits_column_stride,
    grad_ptr,
    grad_row_stride,
    grad_column_stride,
    labels_ptr,
    weights_ptr,
    position_ptr,
    number_ids_ptr,
    values_ptr,
    groups_ptr,
    place_ptr,
    pair_kernel_ptr,
    pair_degree_ptr,
    pair_coefficients_ptr,
    lse_ptr,
    ce_ptr,
    ntl_ptr,
    scales_ptr,
    upstream_ptr,
    upstream_stride,
    V,
    K,
    seq_len,
    ignore_index,
    constants_ptr,
    first_row,
    KIND: tl.constexpr,
    SQUASH: tl.constexpr,
    REWEIGH: tl.constexpr,
    SHIFT: tl.constexpr,
    HAS_WEIGHTS: tl.constexpr,
    HAS_PLACE: tl.constexpr,
    SINGLE_GROUP: tl.constexpr,
    SOFTCAP: tl.constexpr,
    LSE_KNOWN: tl.constexpr,
    WRITE_GRAD: tl.constexpr,
    HAS_UPSTREAM: tl.constexpr,
    ROW_ON_CHIP: tl.constexpr,
    STRIDED_COLUMNS: tl.constexpr,
    C: tl.constexpr,
    FINITE_MIN: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_J: tl.constexpr,
):
    """Row ``program_id(0)`` of the logits (m, V), which are the rows ``first_row`` to
    ``first_row + m - 1`` of the M positions that labels, weights, ``lse``, ``ce``, ``ntl`` and
    upstream gradients (M,) describe. Writes the row's ``lse``, cross-entropy ``lse - x[y]`` (0
    where the label is ignored) and NTL (reweighed when ``REWEIGH``, times the loss weight; 0
    where the label is no number token) unless ``LSE_KNOWN`` (then ``lse`` is read), and with
    ``WRITE_GRAD`` its row of the gradient (m, V) (``grad_ptr`` may be ``logits_ptr``).
    ``ROW_ON_CHIP`` when ``BLOCK_V >= V``; ``STRIDED_COLUMNS`` when the logits or the gradient
    have a column stride other than 1 (offsets in int64); ``constants = (ntl_weight, D, max
    distance, nearest distance, squash slope, soft cap, DIST2's τ)`` in the compute dtype ``C``.
    ``HAS_PLACE``: the place weights (M,) of DEL and DIST2 multiply each row's ℓ; SMMD (``KIND``
    5) reads its kernel (K, K), degrees (K,) and ``(A, B)`` from the ``pair_*`` pointers,
    ``BLOCK_J`` kernel columns at a time. With ``SOFTCAP`` the row is read as ``c·tanh(x/c)``
    everywhere and the gradient carries the cap's slope ``1 - (x'/c)²``.
    """
    max_cost = tl.load(constants_ptr + 1)
    max_distance = tl.load(constants_ptr + 2)
    nearest = tl.load(constants_ptr + 3)
    squash_slope = tl.load(constants_ptr + 4)
    softcap = tl.load(constants_ptr + 5)
    temperature = tl.load(constants_ptr + 6)
    minus_inf = float("-inf")
    # The program's row of the logits (and of the gradient), and its position among all M rows
    # (labels, weights and the per-row results): the logits may be a chunk of rows.
    row = tl.program_id(0).to(tl.int64)
    position_of_row = first_row + row
    label, weight = _label_and_weight(
        labels_ptr,
        weights_ptr,
        position_of_row,
        row >= 0,
        seq_len,
        ignore_index,
        SHIFT,
        HAS_WEIGHTS,
        C,
    )
    is_target, is_number, column, position = _classify(label, position_ptr, V, ignore_index)
    # A row whose label does not count (ignore_index: the prompt of an SFT batch, padding) has
    # no loss and a zero gradient: none of its logits is read (every load below is masked by
    # is_target, or by is_number, which implies it), and its gradient row gets zeros. Decided
    # by the program from its own label: no host sync, no compaction of the rows. ``read``: the
    # columns of the row that are read, V or 0 (a bound, not a mask of its own: a masked load
    # keeps V's alignment, and so its vector width, as before).
    read = tl.where(is_target, V, 0)
    row_logits = logits_ptr + row * logits_row_stride
    target_logit = tl.load(
        row_logits + column * logits_column_stride, mask=is_target, other=0.0
    ).to(C)
    if SOFTCAP:
        target_logit = _soft_capped(target_logit, softcap)

    # The number logits, only where the label is a number; lanes beyond K at -inf.
    lanes = tl.arange(0, BLOCK_K)
    in_number_block = lanes < K
    gather, number_ids, z = _number_logits(
        row_logits, logits_column_stride, number_ids_ptr, lanes, is_number, K, softcap, SOFTCAP,
        C, FINITE_MIN,
    )  # fmt: skip
    z = tl.where(in_number_block, z, minus_inf)
    # Every lane's table entries, also at other rows: their NTL terms are then finite (and
    # multiplied by a coefficient of 0).
    values = tl.load(values_ptr + lanes, mask=in_number_block, other=0.0).to(C)
    groups = tl.load(groups_ptr + lanes, mask=in_number_block, other=-1)
    target_value = tl.load(values_ptr + position).to(C)
    target_group = tl.load(groups_ptr + position)
    if KIND < 4:
        base, grad_base, number_lse, number_probs = _number_terms(
            z,
            in_number_block,
            values,
            groups,
            target_value,
            target_group,
            max_cost,
            max_distance,
            nearest,
            squash_slope,
            KIND,
            SQUASH,
            SINGLE_GROUP,
        )
    else:
        number_lse, number_probs = _number_softmax(z)
        base, grad_base = _kind_terms(
            z,
            number_probs,
            number_lse,
            in_number_block,
            lanes,
            position,
            values,
            groups,
            target_value,
            target_group,
            temperature,
            row_logits,
            logits_column_stride,
            number_ids_ptr,
            pair_kernel_ptr,
            pair_degree_ptr,
            pair_coefficients_ptr,
            is_number,
            K,
            softcap,
            KIND,
            SINGLE_GROUP,
            SOFTCAP,
            C,
            FINITE_MIN,
            BLOCK_J,
        )
    if HAS_PLACE:
        place = tl.load(place_ptr + position_of_row).to(C)
        base *= place
        grad_base *= place

    # Pass 1: the online log-sum-exp; a row of one block stays in registers for pass 2.
    if ROW_ON_CHIP:
        columns = tl.arange(0, BLOCK_V)
        x = _row_block(
            row_logits, columns, read, logits_column_stride, softcap, SOFTCAP, C, STRIDED_COLUMNS
        )
    if LSE_KNOWN:
        lse = tl.load(lse_ptr + position_of_row).to(C)
    else:
        if ROW_ON_CHIP:
            peak = tl.max(x, 0)
            peak = tl.where(peak == minus_inf, 0.0, peak)
            lse = peak + tl.log(tl.sum(tl.exp(x - peak), 0))
        else:
            peak = tl.max(tl.full([BLOCK_V], minus_inf, C), 0)
            total = tl.sum(tl.zeros([BLOCK_V], C), 0)
            # An ignored row's loop runs 0 times.
            for start in range(0, read, BLOCK_V):
                columns = start + tl.arange(0, BLOCK_V)
                block = _row_block(
                    row_logits, columns, read, logits_column_stride, softcap, SOFTCAP, C,
                    STRIDED_COLUMNS,
                )  # fmt: skip
                new_peak = tl.maximum(peak, tl.max(block, 0))
                shift = tl.where(new_peak == minus_inf, 0.0, new_peak)
                total = total * tl.exp(peak - shift) + tl.sum(tl.exp(block - shift), 0)
                peak = new_peak
            lse = tl.where(peak == minus_inf, 0.0, peak) + tl.log(total)
        # An ignored row's lse is 0 (its logits were not read): finite for whatever reads it.
        lse = tl.where(is_target, lse, 0.0)

    # Reweighing: R = ℓ·m + 1.01·D·(1 - m) with log m = logsumexp(z) - lse, m clamped to 1.
    log_mass = number_lse - lse
    mass = tl.exp(tl.minimum(log_mass, 0.0))
    if not LSE_KNOWN:
        ntl = base
        if REWEIGH:
            ntl = base * mass + _REWEIGH_MARGIN * max_cost * (1.0 - mass)
        tl.store(lse_ptr + position_of_row, lse)
        tl.store(ce_ptr + position_of_row, tl.where(is_target, lse - target_logit, 0.0))
        tl.store(ntl_ptr + position_of_row, tl.where(is_number, ntl * weight, 0.0))

    if WRITE_GRAD:
        ce_coefficient = tl.load(scales_ptr)
        ntl_coefficient = tl.load(scales_ptr + 2) * weight
        if HAS_UPSTREAM:
            upstream = tl.load(upstream_ptr + position_of_row * upstream_stride).to(C)
            ce_coefficient *= upstream
            ntl_coefficient *= upstream
        ce_coefficient = tl.where(is_target, ce_coefficient, 0.0)
        ntl_coefficient = tl.where(is_number, ntl_coefficient, 0.0)
        grad_target = -ce_coefficient
        if REWEIGH:
            slope = tl.where(log_mass <= 0, (base - _REWEIGH_MARGIN * max_cost) * mass, 0.0)
            slope = ntl_coefficient * slope
            grad_numbers = ntl_coefficient * mass * grad_base + slope * number_probs
            grad_lse = ce_coefficient - slope
        else:
            grad_numbers = ntl_coefficient * grad_base
            grad_lse = ce_coefficient
        # softmax(x) = exp(x - lse); a row of -inf logits (lse = -inf) has softmax 0.
        softmax_scale = tl.where(lse == minus_inf, 0.0, grad_lse)
        finite_lse = tl.where(lse == minus_inf, 0.0, lse)
        row_grad = grad_ptr + row * grad_row_stride
        out_dtype = grad_ptr.dtype.element_ty
        # Every read of the logits above happens before any write below (they may be one buffer).
        tl.debug_barrier()
        # An ignored row's gradient is written as zeros, from no logits (x = -inf there, and the
        # cap's slope at -inf is -inf: 0·inf would be NaN, so the zeros are selected).
        if ROW_ON_CHIP:
            dense = softmax_scale * tl.exp(x - finite_lse)
            if SOFTCAP:
                dense *= _cap_slope(x, softcap)
            dense = tl.where(is_target, dense, 0.0)
            at = row_grad + _column_offsets(columns, grad_column_stride, STRIDED_COLUMNS)
            tl.store(at, dense.to(out_dtype), mask=columns < V)
        else:
            for start in range(0, V, BLOCK_V):
                columns = start + tl.arange(0, BLOCK_V)
                block = _row_block(
                    row_logits, columns, read, logits_column_stride, softcap, SOFTCAP, C,
                    STRIDED_COLUMNS,
                )  # fmt: skip
                dense = softmax_scale * tl.exp(block - finite_lse)
                if SOFTCAP:
                    dense *= _cap_slope(block, softcap)
                dense = tl.where(is_target, dense, 0.0)
                at = row_grad + _column_offsets(columns, grad_column_stride, STRIDED_COLUMNS)
                tl.store(at, dense.to(out_dtype), mask=columns < V)
        # The sparse columns, after every dense store of this program: the label's and the number
        # tokens' entries overwritten with dense + fix-up, computed from the values read before
        # the dense pass (which may have overwritten the logits).
        tl.debug_barrier()
        at_numbers = softmax_scale * tl.exp(z - finite_lse) + grad_numbers
        at_numbers += tl.where(number_ids == label, grad_target, 0.0)
        if SOFTCAP:
            at_numbers *= _cap_slope(z, softcap)
        tl.store(row_grad + number_ids * grad_column_stride, at_numbers.to(out_dtype), mask=gather)
        at_target = softmax_scale * tl.exp(target_logit - finite_lse) + grad_target
        if SOFTCAP:
            at_target *= _cap_slope(target_logit, softcap)
        tl.store(
            row_grad + column * grad_column_stride,
            at_target.to(out_dtype),
            mask=is_target & ~is_number,
        )


@triton.jit
def sum_terms(
    ce_ptr,
    ntl_ptr,
    scales_ptr,
    loss_ptr,
    ce_out_ptr,
    ntl_out_ptr,
    n_rows,
    constants_ptr,
    C: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One program: ``ce = s_ce·Σ ce_r``, ``ntl = s_ntl·Σ ntl_r`` and ``loss = ce + w·ntl``
    (``w = constants[0]``), summed in the same order on every call."""
    offsets = tl.arange(0, BLOCK)
    ce_total = tl.zeros([BLOCK], C)
    ntl_total = tl.zeros([BLOCK], C)
    for start in range(0, n_rows, BLOCK):
        rows = start + offsets
        ce_total += tl.load(ce_ptr + rows, mask=rows < n_rows, other=0.0)
        ntl_total += tl.load(ntl_ptr + rows, mask=rows < n_rows, other=0.0)
    ce = tl.sum(ce_total, 0) * tl.load(scales_ptr)
    ntl = tl.sum(ntl_total, 0) * tl.load(scales_ptr + 1)
    tl.store(ce_out_ptr, ce)
    tl.store(ntl_out_ptr, ntl)
    tl.store(loss_ptr, ce + tl.load(constants_ptr) * ntl)


@triton.jit
def scale_rows(
    grad_ptr,
    grad_row_stride,
    grad_column_stride,
    upstream_ptr,
    upstream_stride,
    labels_ptr,
    V,
    seq_len,
    ignore_index,
    SHIFT: tl.constexpr,
    STRIDED_COLUMNS: tl.constexpr,
    C: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """Row ``program_id(0)`` of the gradient (M, V) times its upstream gradient (row stride 0:
    one value for all rows), in the compute dtype, rounded once. Rows left alone (the loop runs
    0 times): those whose upstream gradient is exactly 1, and those whose label (``labels``
    (M,), the next position's with ``SHIFT``, as :func:`ce_ntl_rows` reads it) does not count,
    whose gradient :func:`ce_ntl_rows` wrote as zeros. ``STRIDED_COLUMNS``: a column stride
    other than 1 (offsets in int64)."""
    row = tl.program_id(0).to(tl.int64)
    label, _ = _label_and_weight(
        labels_ptr, labels_ptr, row, row >= 0, seq_len, ignore_index, SHIFT, False, C
    )
    counts = (label != ignore_index) & (label >= 0) & (label < V)
    upstream = tl.load(upstream_ptr + row * upstream_stride).to(C)
    row_grad = grad_ptr + row * grad_row_stride
    columns_to_scale = tl.where((upstream == 1.0) | ~counts, 0, V)
    for start in range(0, columns_to_scale, BLOCK_V):
        columns = start + tl.arange(0, BLOCK_V)
        at = row_grad + _column_offsets(columns, grad_column_stride, STRIDED_COLUMNS)
        block = tl.load(at, mask=columns < V, other=0.0).to(C)
        tl.store(at, (block * upstream).to(grad_ptr.dtype.element_ty), mask=columns < V)
