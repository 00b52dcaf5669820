"""The Triton backend of cross_entropy_with_ntl (``impl="triton"``): every reference case against
the float64 reference, rows held on chip and rows read in blocks, in place, under torch.compile,
bad input, the dispatch's choices, refusals and fall-backs; and what the interpreter cannot
show: every launch of a set of public calls compiled as Triton's JIT compiles it for sm_90 and
sm_80, int64 addressing of strided columns, the GPU a launch runs on, the warps a ROCm program
gets. On CPU the kernels run in Triton's interpreter (conftest sets TRITON_INTERPRET=1); the
device tests run on a GPU in gpu.sh. (The edge cases and the low-precision tests of
test_fused.py run on both backends, as do float16 under a loss scale and a digit length without
float32 mass here.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
import triton.language as tl
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

import numtok.ops.kernels
from numtok import CrossEntropyWithNTL, NumberVocab
from numtok.losses.fused import cross_entropy_with_ntl
from numtok.losses.linear import linear_cross_entropy_with_ntl
from numtok.ops.kernels import dispatch, triton_loss, triton_rows

from cases import REFERENCE_CASES, make_batch, make_vocab
from test_fused import (
    WEIGHT,
    assert_fused_matches_reference,
    assert_matches_finite_differences,
    on_device,
    reference,
)
from test_linear import make_inputs

#: Every reference case whose kind the kernels compute (a callable kind stays on the torch path).
TRITON_CASES = [case for case in REFERENCE_CASES if not callable(case.values[3].get("kind"))]


def _cases(*ids: str) -> list[Any]:
    chosen = [case for case in TRITON_CASES if case.id in ids]
    assert len(chosen) == len(ids), "a case id below is not in REFERENCE_CASES"
    return chosen


#: Cases for the paths that must agree bit for bit (in place, evaluation), with rows on chip and
#: in blocks: reweighing, every reduction, squashing, weights and the shift.
OTHER_PATH_CASES = _cases(
    "chunks-huber-reweigh=True-none",
    "custom-huber-reweigh=True-none",
    "digits-squash=9.0-reweigh=True",
    "chunks-loss_weights-was-mean-shift=True",
    "custom-loss_weights-was-mean-shift=True",
    "chunks-mse-reweigh=True-sum",
)
#: The loop over blocks does not depend on the kind: each vocabulary once, and the Lp kinds'
#: groups and squashing once.
BLOCK_CASES = _cases(
    "digits-was-reweigh=True-mean",
    "chunks-was-reweigh=True-mean",
    "custom-was-reweigh=True-mean",
    "chunks-mse-reweigh=False-mean",
    "chunks-squash=1.5-reweigh=False",
)


@pytest.fixture
def first_tries(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The dispatch tries the Triton kernels on each device afresh, and warns afresh."""
    dispatch._first_failure.cache_clear()
    monkeypatch.setattr(dispatch, "_WARNED", set())
    yield
    dispatch._first_failure.cache_clear()


@pytest.fixture
def rows_in_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of 8 columns: every test vocabulary (11, 17 or 59 columns) is read in 2-8 blocks,
    the two-pass loop that rows longer than 32,768 columns take."""
    monkeypatch.setattr(triton_loss, "_MAX_BLOCK_V", 8)
    assert triton_loss._row_launch(11, 4, torch.float32)[0] == 8


def _run_case(
    device: torch.device, name: str, shape: tuple[int, ...], seed: int, settings: dict[str, Any]
) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    ignore_index = settings.get("ignore_index", -100)
    batch = make_batch(name, shape=shape, seed=seed, ignore_index=ignore_index)
    return on_device(device, *batch, settings)


@pytest.mark.parametrize(("name", "shape", "seed", "settings"), TRITON_CASES)
def test_matches_reference(
    name: str, shape: tuple[int, ...], seed: int, settings: dict[str, Any], device: torch.device
) -> None:
    logits, labels, settings = _run_case(device, name, shape, seed, settings)
    assert_fused_matches_reference(
        name, logits, labels, impl="triton", other_paths=False, **settings
    )


# Rows in blocks: 2-4 s a case in the interpreter, so slow; test_rows_in_blocks_match_reference and
# test_ignored_rows_are_not_read hold that path in make test.
@pytest.mark.parametrize(
    "blocks",
    [False, pytest.param(True, marks=pytest.mark.slow)],
    ids=["row-on-chip", "rows-in-blocks"],
)
@pytest.mark.parametrize(("name", "shape", "seed", "settings"), OTHER_PATH_CASES)
def test_in_place_and_evaluation_agree_bit_for_bit(
    name: str,
    shape: tuple[int, ...],
    seed: int,
    settings: dict[str, Any],
    blocks: bool,
    device: torch.device,
    request: pytest.FixtureRequest,
) -> None:
    if blocks:
        request.getfixturevalue("rows_in_blocks")
    logits, labels, settings = _run_case(device, name, shape, seed, settings)
    assert_fused_matches_reference(name, logits, labels, impl="triton", **settings)


@pytest.mark.parametrize(("name", "shape", "seed", "settings"), BLOCK_CASES)
def test_rows_in_blocks_match_reference(
    name: str,
    shape: tuple[int, ...],
    seed: int,
    settings: dict[str, Any],
    device: torch.device,
    rows_in_blocks: None,
) -> None:
    logits, labels, settings = _run_case(device, name, shape, seed, settings)
    assert_fused_matches_reference(
        name, logits, labels, impl="triton", other_paths=False, **settings
    )


@pytest.mark.parametrize("kind", ["was", "mse", "huber"])
@pytest.mark.parametrize("reweigh", [False, True])
@pytest.mark.parametrize(("reduction", "inplace"), [("mean", False), ("none", True)])
def test_gradient_matches_finite_differences(
    kind: str, reweigh: bool, reduction: str, inplace: bool
) -> None:
    vocab = make_vocab("chunks")
    logits, labels = make_batch("chunks", shape=(2, 3), seed=7)
    weights = torch.rand(2, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(7))

    def fn(x: torch.Tensor) -> torch.Tensor:
        return cross_entropy_with_ntl(
            x,
            labels,
            vocab,
            kind=kind,
            reweigh=reweigh,
            squash_factor=4.0 if kind == "was" else None,
            loss_weights=weights,
            reduction=reduction,
            inplace_backward=inplace,
            impl="triton",
        ).loss

    assert_matches_finite_differences(fn, logits, directions=2)


def test_logits_of_any_strides(device: torch.device) -> None:
    """Rows and columns with strides (a transposed tensor, every other row): read and written
    where they are, the gradient in the logits' own layout."""
    logits, labels = make_batch("chunks", shape=(4, 6), seed=16)
    transposed = logits.detach().reshape(24, 59).t().contiguous().t().to(device).requires_grad_()
    labels = labels.reshape(24).to(device)
    assert transposed.stride() == (1, 24)
    assert_fused_matches_reference(
        "chunks", transposed, labels, impl="triton", other_paths=False, reweigh=True
    )
    every_other = logits.detach().reshape(12, 2, 59)[:, 0].to(device).requires_grad_()
    labels = labels[::2].contiguous()
    assert_fused_matches_reference(
        "chunks", every_other, labels, impl="triton", other_paths=False, kind="mse"
    )


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_an_upstream_gradient_scales_the_gradient(reduction: str, device: torch.device) -> None:
    """The gradient is the upstream gradient (per position for "none") times the unit one: for
    "mean" backward multiplies the gradient from forward, and leaves it as forward wrote it for
    an upstream gradient of exactly 1; for "none" backward writes it with the upstream gradient
    in its coefficients (float64 here: equal up to its rounding)."""
    vocab = make_vocab("digits")
    logits, labels = make_batch("digits", shape=(3, 5), seed=18)
    logits, labels, _ = on_device(device, logits, labels, {})

    def gradient(upstream: float) -> torch.Tensor:
        out = cross_entropy_with_ntl(logits, labels, vocab, reduction=reduction, impl="triton")
        scale = torch.full(out.loss.shape, upstream, dtype=torch.float64, device=device)
        return torch.autograd.grad(out.loss, logits, scale)[0]

    unit = gradient(1.0)
    torch.testing.assert_close(gradient(2.5), 2.5 * unit, rtol=1e-14, atol=0)
    ref, _ = reference(logits, labels, vocab, ntl_weight=0.3, reduction=reduction)
    (ref_grad,) = torch.autograd.grad(ref, logits, torch.ones_like(ref))
    torch.testing.assert_close(unit, ref_grad, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("kind", ["mse", "mae", "huber"])
def test_a_digit_length_without_float32_mass_gives_the_float64_limit(kind: str, impl: str) -> None:
    """A 2-digit and a 3-digit label whose lengths' number logits lie about 120 below the
    1-digit ones: their share of the number mass, e^-120, is 0 in float32. The prediction
    within the label's length is still the softmax-weighted mean of its values (taken from the
    length's own maximum), the loss ``P·f + (1 - P)·D`` is D's limit, and both backends give
    the float64 reference's values and gradients (the Triton kernel gave 0/0 = NaN)."""
    vocab = make_vocab("chunks")
    logits = torch.zeros(2, 59)
    logits[:, :20] = 60.0  # "0".."9" twice
    logits[:, 20:35] = -60.0 + torch.linspace(0.0, 3.0, 15)  # 2 digits
    logits[:, 40:51] = -60.0 + torch.linspace(0.0, 2.0, 11)  # 3 digits
    labels = torch.tensor([27, 45])
    settings: dict[str, Any] = {"kind": kind, "reduction": "none"}
    float32 = logits.clone().requires_grad_()
    out = cross_entropy_with_ntl(float32, labels, vocab, ntl_weight=WEIGHT, impl=impl, **settings)
    (grad,) = torch.autograd.grad(out.loss.sum(), float32)
    float64 = logits.double().requires_grad_()
    ref, _ = reference(float64, labels, vocab, **settings)
    (ref_grad,) = torch.autograd.grad(ref.sum(), float64)
    torch.testing.assert_close(out.loss.double(), ref, rtol=1e-6, atol=0)
    torch.testing.assert_close(grad.double(), ref_grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_float16_under_a_loss_scale_keeps_the_small_gradient_entries(
    impl: str, inplace: bool
) -> None:
    """16 tokens of a batch of 32,768 (``num_items_in_batch``), 4,096 columns, GradScaler's
    2^16: for a unit upstream gradient most entries (softmax/32,768, about 7.5e-9) lie below
    float16's smallest subnormal 2^-24; scaled, above it. The gradient is the float32
    reference's times 2^16 rounded once to float16, with no entry flushed to 0 (95 % of those
    the reference keeps were 0 on both backends when the gradient was rounded in forward)."""
    vocab_size, tokens = 4096, 16
    vocab = NumberVocab.from_values({i: str(i) for i in range(10)}, vocab_size=vocab_size)
    generator = torch.Generator().manual_seed(21)
    logits = (2 * torch.randn(tokens, vocab_size, generator=generator)).half()
    labels = torch.randint(vocab_size, (tokens,), generator=generator)
    labels[::2] = torch.randint(10, (tokens // 2,), generator=generator)
    settings: dict[str, Any] = {"num_items_in_batch": 32768, "reweigh": True}
    loss_scale = torch.tensor(2.0**16)
    leaf = logits.clone().requires_grad_()
    out = cross_entropy_with_ntl(
        leaf.clone(), labels, vocab, ntl_weight=WEIGHT, inplace_backward=inplace, impl=impl,
        **settings,
    )  # fmt: skip
    (grad,) = torch.autograd.grad(out.loss, leaf, loss_scale)
    upcast = logits.float().requires_grad_()
    ref, _ = reference(upcast, labels, vocab, **settings)
    (ref_grad,) = torch.autograd.grad(ref, upcast, loss_scale)
    expected = ref_grad.half()
    kept = expected != 0
    assert float((ref_grad.abs() / loss_scale < 2.0**-24).float().mean()) > 0.9  # unscaled
    assert int((grad[kept] == 0).sum()) == 0
    torch.testing.assert_close(grad.float(), expected.float(), rtol=2.0**-10, atol=2.0**-24)


def _bfloat16_toward_zero(values: torch.Tensor) -> torch.Tensor:
    """``values`` rounded to bfloat16 as Triton's interpreter casts float32 to it: toward zero,
    the low 16 bits of the float32 value dropped (a GPU rounds to nearest, as PyTorch does)."""
    bits = values.float().view(torch.int32) & ~0xFFFF
    return bits.view(torch.float32).bfloat16()


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_a_per_position_bfloat16_gradient_is_rounded_once(impl: str) -> None:
    """``reduction="none"`` with upstream gradients of 1/3, 1/5, ... per position (a weighting):
    the bfloat16 gradient is the float64 reference's times the upstream gradient, rounded once
    (at most a few entries within a float32 ulp of a rounding boundary differ by one bfloat16
    ulp; on CPU the Triton kernels run in the interpreter, which rounds toward zero). Written in
    forward as if the upstream gradient were 1 and scaled in backward, it was rounded twice:
    27 % of the entries one ulp off on the torch backend, 49 % on the Triton one."""
    vocab_size, tokens = 512, 24
    vocab = NumberVocab.from_values({i: str(i) for i in range(10)}, vocab_size=vocab_size)
    generator = torch.Generator().manual_seed(23)
    logits = (2 * torch.randn(tokens, vocab_size, generator=generator)).bfloat16()
    labels = torch.randint(vocab_size, (tokens,), generator=generator)
    labels[::2] = torch.randint(10, (tokens // 2,), generator=generator)
    upstream = (1 / torch.arange(3, 3 + 2 * tokens, 2, dtype=torch.float64)).bfloat16()
    leaf = logits.clone().requires_grad_()
    out = cross_entropy_with_ntl(
        leaf, labels, vocab, ntl_weight=WEIGHT, reduction="none", reweigh=True, impl=impl
    )
    (grad,) = torch.autograd.grad(out.loss, leaf, upstream)
    upcast = logits.double().requires_grad_()
    ref, _ = reference(upcast, labels, vocab, reduction="none", reweigh=True)
    (ref_grad,) = torch.autograd.grad(ref, upcast, upstream.double())
    rounded = _bfloat16_toward_zero(ref_grad) if impl == "triton" else ref_grad.bfloat16()
    off = grad != rounded
    assert float(off.double().mean()) < 0.005


def test_an_empty_batch_gives_zero() -> None:
    vocab = make_vocab("digits")
    logits = torch.zeros(0, 17, dtype=torch.float64, requires_grad=True)
    labels = torch.zeros(0, dtype=torch.long)
    for reduction in ("mean", "sum", "none"):
        out = cross_entropy_with_ntl(logits, labels, vocab, reduction=reduction, impl="triton")
        expected = cross_entropy_with_ntl(logits, labels, vocab, reduction=reduction, impl="torch")
        torch.testing.assert_close(out.loss, expected.loss, rtol=0, atol=0)
        (grad,) = torch.autograd.grad(out.loss.sum(), logits)
        assert grad.shape == (0, 17)


# ------------------------------------------------------------------ torch.compile


@pytest.mark.parametrize("blocks", [False, True], ids=["row-on-chip", "rows-in-blocks"])
@pytest.mark.parametrize(
    ("reduction", "inplace"), [("mean", False), ("mean", True), ("none", False)]
)
def test_ignored_rows_are_not_read(
    reduction: str, inplace: bool, blocks: bool, request: Any
) -> None:
    """A row whose label is ``ignore_index`` has no loss and a zero gradient, so the kernels do
    not read it (as Liger's cross-entropy): NaN logits there change nothing, and its gradient
    rows are zeros, in forward's gradient (``"mean"``, also in place) and backward's
    (``"none"``). The kernels read such rows in full before: NaN everywhere."""
    if blocks:
        request.getfixturevalue("rows_in_blocks")
    vocab = make_vocab("chunks")
    logits, labels = make_batch("chunks", shape=(4, 6), seed=24)
    labels[:, ::3] = -100
    ignored = labels == -100
    clean = logits.detach().clone().requires_grad_()
    ref = cross_entropy_with_ntl(clean, labels, vocab, reduction=reduction, impl="torch")
    (ref_grad,) = torch.autograd.grad(ref.loss, clean, torch.ones_like(ref.loss))
    poisoned = logits.detach().clone()
    poisoned[ignored] = float("nan")
    leaf = poisoned.requires_grad_()
    out = cross_entropy_with_ntl(
        leaf.clone(), labels, vocab, reduction=reduction, inplace_backward=inplace, impl="triton"
    )
    (grad,) = torch.autograd.grad(out.loss, leaf, torch.ones_like(out.loss))
    torch.testing.assert_close(out.loss, ref.loss, rtol=1e-6, atol=1e-7)
    assert bool((grad[ignored] == 0).all())
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_torch_compile_keeps_one_graph_and_matches_eager(reduction: str) -> None:
    """Under torch.compile the loss is two opaque custom ops (forward; backward from the saved
    log-sum-exp): a full graph, the eager values and gradients."""
    torch._dynamo.reset()
    vocab = make_vocab("chunks")
    logits, labels = make_batch("chunks", shape=(2, 6), seed=12)
    weights = torch.rand(2, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(12))

    def loss(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = cross_entropy_with_ntl(
            x, labels, vocab, reweigh=True, shift=True, loss_weights=weights,
            reduction=reduction, impl="triton",
        )  # fmt: skip
        return out.loss, out.ce, out.ntl

    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
    eager_values = loss(logits)
    compiled_values = compiled(logits)
    torch.testing.assert_close(compiled_values, eager_values, rtol=1e-12, atol=1e-14)
    upstream = torch.rand(eager_values[0].shape, dtype=torch.float64) + 0.5
    (eager_grad,) = torch.autograd.grad(eager_values[0], logits, upstream)
    (compiled_grad,) = torch.autograd.grad(compiled_values[0], logits, upstream)
    torch.testing.assert_close(compiled_grad, eager_grad, rtol=1e-12, atol=1e-14)


# ------------------------------------------------------------------ bad input and dispatch


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"labels": torch.full((3, 5), 17)}, r"labels must be token ids in \[0, 17\).*got 17"),
        ({"labels": torch.full((3, 5), -3)}, r"got -3"),
        ({"loss_weights": -torch.ones(3, 5)}, "loss_weights must be >= 0"),
        ({"kind": lambda p, t: (p - t).abs()}, "impl='triton' does not compute a callable kind"),
        (
            {"loss_weights": torch.ones(3, 5, requires_grad=True)},
            "impl='triton' does not compute loss_weights that require grad",
        ),
        ({"impl": "cuda"}, r"impl must be one of \('auto', 'torch', 'triton'\), got 'cuda'"),
    ],
    ids=lambda value: str(value)[:30],
)
def test_bad_input_is_refused_as_on_the_torch_path(change: dict[str, Any], match: str) -> None:
    arguments: dict[str, Any] = {
        "labels": torch.zeros(3, 5, dtype=torch.long),
        "impl": "triton",
        **change,
    }
    with pytest.raises(ValueError, match=match):
        cross_entropy_with_ntl(torch.zeros(3, 5, 17), vocab=make_vocab("digits"), **arguments)


def _spy_on_triton(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    original = triton_loss.cross_entropy_with_ntl

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(triton_loss, "cross_entropy_with_ntl", counted)
    return calls


def test_auto_runs_no_triton_kernel_until_one_has_run_on_a_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``"auto"``: the torch row passes on CPU; off the CPU ``F.cross_entropy`` beside the number
    head for given logits (``unfused_by_default``) and the torch row passes for logits-free
    losses; Triton only when asked for (``impl="triton"`` or ``$NUMTOK_IMPL=triton``)."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.delenv(dispatch.IMPL_VARIABLE, raising=False)
    monkeypatch.setattr(dispatch, "triton_importable", lambda: True)
    monkeypatch.setattr(dispatch, "_first_failure", lambda device: None)  # a GPU that runs it
    assert dispatch.resolve_impl("auto", cuda) == "torch"
    assert dispatch.resolve_impl("auto", cpu) == "torch"  # also under the interpreter
    assert dispatch.unfused_by_default("auto", cuda)
    assert not dispatch.unfused_by_default("auto", cpu)
    assert not dispatch.unfused_by_default("torch", cuda)
    assert not dispatch.unfused_by_default("triton", cuda)
    assert dispatch.resolve_impl("torch", cuda) == "torch"
    assert dispatch.resolve_impl("triton", cuda) == "triton"
    monkeypatch.setenv(dispatch.IMPL_VARIABLE, "triton")
    assert dispatch.resolve_impl("auto", cuda) == "triton"
    assert dispatch.resolve_impl("auto", cuda, "a callable kind ('f')") == "torch"
    assert not dispatch.unfused_by_default("auto", cuda)
    monkeypatch.setenv(dispatch.IMPL_VARIABLE, "torch")
    assert dispatch.resolve_impl("auto", cuda) == "torch"
    assert not dispatch.unfused_by_default("auto", cuda)
    assert dispatch.resolve_impl("triton", cuda) == "triton"  # an explicit impl wins
    monkeypatch.setenv(dispatch.IMPL_VARIABLE, "gpu")
    with pytest.raises(ValueError, match=r"\$NUMTOK_IMPL must be one of .* got 'gpu'"):
        dispatch.resolve_impl("auto", cpu)
    monkeypatch.setattr(dispatch, "triton_importable", lambda: False)
    monkeypatch.delenv(dispatch.IMPL_VARIABLE)
    assert dispatch.resolve_impl("auto", cuda) == "torch"
    with pytest.raises(ModuleNotFoundError, match="impl='triton' needs triton: pip install triton"):
        dispatch.resolve_impl("triton", cuda)


def test_triton_on_cpu_needs_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match=r"runs on CUDA tensors.*TRITON_INTERPRET=1"):
        dispatch.resolve_impl("triton", torch.device("cpu"))


def test_numtok_impl_triton_falls_back_where_triton_does_not_import(
    monkeypatch: pytest.MonkeyPatch, first_tries: None
) -> None:
    """triton installed but failing to import (here: hidden, so that ``import triton``
    raises): ``$NUMTOK_IMPL=triton`` computes with the torch row passes and warns once;
    ``impl="triton"`` raises an error that says why."""
    monkeypatch.setitem(sys.modules, "triton", None)
    for module in ("triton_loss", "triton_rows"):
        monkeypatch.delitem(sys.modules, f"numtok.ops.kernels.{module}")
        monkeypatch.delattr(numtok.ops.kernels, module)
    vocab = make_vocab("digits")
    logits, labels = make_batch("digits", seed=23)
    expected = cross_entropy_with_ntl(logits, labels, vocab, impl="torch").loss
    monkeypatch.setenv(dispatch.IMPL_VARIABLE, "triton")
    with pytest.warns(RuntimeWarning) as warned:
        for _ in range(2):
            loss = cross_entropy_with_ntl(logits, labels, vocab).loss
            torch.testing.assert_close(loss, expected, rtol=0, atol=0)
    assert len(warned) == 1
    assert re.fullmatch(
        r"\$NUMTOK_IMPL=triton, but impl='triton' cannot run on cpu: ModuleNotFoundError: "
        r"import of triton halted; None in sys.modules; use impl='torch'; computing with the "
        r"torch row passes on cpu instead",
        str(warned[0].message),
    ), warned[0].message
    with pytest.raises(RuntimeError, match=r"impl='triton' cannot run on cpu: ModuleNotFound"):
        cross_entropy_with_ntl(logits, labels, vocab, impl="triton")


def test_numtok_impl_triton_falls_back_where_the_first_launch_fails(
    monkeypatch: pytest.MonkeyPatch, first_tries: None
) -> None:
    """On a GPU Triton compiles for its architecture and builds its launcher with the host's
    C compiler at the first launch; where that fails, ``$NUMTOK_IMPL=triton`` takes the torch
    row passes (one warning for each device) and ``impl="triton"`` raises, naming the device
    and the failure. Tried once per device."""
    tries: list[torch.device] = []

    def no_compiler(device: torch.device) -> None:
        tries.append(device)
        raise RuntimeError("Failed to find C compiler. Please specify via CC environment variable")

    monkeypatch.setattr(triton_loss, "check_launch", no_compiler)
    monkeypatch.setenv(dispatch.IMPL_VARIABLE, "triton")
    gpus = [torch.device("cuda", 0), torch.device("cuda", 1)]
    with pytest.warns(RuntimeWarning, match="Failed to find C compiler") as warned:
        for _ in range(3):
            assert [dispatch.resolve_impl("auto", gpu) for gpu in gpus] == ["torch", "torch"]
    assert [str(w.message).split(": ")[0] for w in warned] == [
        f"$NUMTOK_IMPL=triton, but impl='triton' cannot run on {gpu}" for gpu in gpus
    ]
    with pytest.raises(RuntimeError, match=r"cannot run on cuda:1: RuntimeError: Failed to find C"):
        dispatch.resolve_impl("triton", gpus[1])
    assert tries == gpus
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # and CPU tensors without the interpreter
    with pytest.warns(RuntimeWarning, match="runs on CUDA tensors, got tensors on cpu"):
        assert dispatch.resolve_impl("auto", torch.device("cpu")) == "torch"


def test_numtok_impl_sets_what_auto_means(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _spy_on_triton(monkeypatch)
    vocab = make_vocab("digits")
    logits, labels = make_batch("digits", seed=19)
    cross_entropy_with_ntl(logits, labels, vocab)
    assert calls == []
    monkeypatch.setenv(dispatch.IMPL_VARIABLE, "triton")
    out = cross_entropy_with_ntl(logits, labels, vocab, ntl_weight=WEIGHT)
    assert calls == [1]
    torch.testing.assert_close(out.loss, reference(logits, labels, vocab)[0], rtol=1e-9, atol=0)
    cross_entropy_with_ntl(logits, labels, vocab, kind=lambda p, t: (p - t).abs())  # torch path
    assert calls == [1]


def test_the_module_takes_impl(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _spy_on_triton(monkeypatch)
    vocab = make_vocab("chunks")
    logits, labels = make_batch("chunks", seed=13)
    module = CrossEntropyWithNTL(vocab, reweigh=True, ntl_weight=WEIGHT, impl="triton")
    out = module(logits, labels)
    assert calls == [1] and "impl='triton'" in repr(module)
    ref, _ = reference(logits, labels, vocab, reweigh=True)
    torch.testing.assert_close(out.loss, ref, rtol=1e-9, atol=0)
    with pytest.raises(ValueError, match="impl must be one of"):
        CrossEntropyWithNTL(vocab, ntl_weight=WEIGHT, impl="fast")


# ------------------------------------------------------------------ the GPU without a GPU

_KERNELS = ("prepare_rows", "ce_ntl_rows", "sum_terms", "scale_rows")


class _OnSecondGpu(torch.Tensor):
    """A CPU tensor that says it is on cuda:1 (what the launch code reads of a device)."""

    @property  # type: ignore[override]
    def device(self) -> torch.device:
        return torch.device("cuda", 1)


def _second_gpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and not isinstance(value, _OnSecondGpu):
        return value.as_subclass(_OnSecondGpu)
    return value


class _AsIfOnSecondGpu(TorchFunctionMode):
    """Runs every torch call on the CPU, with CUDA devices asked for (``device=``, ``.to``)
    replaced by the CPU, and hands out its tensors as :class:`_OnSecondGpu`."""

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        def on_cpu(value: Any) -> Any:
            is_cuda = isinstance(value, torch.device) and value.type == "cuda"
            is_cuda |= isinstance(value, str) and value.startswith("cuda")
            return torch.device("cpu") if is_cuda else value

        kwargs = {k: on_cpu(v) for k, v in (kwargs or {}).items()}
        if func is torch.Tensor.to:
            args = tuple(on_cpu(a) for a in args)
        return tree_map(_second_gpu, func(*args, **kwargs))


class _CurrentDevice:
    """Stands in for ``torch.cuda.device`` (which needs a GPU): a context that makes its
    device's index the current one (``current``, 0 outside every context)."""

    current: ClassVar[list[int]] = [0]

    def __init__(self, device: torch.device) -> None:
        self.index = torch.device(device).index

    def __enter__(self) -> None:
        self.current.append(self.index)

    def __exit__(self, *_: object) -> None:
        self.current.pop()


@pytest.mark.parametrize(
    ("dtype", "settings", "kernels"),
    [
        (torch.float32, {"reweigh": True}, ["prepare_rows", "ce_ntl_rows", "sum_terms"]),
        # float16: the gradient in backward; "none": no reduction.
        (torch.float16, {"reduction": "none", "kind": "dist2"}, ["prepare_rows", "ce_ntl_rows"]),
    ],
    ids=["float32", "float16-none"],
)
def test_kernels_launch_on_the_tensors_gpu(
    dtype: torch.dtype,
    settings: dict[str, Any],
    kernels: list[str],
    monkeypatch: pytest.MonkeyPatch,
    first_tries: None,
) -> None:
    """Triton launches on the current CUDA device, not on the tensors': logits on cuda:1 (a
    model split over GPUs) with cuda:0 current would be read on the wrong GPU. Without a GPU:
    the loss's own code runs on tensors that report cuda:1 (CPU tensors underneath, the
    kernels in the interpreter), ``torch.cuda.device`` records the device it makes current,
    and every launch (the dispatch's first, forward, backward; float16's gradient in backward
    too) happens with cuda:1 current and gives the values of the torch backend. (What autograd
    saves comes back a plain CPU tensor, so the fake reaches backward through what the call
    keeps itself: its labels, whose device its launches take.)"""
    seen: list[tuple[str, int]] = []

    def on_which_gpu(kernel: Any) -> Any:
        class Launch:
            def __getitem__(self, grid: tuple[int, ...]) -> Any:
                def launch(*args: Any, **kwargs: Any) -> None:
                    seen.append((kernel.__name__, _CurrentDevice.current[-1]))
                    with torch._C.DisableTorchFunction():
                        cpu = [
                            a.as_subclass(torch.Tensor) if isinstance(a, torch.Tensor) else a
                            for a in args
                        ]
                        kernel[grid](*cpu, **kwargs)

                return launch

        return Launch()

    for name in _KERNELS:
        monkeypatch.setattr(triton_rows, name, on_which_gpu(getattr(triton_rows, name)))
    monkeypatch.setattr(torch.cuda, "device", _CurrentDevice)
    vocab = make_vocab("chunks")
    logits, labels = make_batch("chunks", seed=22, dtype=dtype)
    expected = cross_entropy_with_ntl(logits, labels, vocab, impl="torch", **settings)
    try:
        with _AsIfOnSecondGpu():
            logits = logits.detach().as_subclass(_OnSecondGpu).requires_grad_()
            labels = labels.as_subclass(_OnSecondGpu)
            out = cross_entropy_with_ntl(logits, labels, vocab, impl="triton", **settings)
            upstream = torch.rand(out.loss.shape)
            torch.autograd.grad(out.loss, logits, upstream)
    finally:
        triton_loss._constants_on.cache_clear()
    # The dispatch's first launch on cuda:1, forward, backward.
    backward = "ce_ntl_rows" if dtype == torch.float16 else "scale_rows"
    assert seen == [(name, 1) for name in ["scale_rows", *kernels, backward]]
    torch.testing.assert_close(out.loss.as_subclass(torch.Tensor), expected.loss)


@pytest.mark.device
def test_no_host_synchronisation_on_cuda(device: torch.device) -> None:
    """A training step's loss, forward and backward, from the logits and logits-free, never
    waits for the GPU: the label and weight checks are device-side asserts (after a first call,
    which builds the constants and tries cuBLAS's float32 output once)."""
    if device.type != "cuda":
        pytest.skip("torch.cuda.set_sync_debug_mode exists on CUDA only; gpu.sh runs this")
    vocab = make_vocab("chunks")
    logits, labels = make_batch("chunks", shape=(4, 9), seed=20, dtype=torch.bfloat16)
    logits, labels, _ = on_device(device, logits, labels, {})
    hidden = torch.randn(4, 9, 8, device=device, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(59, 8, device=device, dtype=torch.bfloat16, requires_grad=True)
    weights = torch.rand(4, 9, device=device)
    settings = {"reweigh": True, "shift": True, "loss_weights": weights, "impl": "triton"}

    def losses(num_items: torch.Tensor | None) -> list[torch.Tensor]:
        fused = cross_entropy_with_ntl(
            logits, labels, vocab, num_items_in_batch=num_items, **settings
        )
        linear = linear_cross_entropy_with_ntl(
            hidden, weight, labels, vocab, num_items_in_batch=num_items, chunk_size=16, **settings
        )
        return [fused.loss, linear.loss]

    for num_items in (None, torch.tensor(17, device=device)):
        losses(num_items)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for loss in losses(num_items):
                loss.backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize(("hip", "most"), [(None, 32), ("6.2.41133", 16)], ids=["cuda", "rocm"])
def test_a_row_program_has_at_most_1024_threads(
    hip: str | None, most: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows of 32,768 columns or more take 32 warps of 32 threads on NVIDIA GPUs; AMD's
    wavefronts are 64 wide, and 32 of them (2,048 threads) cannot launch: ROCm builds of torch
    (``torch.version.hip``) get 16, the same 32 columns a thread."""
    monkeypatch.setattr(torch.version, "hip", hip)
    for vocab_size in (32768, 131072, 262144):
        for dtype in (torch.bfloat16, torch.float32):
            block_v, _, _, num_warps = triton_loss._row_launch(vocab_size, 1110, dtype)
            assert num_warps == most
            assert block_v // (num_warps * (1024 // most)) == 32  # columns a thread


# ------------------------------------------------------------------ what the GPU's JIT compiles

_JIT_COMPILE = Path(__file__).with_name("_jit_compile.py")


def _described(value: Any) -> Any:
    """A launch argument as tests/_jit_compile.py reads it: a tensor by its dtype and address
    (all the JIT's binder reads of it), a ``tl`` dtype by its name, a scalar as itself."""
    if isinstance(value, torch.Tensor):
        return {"tensor": str(value.dtype).removeprefix("torch."), "data_ptr": value.data_ptr()}
    if isinstance(value, tl.dtype):
        return {"tl": value.name}
    return value


class _LaunchRecorder:
    """Stands in for a kernel of ``triton_rows``: records each launch's arguments as they are
    at the launch, then runs it (in the interpreter)."""

    def __init__(self, kernel: Any, launches: list[dict[str, Any]]) -> None:
        self.kernel, self.launches = kernel, launches

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        launch = self.kernel[grid]

        def record(*args: Any, **kwargs: Any) -> Any:
            self.launches.append(
                {
                    "kernel": self.kernel.__name__,
                    "args": [_described(a) for a in args],
                    "kwargs": {k: _described(v) for k, v in kwargs.items()},
                }
            )
            return launch(*args, **kwargs)

        return record


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every launch of a kernel of ``triton_rows`` during the test, in order."""
    recorded: list[dict[str, Any]] = []
    for name in _KERNELS:
        recorder = _LaunchRecorder(getattr(triton_rows, name), recorded)
        monkeypatch.setattr(triton_rows, name, recorder)
    return recorded


def _compile_as_the_jit(
    launches: list[dict[str, Any]], capabilities: list[int], ttir: bool = False
) -> list[dict[str, Any]]:
    """The variants of ``launches`` that Triton's JIT would build for those CUDA capabilities,
    each compiled to a cubin in a process without the interpreter (tests/_jit_compile.py)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, str(_JIT_COMPILE)],
        input=json.dumps({"targets": capabilities, "launches": launches, "ttir": ttir}),
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    variants: list[dict[str, Any]] = json.loads(result.stdout)["variants"]
    return variants


_BIG_DIGITS = NumberVocab.from_values({i: str(i) for i in range(10)}, vocab_size=32768)
#: 1,110 number tokens (1-3 digits) in Qwen-sized rows of 131,072 columns: rows in blocks.
_BIG_CHUNKS = NumberVocab.from_values(
    {i: str(i) for i in range(10)}
    | {10 + i: f"{i:03d}" for i in range(1000)}
    | {1010 + i: f"{i:02d}" for i in range(100)},
    vocab_size=131072,
)

#: (dtype, upstream gradient (None: evaluation), settings, ignore_index) of the calls below:
#: every reduction and way of setting its scale (the counts, and num_items_in_batch as an int,
#: 1 among them, and as a tensor), shift, weights, reweigh, squash, soft cap, in place, upstream
#: gradients of 1, 2^16 (GradScaler's), 0.5 and one per position; the float64 ones apart.
_LOW_PRECISION_CALLS: list[tuple[torch.dtype, Any, dict[str, Any], int]] = [
    (torch.bfloat16, 1.0, {"reweigh": True, "shift": True, "loss_weights": True}, -100),
    (torch.float32, "per-row", {"reduction": "none", "squash_factor": 3.0}, -100),
    (torch.float16, 2.0**16, {"num_items_in_batch": 1, "inplace_backward": True}, -100),
    (torch.bfloat16, None, {"reduction": "sum", "logit_softcap": 2.0}, -100),
]
_FLOAT64_CALLS: list[tuple[torch.dtype, Any, dict[str, Any], int]] = [
    (torch.float64, 0.5, {"num_items_in_batch": torch.tensor(7), "logit_softcap": 2.0}, 0),
    (torch.float64, None, {"reweigh": True, "num_items_in_batch": 5, "squash_factor": 2.0}, 0),
]


def _given_logits(
    vocab: NumberVocab, logits: torch.Tensor, labels: torch.Tensor, upstream: Any, **settings: Any
) -> None:
    """One call of the public loss with ``impl="triton"`` (``loss_weights=True``: random ones)
    and, unless ``upstream`` is None, its backward with that upstream gradient."""
    if settings.get("loss_weights") is True:
        settings["loss_weights"] = torch.rand(labels.shape, dtype=torch.float64)
    logits.requires_grad_(upstream is not None)
    out = cross_entropy_with_ntl(logits.clone(), labels, vocab, impl="triton", **settings)
    if upstream == "per-row":
        torch.autograd.grad(out.loss, logits, torch.rand_like(out.loss))
    elif upstream is not None:
        torch.autograd.grad(out.loss, logits, torch.full_like(out.loss, upstream))


def _public_calls() -> None:
    """The calls of the public functions whose launches the compile test records: each kind
    on a single-digit and on a multi-digit vocabulary, once in float64 and once in a low
    precision (the settings above in turn), and on a vocabulary of one number token; sequences
    of one position, a batch of one and strided logits; the shapes of a real model (32,768
    and 131,072 columns: rows on chip at 32 warps and in blocks, SMMD with 1,110 number
    tokens); the logits-free loss in chunks of one row (row offsets 0, 1, 2, 3);
    torch.compile's two custom ops."""
    generator = torch.Generator().manual_seed(0)
    one_number = NumberVocab.from_values({2: "7"}, vocab_size=16)
    for index, kind in enumerate(triton_loss.KIND_CODES):
        names = ("digits", "chunks")[:: 1 if index % 2 else -1]
        calls = (_LOW_PRECISION_CALLS[index % 4], _FLOAT64_CALLS[index % 2])
        for name, (dtype, upstream, settings, ignore_index) in zip(names, calls, strict=True):
            # Squashing is WAS's alone, reweighing NTL's kinds' (not numtok.maths.kinds').
            unused = {"reweigh"} if kind in ("del", "smmd", "dist2") else set()
            unused |= set() if kind == "was" else {"squash_factor"}
            chosen = {k: v for k, v in settings.items() if k not in unused}
            logits, labels = make_batch(name, (1, 4), 3, dtype, ignore_index)
            _given_logits(
                make_vocab(name), logits.detach(), labels, upstream, kind=kind,
                ignore_index=ignore_index, **chosen,
            )  # fmt: skip
        if kind in ("was", "del", "smmd", "dist2"):
            logits = torch.randn(1, 4, 16, generator=generator)
            _given_logits(one_number, logits, torch.tensor([[2, 5, 2, -100]]), 1.0, kind=kind)
    vocab = make_vocab("chunks")
    logits, labels = make_batch("chunks", shape=(4, 1), seed=4, dtype=torch.float32)
    _given_logits(vocab, logits.detach(), labels, 1.0, shift=True, kind="mse")
    _given_logits(vocab, logits.detach()[0], labels[0], 1.0, reweigh=True)
    strided = logits.detach().reshape(4, 59).t().contiguous().t()
    _given_logits(vocab, strided, labels.reshape(4), 2.0, kind="huber")

    labels = torch.tensor([[3, 1020]])
    for big, dtype, upstream, settings in [
        (_BIG_DIGITS, torch.bfloat16, 1.0, {"reweigh": True, "squash_factor": 3.0}),
        (_BIG_DIGITS, torch.float16, 2.0**16, {"kind": "dist2", "shift": True}),
        (_BIG_DIGITS, torch.float64, None, {"kind": "mae"}),
        (_BIG_CHUNKS, torch.float32, "per-row", {"kind": "mse", "reduction": "none"}),
        (_BIG_CHUNKS, torch.bfloat16, None, {"kind": "huber", "logit_softcap": 30.0}),
        (_BIG_CHUNKS, torch.bfloat16, 1.0, {"kind": "smmd", "loss_weights": True}),
    ]:
        logits = torch.randn(1, 2, big.vocab_size, generator=generator).to(dtype)
        _given_logits(big, logits, labels, upstream, **settings)

    hidden, weight, _, labels = make_inputs("chunks", (1, 4), 5, torch.bfloat16, False)
    out = linear_cross_entropy_with_ntl(
        hidden, weight, labels, vocab, chunk_size=1, kind="del", impl="triton"
    )
    torch.autograd.grad(out.loss, [hidden, weight])

    torch._dynamo.reset()
    logits, labels = make_batch("chunks", shape=(1, 4), seed=12, dtype=torch.float32)

    def loss(x: torch.Tensor) -> torch.Tensor:
        out = cross_entropy_with_ntl(x, labels, vocab, reduction="none", impl="triton")
        return out.loss

    value = torch.compile(loss, backend="aot_eager", fullgraph=True)(logits)
    torch.autograd.grad(value, logits, torch.rand_like(value))


@pytest.mark.slow  # 40-55 s on 2 shared cores, 8-16 s with Triton's cache warm: 116 binaries
def test_every_launch_compiles_as_triton_s_jit_compiles_it_for_sm_90_and_sm_80(
    launches: list[dict[str, Any]],
) -> None:
    """Each launch that the public calls above make, specialised on its arguments as Triton's
    JIT specialises them on a GPU (an int equal to 1 a constant, ints and pointers divisible by
    16 marked so) and compiled through Triton's full pipeline to a cubin for sm_90 (H100, H200)
    and sm_80 (A100): what the interpreter cannot see (types after specialisation, layouts,
    register allocation) checked without a GPU."""
    _public_calls()
    variants = _compile_as_the_jit(launches, [90, 80])
    failures = [v for v in variants if "error" in v]
    assert not failures, "\n".join(
        f"{v['kernel']} for sm_{v['capability']} with constants {v['constants']}: {v['error']}"
        for v in failures
    )
    for capability in (90, 80):
        compiled = {v["kernel"] for v in variants if v["capability"] == capability}
        assert compiled == set(_KERNELS)
    # The JIT's specialisations happened: the cases above make these ints 1 (constants) ...
    constants = {(v["kernel"], name) for v in variants for name in v["constants"]}
    for kernel, name in [
        ("prepare_rows", "denominator"),
        ("prepare_rows", "seq_len"),
        ("ce_ntl_rows", "logits_column_stride"),
        ("ce_ntl_rows", "first_row"),
        ("ce_ntl_rows", "upstream_stride"),
        ("ce_ntl_rows", "K"),
    ]:
        assert (kernel, name) in constants
    # ... and these arguments divisible by 16 in some variants, not in others.
    divisible = [set(v["divisible"]) for v in variants if v["kernel"] == "ce_ntl_rows"]
    assert any("V" in d for d in divisible) and not all("V" in d for d in divisible)
    assert all("logits_ptr" in d for d in divisible)


@pytest.mark.slow  # about 5 s: two calls in the interpreter, five compilations
def test_strided_columns_are_addressed_in_int64_as_compiled(
    launches: list[dict[str, Any]],
) -> None:
    """Logits (and a gradient) whose last dimension has a stride other than 1 (columns of a
    transposed buffer) are addressed at ``column · stride``, which passes 2^31 for a stride of
    2^27 + 1 and 17 columns: compiled as the JIT compiles the recorded launches with that
    stride (an i32 argument), every block of row pointers is offset in int64. (The
    interpreter computes in numpy's integers and cannot show an int32 overflow, and a buffer
    that large does not fit here.)"""
    vocab = make_vocab("digits")
    logits, labels = make_batch("digits", shape=(4, 6), seed=16, dtype=torch.float32)
    transposed = logits.detach().reshape(24, 17).t().contiguous().t()
    _given_logits(vocab, transposed, labels.reshape(24), 2.0, reweigh=True)
    _given_logits(vocab, transposed, labels.reshape(24), None, kind="mse")
    wide = 2**27 + 1
    assert wide < 2**31 <= wide * 16
    strided = []
    for launch in launches:
        if launch["kernel"] in ("ce_ntl_rows", "scale_rows"):
            names = getattr(triton_rows, launch["kernel"]).kernel.arg_names
            for index, name in enumerate(names):
                if name.endswith("column_stride"):
                    assert launch["args"][index] == 24
                    launch["args"][index] = wide
            strided.append(launch)
    variants = _compile_as_the_jit(strided, [90], ttir=True)
    assert {v["kernel"] for v in variants} == {"ce_ntl_rows", "scale_rows"}
    for variant in variants:
        assert "error" not in variant, variant["error"]
        # tt.addptr %pointers, %offsets : tensor<32x!tt.ptr<f32>>, tensor<32xi64>: the rows'
        # blocks of 32 columns (the 10 number tokens are blocks of 16, int64 ids).
        offsets = re.findall(
            r"tt\.addptr .*: tensor<32x!tt\.ptr<\w+>>, tensor<32x(\w+)>", variant["ttir"]
        )
        assert offsets and set(offsets) == {"i64"}, (variant["kernel"], offsets)
