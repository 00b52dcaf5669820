"""The Triton backend of cross_entropy_with_ntl (``impl="triton"``): every reference case against
the float64 reference, rows held on chip and rows read in blocks, in place, under torch.compile,
bad input, and the dispatch's choices and refusals. On CPU the kernels run in Triton's
interpreter (conftest sets TRITON_INTERPRET=1); the device tests run on a GPU in gpu.sh.
(The edge cases and the low-precision tests of test_fused.py run on both backends.)"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch

from numtok import NumberTokenLoss
from numtok.fused import cross_entropy_with_ntl
from numtok.kernels import dispatch, triton_loss
from numtok.linear import linear_cross_entropy_with_ntl

from cases import REFERENCE_CASES, make_batch, make_vocab
from test_fused import (
    WEIGHT,
    assert_fused_matches_reference,
    assert_matches_finite_differences,
    on_device,
    reference,
)

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


@pytest.mark.parametrize("blocks", [False, True], ids=["row-on-chip", "rows-in-blocks"])
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
def test_an_upstream_gradient_scales_the_kept_gradient(
    reduction: str, device: torch.device
) -> None:
    """Backward multiplies the gradient from forward by the upstream gradient (per position for
    "none"); an upstream gradient of exactly 1 leaves it as forward wrote it."""
    vocab = make_vocab("digits")
    logits, labels = make_batch("digits", shape=(3, 5), seed=18)
    logits, labels, _ = on_device(device, logits, labels, {})

    def gradient(upstream: float) -> torch.Tensor:
        out = cross_entropy_with_ntl(logits, labels, vocab, reduction=reduction, impl="triton")
        scale = torch.full(out.loss.shape, upstream, dtype=torch.float64, device=device)
        return torch.autograd.grad(out.loss, logits, scale)[0]

    unit = gradient(1.0)
    torch.testing.assert_close(gradient(2.5), 2.5 * unit, rtol=1e-15, atol=0)
    ref, _ = reference(logits, labels, vocab, ntl_weight=0.3, reduction=reduction)
    (ref_grad,) = torch.autograd.grad(ref, logits, torch.ones_like(ref))
    torch.testing.assert_close(unit, ref_grad, rtol=1e-9, atol=1e-12)


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
    module = NumberTokenLoss(vocab, reweigh=True, ntl_weight=WEIGHT, impl="triton")
    out = module(logits, labels)
    assert calls == [1] and "impl='triton'" in repr(module)
    ref, _ = reference(logits, labels, vocab, reweigh=True)
    torch.testing.assert_close(out.loss, ref, rtol=1e-9, atol=0)
    with pytest.raises(ValueError, match="impl must be one of"):
        NumberTokenLoss(vocab, ntl_weight=WEIGHT, impl="fast")
    with pytest.raises(ValueError, match="impl applies to the fused CE"):
        NumberTokenLoss(vocab, impl="triton")


# ------------------------------------------------------------------ the GPU without a GPU


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


_COMPILE_FOR_H100_CLASS = """
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from numtok import NumberVocab
from numtok.kernels import triton_loss, triton_rows

launches = {}

class Recorder:
    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        def record(*args, num_warps, **constexprs):
            key = (self.kernel.__name__, tuple(sorted(constexprs.items())), tuple(
                str(a.dtype) if isinstance(a, torch.Tensor) else type(a).__name__ for a in args))
            launches[key] = (self.kernel, args, constexprs, num_warps)
        return record

for name in ("prepare_rows", "ce_ntl_rows", "sum_terms", "scale_rows"):
    setattr(triton_rows, name, Recorder(getattr(triton_rows, name)))

def run(vocab, logits, labels, **settings):
    from numtok._ntl_maths import LossSpec
    keys = ("kind", "reweigh", "squash_factor", "ignore_index", "reduction", "shift",
            "logit_softcap")
    spec = LossSpec.build(vocab, **{k: settings.pop(k) for k in keys})
    tables = vocab.tables()
    loss, _, _ = triton_loss.cross_entropy_with_ntl(
        logits, labels, settings.pop("loss_weights", None), tables, spec, 0.3,
        settings.pop("num_items", None), needs_grad=logits.requires_grad, inplace=False)
    if logits.requires_grad:
        loss.backward(torch.full_like(loss, 2.0))

base = dict(ignore_index=-100, squash_factor=None, shift=False, reweigh=False, reduction="mean",
            logit_softcap=None)
digits = NumberVocab.from_values({i: str(i) for i in range(10)}, vocab_size=32768)
chunks = NumberVocab.from_values({10 + i: f"{i:03d}" for i in range(1000)} | {
    1010 + i: f"{i:02d}" for i in range(100)} | {i: str(i) for i in range(10)}, vocab_size=131072)
labels = torch.tensor([[3, 5, 1020, -100]])
run(digits, torch.zeros(1, 4, 32768, dtype=torch.bfloat16, requires_grad=True), labels,
    **{**base, "kind": "was", "reweigh": True, "squash_factor": 3.0, "shift": True,
       "loss_weights": torch.ones(1, 4)})
run(chunks, torch.zeros(1, 4, 131072, requires_grad=True), labels,
    **{**base, "kind": "mse", "reduction": "none", "num_items": torch.tensor(3)})
run(chunks, torch.zeros(1, 4, 131072, dtype=torch.bfloat16), labels,
    **{**base, "kind": "huber", "reweigh": True, "logit_softcap": 30.0})
run(digits, torch.zeros(1, 4, 32768, dtype=torch.bfloat16, requires_grad=True), labels,
    **{**base, "kind": "was", "logit_softcap": 30.0})
run(digits, torch.zeros(1, 4, 32768, dtype=torch.float64), labels, **{**base, "kind": "mae"})
run(digits, torch.zeros(1, 4, 32768, dtype=torch.bfloat16, requires_grad=True), labels,
    **{**base, "kind": "del", "shift": True})
run(chunks, torch.zeros(1, 4, 131072, requires_grad=True), labels,
    **{**base, "kind": "smmd", "reduction": "none"})
run(chunks, torch.zeros(1, 4, 131072, dtype=torch.bfloat16), labels, **{**base, "kind": "dist2"})
triton_loss._ce_ntl_backward_op(
    torch.zeros(4, 32768, dtype=torch.bfloat16), labels.reshape(-1), None, *digits.tables(),
    [0.3, 9.0, 9.0, 1.0, 0.0, 30.0, 1.0], [0, 0, 1, 0, 1, 1, -100, 4, 2, 1], None, [],
    torch.zeros(4), torch.ones(3), torch.ones(4))

target = GPUTarget("cuda", 90, 32)
def type_of(value):
    if isinstance(value, torch.Tensor):
        return "*" + {torch.float32: "fp32", torch.float64: "fp64", torch.bfloat16: "bf16",
                      torch.int64: "i64", torch.int32: "i32"}[value.dtype]
    return "i64" if abs(value) >= 2**31 else "i32"
for (name, _, _), (kernel, args, constexprs, num_warps) in sorted(launches.items(), key=str):
    names = kernel.arg_names
    signature = {n: type_of(a) for n, a in zip(names, args)}
    signature |= {n: "constexpr" for n in constexprs}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    compiled = triton.compile(source, target=target, options={"num_warps": num_warps})
    assert compiled.asm["cubin"], name
    print(name, "compiled")
"""


@pytest.mark.slow  # about 15 s: each kernel variant through Triton's compiler and ptxas
def test_kernels_compile_for_an_h100_class_gpu_without_one() -> None:
    """Every kernel, in the variants that a bf16, float32 and float64 call, each kind (DEL, SMMD
    with 1,110 number tokens, DIST2 among them), reweigh,
    squash, shift, weights, rows on chip and in blocks, and the compiled path's backward launch,
    compiles through Triton's full pipeline to a cubin for sm_90 (the H100/H200): what the
    interpreter cannot see (types, layouts, register allocation) is checked without a GPU."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_COMPILE_FOR_H100_CLASS)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    compiled = result.stdout.split()
    for kernel in ("prepare_rows", "ce_ntl_rows", "sum_terms", "scale_rows"):
        assert kernel in compiled, result.stdout
