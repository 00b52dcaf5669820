"""cross_entropy_with_ntl against the unfused reference ``F.cross_entropy + w * number_token_loss``
(float64, values and gradients within 1e-9), gradcheck, low precision, chunking, torch.compile
and bad input."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from numtok import NumberTokenLoss, NumberVocab, number_token_loss
from numtok.losses import fused
from numtok.losses.fused import CEWithNTLOutput, CrossEntropyWithNTL, cross_entropy_with_ntl
from numtok.losses.linear import LinearCrossEntropyWithNTL, linear_cross_entropy_with_ntl
from numtok.ops.kernels import torch_rows

from cases import REFERENCE_CASES, VOCABS, make_batch, make_vocab

WEIGHT = 0.7
#: The backends every edge case and low-precision test runs on: the torch row passes and the
#: Triton kernels (under Triton's interpreter on CPU, natively on CUDA).
BACKENDS = ["torch", "triton"]


def shifted(labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    return torch.cat([labels[..., 1:], torch.full_like(labels[..., :1], ignore_index)], dim=-1)


def reference(
    logits: torch.Tensor,
    labels: torch.Tensor,
    vocab: NumberVocab,
    ntl_weight: float = WEIGHT,
    **settings: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(CE + w·NTL, CE) computed separately by PyTorch and by the unfused number_token_loss; with
    ``logit_softcap=c`` of the capped logits ``c·tanh(logits/c)``."""
    settings = dict(settings)
    softcap = settings.pop("logit_softcap", None)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    ignore_index = settings.get("ignore_index", -100)
    reduction = settings.get("reduction", "mean")
    ce_labels = shifted(labels, ignore_index) if settings.get("shift") else labels
    ce = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        ce_labels.reshape(-1),
        ignore_index=ignore_index,
        reduction="sum" if "num_items_in_batch" in settings else reduction,
    )
    if reduction == "none":
        ce = ce.reshape(labels.shape)
    elif "num_items_in_batch" in settings and reduction == "mean":
        ce = ce / settings["num_items_in_batch"]
    return ce + ntl_weight * number_token_loss(logits, labels, vocab, **settings), ce


def value_and_grads(
    fn: Callable[[], torch.Tensor], inputs: list[torch.Tensor]
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The value and the gradients for a fixed random upstream gradient (so that a "none"
    result is tested position by position)."""
    value = fn()
    upstream = torch.randn(value.shape, generator=torch.Generator().manual_seed(99)).to(value)
    return value.detach(), torch.autograd.grad(value, inputs, upstream)


def assert_fused_matches_reference(
    name: str,
    logits: torch.Tensor,
    labels: torch.Tensor,
    impl: str = "torch",
    other_paths: bool = True,
    **settings: Any,
) -> CEWithNTLOutput:
    """Value and gradient of ``impl`` against the reference; with ``other_paths`` also
    :func:`assert_other_paths_agree`."""
    vocab = make_vocab(name)
    outputs: list[CEWithNTLOutput] = []

    def fused() -> torch.Tensor:
        outputs.append(
            cross_entropy_with_ntl(logits, labels, vocab, ntl_weight=WEIGHT, impl=impl, **settings)
        )
        return outputs[-1].loss

    value, grads = value_and_grads(fused, [logits])
    ref_value, ref_grads = value_and_grads(
        lambda: reference(logits, labels, vocab, **settings)[0], [logits]
    )
    torch.testing.assert_close(value, ref_value, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(grads, ref_grads, rtol=1e-9, atol=1e-12)
    if other_paths:
        assert_other_paths_agree(vocab, logits, labels, outputs[-1], grads[0], impl, **settings)
    return outputs[-1]


def assert_other_paths_agree(
    vocab: NumberVocab,
    logits: torch.Tensor,
    labels: torch.Tensor,
    out: CEWithNTLOutput,
    grad: torch.Tensor,
    impl: str = "torch",
    **settings: Any,
) -> None:
    """``inplace_backward=True`` (on a non-leaf copy, as logits are in a model) gives the same
    value, terms and gradient, bit for bit; without autograd the values are the same."""
    leaf = logits.detach().clone().requires_grad_()
    inplace_outputs: list[CEWithNTLOutput] = []

    def inplace() -> torch.Tensor:
        inplace_outputs.append(
            cross_entropy_with_ntl(
                leaf.clone(),
                labels,
                vocab,
                ntl_weight=WEIGHT,
                inplace_backward=True,
                impl=impl,
                **settings,
            )
        )
        return inplace_outputs[-1].loss

    value, (inplace_grad,) = value_and_grads(inplace, [leaf])
    exactly = {"rtol": 0.0, "atol": 0.0}
    torch.testing.assert_close(value, out.loss.detach(), **exactly)
    torch.testing.assert_close(inplace_outputs[-1].ce, out.ce, **exactly)
    torch.testing.assert_close(inplace_outputs[-1].ntl, out.ntl, **exactly)
    torch.testing.assert_close(inplace_grad, grad, **exactly)
    with torch.no_grad():
        evaluation = cross_entropy_with_ntl(
            logits, labels, vocab, ntl_weight=WEIGHT, impl=impl, **settings
        )
    for term in ("loss", "ce", "ntl"):
        torch.testing.assert_close(
            getattr(evaluation, term), getattr(out, term).detach(), rtol=1e-12, atol=1e-14
        )


# ------------------------------------------------------------------ agreement with the reference


def on_device(
    device: torch.device, logits: torch.Tensor, labels: torch.Tensor, settings: dict[str, Any]
) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """A batch and its settings' tensors moved to ``device`` (the logits a leaf again)."""
    moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in settings.items()}
    return logits.detach().to(device).requires_grad_(), labels.to(device), moved


@pytest.mark.parametrize(("name", "shape", "seed", "settings"), REFERENCE_CASES)
def test_matches_reference(
    name: str, shape: tuple[int, ...], seed: int, settings: dict[str, Any], device: torch.device
) -> None:
    ignore_index = settings.get("ignore_index", -100)
    batch = make_batch(name, shape=shape, seed=seed, ignore_index=ignore_index)
    logits, labels, settings = on_device(device, *batch, settings)
    assert_fused_matches_reference(name, logits, labels, impl="torch", **settings)


#: Reference cases for the soft cap: each vocabulary with every kind or reweighing, the
#: reductions, squashing, weights and the shift.
SOFTCAP_CASES = [
    case
    for case in REFERENCE_CASES
    if case.id
    in {
        "digits-was-reweigh=True-mean",
        "chunks-mse-reweigh=True-none",
        "custom-huber-reweigh=False-sum",
        "chunks-squash=9.0-reweigh=True",
        "chunks-loss_weights-was-mean-shift=True",
        "digits-mae-reweigh=True-mean",
    }
]


@pytest.mark.parametrize("impl", BACKENDS)
@pytest.mark.parametrize(("name", "shape", "seed", "settings"), SOFTCAP_CASES)
def test_soft_capped_logits(
    name: str,
    shape: tuple[int, ...],
    seed: int,
    settings: dict[str, Any],
    impl: str,
    device: torch.device,
) -> None:
    """``logit_softcap=c``: the loss and gradient of the capped logits ``c·tanh(x/c)`` (a cap of
    3 on logits of spread 2 changes most of them), also in place and without a gradient."""
    assert len(SOFTCAP_CASES) == 6
    batch = make_batch(name, shape=shape, seed=seed)
    logits, labels, settings = on_device(device, *batch, settings)
    assert_fused_matches_reference(name, logits, labels, impl=impl, logit_softcap=3.0, **settings)


def _default_off_the_cpu(monkeypatch: pytest.MonkeyPatch, device: torch.device) -> list[int]:
    """``impl="auto"`` as on a GPU (PyTorch's cross-entropy beside the number head) also for CPU
    tensors; returns the list that counts the calls of that path."""
    if device.type == "cpu":
        monkeypatch.setattr(fused, "unfused_by_default", lambda impl, _: impl == "auto")
    calls: list[int] = []
    unfused = fused._cross_entropy_beside_the_number_head

    def counted(*args: Any) -> CEWithNTLOutput:
        calls.append(1)
        return unfused(*args)

    monkeypatch.setattr(fused, "_cross_entropy_beside_the_number_head", counted)
    return calls


@pytest.mark.parametrize(("name", "shape", "seed", "settings"), REFERENCE_CASES)
def test_auto_off_the_cpu_is_pytorchs_cross_entropy_beside_the_number_head(
    name: str,
    shape: tuple[int, ...],
    seed: int,
    settings: dict[str, Any],
    device: torch.device,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The GPU default, ``F.cross_entropy`` + NTL from the logits' number columns, equals the
    reference (and so the fused passes) on every case, soft cap included."""
    calls = _default_off_the_cpu(monkeypatch, device)
    ignore_index = settings.get("ignore_index", -100)
    batch = make_batch(name, shape=shape, seed=seed, ignore_index=ignore_index)
    logits, labels, settings = on_device(device, *batch, settings)
    assert_fused_matches_reference(name, logits, labels, impl="auto", other_paths=False, **settings)
    assert_fused_matches_reference(
        name, logits, labels, impl="auto", other_paths=False, logit_softcap=3.0, **settings
    )
    assert len(calls) == 2


def test_auto_off_the_cpu_in_low_precision(
    device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bfloat16 logits: the values summed in float32, the gradient in the logits' dtype, both
    as the fused passes give them to bfloat16 precision."""
    calls = _default_off_the_cpu(monkeypatch, device)
    vocab = make_vocab("chunks")
    logits, labels = make_batch("chunks", shape=(4, 9), seed=5, dtype=torch.bfloat16)
    logits, labels, _ = on_device(device, logits, labels, {})
    out = cross_entropy_with_ntl(logits, labels, vocab, shift=True, reweigh=True)
    (grad,) = torch.autograd.grad(out.loss, logits)
    assert out.loss.dtype == torch.float32 and grad.dtype == torch.bfloat16 and len(calls) == 1
    leaf = logits.detach().requires_grad_()
    expected = cross_entropy_with_ntl(leaf, labels, vocab, shift=True, reweigh=True, impl="torch")
    (expected_grad,) = torch.autograd.grad(expected.loss, leaf)
    torch.testing.assert_close(out.loss, expected.loss, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(grad.float(), expected_grad.float(), rtol=0, atol=2e-3)


def test_num_items_as_a_tensor() -> None:
    logits, labels = make_batch("digits", seed=2)
    assert_fused_matches_reference(
        "digits", logits, labels, num_items_in_batch=torch.tensor(11), reweigh=True
    )


def test_ce_and_ntl_terms_are_reported_detached() -> None:
    vocab = make_vocab("chunks")
    logits, labels = make_batch("chunks", seed=5)
    for reduction in ["mean", "none"]:
        out = cross_entropy_with_ntl(logits, labels, vocab, reweigh=True, reduction=reduction)
        ntl = number_token_loss(logits, labels, vocab, reweigh=True, reduction=reduction)
        _, ce = reference(logits, labels, vocab, reduction=reduction)
        assert not out.ce.requires_grad and not out.ntl.requires_grad
        torch.testing.assert_close(out.ce, ce.detach(), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(out.ntl, ntl.detach(), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(out.loss.detach(), out.ce + 0.3 * out.ntl)


def test_ntl_weight_zero_is_cross_entropy() -> None:
    vocab = make_vocab("digits")
    logits, labels = make_batch("digits", seed=6)
    out = cross_entropy_with_ntl(logits, labels, vocab, ntl_weight=0)
    assert float(out.ntl) > 0
    torch.testing.assert_close(
        out.loss, F.cross_entropy(logits.reshape(-1, 17), labels.reshape(-1))
    )


def assert_matches_finite_differences(
    fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, directions: int = 3
) -> None:
    """gradcheck's fast mode by hand, with one backward per forward (the gradient-in-forward
    path hands its gradient out once): ``<v, J u>`` from central differences of ``fn`` along
    random directions ``u`` equals ``<v J, u>`` from backward, for a random upstream ``v``."""
    generator = torch.Generator().manual_seed(17)
    x = x.detach()
    leaf = x.clone().requires_grad_()
    value = fn(leaf.clone())  # a non-leaf, as logits are in a model
    upstream = torch.randn(value.shape, generator=generator, dtype=value.dtype)
    (grad,) = torch.autograd.grad(value, leaf, upstream)
    eps = 1e-6
    for _ in range(directions):
        u = torch.randn(x.shape, generator=generator, dtype=x.dtype)
        plus, minus = fn((x + eps * u).requires_grad_()), fn((x - eps * u).requires_grad_())
        numeric = ((plus - minus).detach() * upstream).sum() / (2 * eps)
        torch.testing.assert_close((grad * u).sum(), numeric, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("name", list(VOCABS))
@pytest.mark.parametrize("kind", ["was", "mse", "huber"])
@pytest.mark.parametrize("reweigh", [False, True])
@pytest.mark.parametrize(("reduction", "inplace"), [("mean", False), ("none", True)])
def test_gradient_matches_finite_differences(
    name: str, kind: str, reweigh: bool, reduction: str, inplace: bool
) -> None:
    vocab = make_vocab(name)
    logits, labels = make_batch(name, shape=(2, 3), seed=7)
    weights = torch.rand(2, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    squash = 4.0 if kind == "was" else None

    def fn(x: torch.Tensor) -> torch.Tensor:
        return cross_entropy_with_ntl(
            x,
            labels,
            vocab,
            kind=kind,
            reweigh=reweigh,
            squash_factor=squash,
            loss_weights=weights,
            reduction=reduction,
            inplace_backward=inplace,
        ).loss

    assert_matches_finite_differences(fn, logits)


# ------------------------------------------------------------------ edge cases


@pytest.mark.parametrize("impl", BACKENDS)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_ignore_only_batch_gives_zero_and_zero_gradient(reduction: str, impl: str) -> None:
    """PyTorch's mean over no target is 0/0 = NaN; ours is 0, still connected to the graph."""
    vocab = make_vocab("digits")
    logits, _ = make_batch("digits")
    labels = torch.full((3, 5), -100)
    out = cross_entropy_with_ntl(
        logits, labels, vocab, reweigh=True, reduction=reduction, impl=impl
    )
    (grad,) = torch.autograd.grad(out.loss.sum(), logits)
    assert torch.all(out.loss == 0) and torch.all(out.ce == 0) and torch.all(out.ntl == 0)
    assert torch.all(grad == 0)


@pytest.mark.parametrize("impl", BACKENDS)
@pytest.mark.parametrize("reweigh", [False, True])
def test_batch_without_number_tokens_is_plain_cross_entropy(reweigh: bool, impl: str) -> None:
    vocab = make_vocab("digits")
    logits, _ = make_batch("digits")
    labels = torch.tensor([[0, 1, 2, 13, 16]] * 3)
    labels[1, 2] = -100
    assert_fused_matches_reference("digits", logits, labels, impl=impl, reweigh=reweigh)
    out = cross_entropy_with_ntl(logits, labels, vocab, reweigh=reweigh, impl=impl)
    assert float(out.ntl) == 0
    (grad,) = torch.autograd.grad(out.loss, logits)
    (ce_grad,) = torch.autograd.grad(
        F.cross_entropy(logits.reshape(-1, 17), labels.reshape(-1)), logits
    )
    torch.testing.assert_close(grad, ce_grad, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("impl", BACKENDS)
def test_masked_vocabulary_entries_give_no_nan(impl: str) -> None:
    """-inf logits (masked tokens, padded output layers), also on number tokens."""
    logits, labels = make_batch("chunks", shape=(2, 6), seed=8)
    masked = logits.detach().clone()
    masked[..., 50:] = -torch.inf  # padding columns beyond the tokenizer
    masked[0, :, 5] = -torch.inf  # the number token "5" masked in a whole sequence
    labels = torch.where(labels >= 50, 1, labels)
    labels[0] = torch.where(labels[0] == 5, 2, labels[0])
    masked.requires_grad_()
    for reweigh in [False, True]:
        assert_fused_matches_reference("chunks", masked, labels, impl=impl, reweigh=reweigh)


@pytest.mark.parametrize("impl", BACKENDS)
def test_fully_masked_ignored_position_gets_zero_gradient(impl: str) -> None:
    """A position whose every logit is -inf but whose label is ignored: 0 gradient there, where
    F.cross_entropy's backward gives NaN for the whole row."""
    vocab = make_vocab("chunks")
    logits, labels = make_batch("chunks", shape=(2, 6), seed=8)
    masked = logits.detach().clone()
    masked[1, 3] = -torch.inf
    labels[1, 3] = -100
    masked.requires_grad_()
    for reweigh in [False, True]:
        out = cross_entropy_with_ntl(masked, labels, vocab, reweigh=reweigh, impl=impl)
        (grad,) = torch.autograd.grad(out.loss, masked)
        assert torch.isfinite(out.loss) and torch.all(torch.isfinite(grad))
        assert torch.all(grad[1, 3] == 0)
        unmasked = cross_entropy_with_ntl(logits, labels, vocab, reweigh=reweigh, impl=impl)
        torch.testing.assert_close(out.loss, unmasked.loss, rtol=1e-12, atol=0)


def test_chunks_that_do_not_divide_the_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three rows per chunk over 5·7 = 35 rows: the last chunk is partial."""
    monkeypatch.setattr(torch_rows, "_CPU_CHUNK_ELEMENTS", 3 * 59 + 5)
    assert torch_rows.rows_per_chunk(59, torch.device("cpu")) == 3
    logits, labels = make_batch("chunks", shape=(5, 7), seed=9)
    for reduction in ["mean", "none"]:
        assert_fused_matches_reference("chunks", logits, labels, reweigh=True, reduction=reduction)
    bf16 = logits.detach().to(torch.bfloat16).requires_grad_()
    assert_close_to_float32_reference("chunks", bf16, labels)


@pytest.mark.parametrize("threads", [2, 3])
def test_threads_split_the_rows_and_agree_bit_for_bit(
    monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    """With T torch threads on CPU the chunks are shared among T Python threads, each running
    single-threaded kernels: the same numbers as one thread, the thread count restored after,
    also when a worker fails."""
    monkeypatch.setattr(torch_rows, "_CPU_CHUNK_ELEMENTS", 2 * 59)  # 2 rows per chunk
    vocab = make_vocab("chunks")
    logits, labels = make_batch("chunks", shape=(5, 7), seed=15)

    def run(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        leaf = logits.detach().to(dtype).requires_grad_()
        out = cross_entropy_with_ntl(leaf, labels, vocab, reweigh=True, reduction="none")
        (grad,) = torch.autograd.grad(out.loss.sum(), leaf)
        # Differentiable loss weights take the statistics/recompute pass (write_row_gradient).
        weights = torch.ones(5, 7, dtype=torch.float64, requires_grad=True)
        recomputed = cross_entropy_with_ntl(leaf, labels, vocab, loss_weights=weights).loss
        (recomputed_grad,) = torch.autograd.grad(recomputed, leaf)
        with torch.no_grad():
            evaluation = cross_entropy_with_ntl(leaf, labels, vocab, reduction="none").loss
        values = [out.loss.flatten(), recomputed.flatten(), evaluation.flatten()]
        return torch.cat([v.double() for v in values]), torch.stack([grad, recomputed_grad])

    for dtype in (torch.float64, torch.bfloat16):
        single = run(dtype)
        torch.set_num_threads(threads)
        try:
            several = run(dtype)
            assert torch.get_num_threads() == threads
        finally:
            torch.set_num_threads(1)
        torch.testing.assert_close(several, single, rtol=0, atol=0)

    torch.set_num_threads(threads)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            torch_rows._in_row_blocks(8, 2, torch.device("cpu"), _fail_on_the_last_block)
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(1)


def _fail_on_the_last_block(start: int, stop: int) -> None:
    if stop == 8:
        raise RuntimeError("boom")


# ------------------------------------------------------------------ low precision

# The fused path computes in float32 from the bfloat16/float16 logits, so its value matches a
# float32 reference on the same (upcast) logits to float32 rounding; its gradient is that float32
# gradient rounded once to the logits' dtype: within half a unit in the last place (2^-9 relative
# for bfloat16, 2^-11 for float16, plus float16's subnormal spacing 2^-24 near zero).
LOW_PRECISION = {torch.bfloat16: (2.0**-8, 1e-30), torch.float16: (2.0**-10, 2.0**-24)}


def gradient_tolerance(dtype: torch.dtype, impl: str, device: torch.device) -> tuple[float, float]:
    """(rtol, atol) of a gradient rounded once to ``dtype``. Triton's interpreter (the Triton
    kernels on CPU) converts float32 to bfloat16 by truncation, a whole unit in the last place,
    where the compiled kernels round to nearest (an LLVM fptrunc), as torch does."""
    rtol, atol = LOW_PRECISION[dtype]
    truncates = impl == "triton" and device.type == "cpu" and dtype == torch.bfloat16
    return (2 * rtol if truncates else rtol), atol


def assert_close_to_float32_reference(
    name: str,
    logits: torch.Tensor,
    labels: torch.Tensor,
    inplace: bool = False,
    impl: str = "torch",
    **settings: Any,
) -> None:
    """Value and gradient for a unit upstream gradient (rounded once to the logits' dtype)
    against the float32 reference; with ``inplace``, on a non-leaf copy of the logits."""
    vocab = make_vocab(name)
    grad_rtol, grad_atol = gradient_tolerance(logits.dtype, impl, logits.device)
    leaf = logits.detach().clone().requires_grad_()
    out = cross_entropy_with_ntl(
        leaf.clone(),
        labels,
        vocab,
        ntl_weight=WEIGHT,
        inplace_backward=inplace,
        impl=impl,
        **settings,
    )
    assert out.loss.dtype == torch.float32
    (grad,) = torch.autograd.grad(out.loss.sum(), leaf)
    assert grad.dtype == logits.dtype
    upcast = logits.detach().float().requires_grad_()
    ref, _ = reference(upcast, labels, vocab, **settings)
    (ref_grad,) = torch.autograd.grad(ref.sum(), upcast)
    torch.testing.assert_close(out.loss, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad.float(), ref_grad, rtol=grad_rtol, atol=grad_atol)


@pytest.mark.parametrize("impl", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", list(VOCABS))
@pytest.mark.parametrize("reweigh", [False, True])
@pytest.mark.parametrize("inplace", [False, True])
def test_low_precision_matches_float32_reference(
    dtype: torch.dtype, name: str, reweigh: bool, inplace: bool, impl: str, device: torch.device
) -> None:
    logits, labels = make_batch(name, shape=(4, 9), seed=10, dtype=torch.float32)
    low, labels, _ = on_device(device, logits.to(dtype), labels, {})
    assert_close_to_float32_reference(
        name, low, labels, inplace=inplace, impl=impl, reweigh=reweigh, shift=True
    )


@pytest.mark.parametrize("impl", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("inplace", [False, True])
def test_low_precision_with_an_upstream_gradient(
    dtype: torch.dtype, inplace: bool, impl: str, device: torch.device
) -> None:
    """Backward scales the gradient kept from forward by the upstream gradient (per position
    for "none"): rounded twice to the logits' dtype, so within one unit in the last place."""
    vocab = make_vocab("chunks")
    logits, labels = make_batch("chunks", shape=(4, 9), seed=14, dtype=torch.float32)
    upstream = torch.rand(4, 9, generator=torch.Generator().manual_seed(14)).to(device) + 0.5
    leaf, labels, _ = on_device(device, logits.to(dtype), labels, {})
    out = cross_entropy_with_ntl(
        leaf.clone(),
        labels,
        vocab,
        reweigh=True,
        reduction="none",
        inplace_backward=inplace,
        impl=impl,
    )
    (grad,) = torch.autograd.grad(out.loss, leaf, upstream)
    upcast = leaf.detach().float().requires_grad_()
    ref, _ = reference(upcast, labels, vocab, ntl_weight=0.3, reweigh=True, reduction="none")
    (ref_grad,) = torch.autograd.grad(ref, upcast, upstream)
    grad_rtol, grad_atol = gradient_tolerance(dtype, impl, device)
    torch.testing.assert_close(out.loss, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad.float(), ref_grad, rtol=2 * grad_rtol, atol=grad_atol)


def test_low_precision_is_not_upcast_as_a_whole() -> None:
    """The bf16 logits stay bf16: nothing is saved for backward, the one (M, V) buffer kept
    from forward to backward is the bf16 gradient, and that is what backward hands out."""
    vocab = make_vocab("digits")
    logits, labels = make_batch("digits", shape=(4, 9), seed=11, dtype=torch.bfloat16)
    saved: list[torch.Tensor] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = cross_entropy_with_ntl(logits, labels, vocab, reweigh=True)
    assert not [t for t in saved if t.numel() >= logits.numel()]
    kept = out.loss.grad_fn.gradient  # type: ignore[union-attr]
    assert kept.dtype == torch.bfloat16 and kept.numel() == logits.numel()
    out.loss.backward()
    assert logits.grad is not None and logits.grad.dtype == torch.bfloat16
    assert logits.grad.data_ptr() == kept.data_ptr()


# ------------------------------------------------------------------ torch.compile


@pytest.mark.slow  # the first inductor compilation in a process takes about 10 s
def test_torch_compile_matches_eager() -> None:
    torch._dynamo.reset()
    vocab = make_vocab("chunks")
    logits, labels = make_batch("chunks", shape=(2, 6), seed=12, dtype=torch.float32)

    def loss(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = cross_entropy_with_ntl(x, labels, vocab, reweigh=True, shift=True)
        return out.loss, out.ce, out.ntl

    compiled = torch.compile(loss)
    eager_values = loss(logits)
    compiled_values = compiled(logits)
    torch.testing.assert_close(compiled_values, eager_values)
    (eager_grad,) = torch.autograd.grad(eager_values[0], logits)
    (compiled_grad,) = torch.autograd.grad(compiled_values[0], logits)
    torch.testing.assert_close(compiled_grad, eager_grad)


def test_row_statistics_is_one_opaque_node_under_compile() -> None:
    """The custom ops trace (fake implementations, autograd) without graph breaks of their own:
    a full graph compiles when the label check is left out."""
    logits = torch.randn(5, 17, requires_grad=True)
    targets, number_ids = torch.tensor([3, 0, 7, 16, 4]), torch.arange(3, 13)

    def stats(x: torch.Tensor) -> torch.Tensor:
        lse, target_logit, number_logits = torch_rows.row_statistics(
            x, targets, number_ids, torch.float32
        )
        return (lse - target_logit).sum() + number_logits.square().sum()

    compiled = torch.compile(stats, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(logits), stats(logits))
    (eager_grad,) = torch.autograd.grad(stats(logits), logits)
    (compiled_grad,) = torch.autograd.grad(compiled(logits), logits)
    torch.testing.assert_close(compiled_grad, eager_grad)


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"logits": torch.zeros(3, 5, 17, dtype=torch.long)}, TypeError, "logits must be floating"),
        ({"labels": torch.zeros(3, 5)}, TypeError, "labels must be an integer"),
        ({"labels": torch.zeros(3, 4, dtype=torch.long)}, ValueError, "logits must have shape"),
        ({"logits": torch.zeros(3, 5, 16)}, ValueError, "vocab_size=17"),
        ({"labels": torch.full((3, 5), 17)}, ValueError, r"\[0, 17\).*got 17"),
        ({"ntl_weight": -0.1}, ValueError, "ntl_weight must be a finite number >= 0, got -0.1"),
        ({"ntl_weight": math.nan}, ValueError, "ntl_weight"),
        ({"ntl_weight": "0.3"}, TypeError, "ntl_weight must be a number"),
        ({"ntl_weight": True}, TypeError, "ntl_weight must be a number"),
        ({"kind": "l2"}, ValueError, "kind must be one of"),
        ({"kind": "number"}, ValueError, "cross_entropy_with_ntl does not take kind='number'"),
        ({"reduction": "avg"}, ValueError, "reduction must be one of"),
        ({"squash_factor": 1.0}, ValueError, "squash_factor"),
        ({"logit_softcap": 0.0}, ValueError, "logit_softcap must be a finite number > 0"),
        ({"logit_softcap": "30"}, TypeError, "logit_softcap must be a number > 0 or None"),
        (
            {"loss_weights": torch.ones(3, 4)},
            ValueError,
            "loss_weights must have the labels' shape",
        ),
        ({"loss_weights": -torch.ones(3, 5)}, ValueError, "loss_weights must be >= 0"),
        ({"num_items_in_batch": 0}, ValueError, "num_items_in_batch must be > 0"),
        ({"vocab": {3: "0"}}, TypeError, "vocab must be a NumberVocab"),
    ],
    ids=lambda value: str(value)[:40],
)
def test_bad_input(change: dict[str, Any], error: type[Exception], match: str) -> None:
    arguments: dict[str, Any] = {
        "logits": torch.zeros(3, 5, 17),
        "labels": torch.zeros(3, 5, dtype=torch.long),
        "vocab": make_vocab("digits"),
        **change,
    }
    with pytest.raises(error, match=match):
        cross_entropy_with_ntl(
            arguments.pop("logits"), arguments.pop("labels"), arguments.pop("vocab"), **arguments
        )


def test_the_modules_return_ce_plus_ntl() -> None:
    """CrossEntropyWithNTL is cross_entropy_with_ntl with the module's buffers, and
    LinearCrossEntropyWithNTL linear_cross_entropy_with_ntl; NumberTokenLoss returns NTL alone."""
    vocab = make_vocab("chunks")
    logits, labels = make_batch("chunks", seed=13)
    module = CrossEntropyWithNTL(vocab, reweigh=True, shift=True, ntl_weight=WEIGHT)
    out = module(logits, labels)
    assert isinstance(out, CEWithNTLOutput)
    ref = cross_entropy_with_ntl(logits, labels, vocab, ntl_weight=WEIGHT, reweigh=True, shift=True)
    torch.testing.assert_close(out.loss, ref.loss, rtol=0, atol=0)
    (grad,) = torch.autograd.grad(out.loss, logits)
    torch.testing.assert_close(grad, torch.autograd.grad(ref.loss, logits)[0], rtol=0, atol=0)
    assert f"ntl_weight={WEIGHT}" in repr(module)
    ntl = NumberTokenLoss(vocab, reweigh=True, shift=True)(logits, labels)
    assert isinstance(ntl, torch.Tensor)
    torch.testing.assert_close(ntl, ref.ntl, rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="ntl_weight must be a finite number >= 0"):
        CrossEntropyWithNTL(vocab, ntl_weight=-1.0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'ntl_weight'"):
        NumberTokenLoss(vocab, ntl_weight=WEIGHT)  # type: ignore[call-arg]

    hidden = torch.randn(*logits.shape[:-1], 6, dtype=logits.dtype, requires_grad=True)
    weight = torch.randn(logits.shape[-1], 6, dtype=logits.dtype, requires_grad=True)
    linear = LinearCrossEntropyWithNTL(vocab, reweigh=True, shift=True, chunk_size=4)
    out = linear(hidden, weight, labels)
    ref = linear_cross_entropy_with_ntl(
        hidden, weight, labels, vocab, reweigh=True, shift=True, chunk_size=4
    )
    torch.testing.assert_close(out.loss, ref.loss, rtol=0, atol=0)
    torch.testing.assert_close(
        torch.autograd.grad(out.loss, (hidden, weight)),
        torch.autograd.grad(ref.loss, (hidden, weight)),
        rtol=0,
        atol=0,
    )
    assert "chunk_size=4" in repr(linear)
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        LinearCrossEntropyWithNTL(vocab, chunk_size=0)
