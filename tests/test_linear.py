"""linear_cross_entropy_with_ntl against materialising ``hidden @ weight.T + bias`` and calling
the unfused reference ``F.cross_entropy + w * number_token_loss``: values and the gradients for
hidden, weight and bias within 1e-9 in float64, through both passes (gradients computed in the
forward pass, for scalar reductions; logits recomputed in backward, for ``"none"`` and under
saved-tensor hooks), for chunk sizes that do and do not divide N, on the device of
``NUMTOK_TEST_DEVICE`` where a test takes ``device``."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from numtok import NumberVocab, number_token_loss
from numtok.losses.fused import CEWithNTLOutput, cross_entropy_with_ntl
from numtok.losses.linear import (
    default_chunk_size,
    linear_cross_entropy_with_ntl,
    linear_loss_and_row_terms,
)
from numtok.maths.ntl import LossSpec
from numtok.ops.kernels.torch_rows import entropy_and_top1

from cases import KIND_IDS, KINDS, REFERENCE_CASES, VOCABS, make_labels, make_vocab
from test_fused import WEIGHT, reference

HIDDEN_SIZE = 6
CPU = torch.device("cpu")
#: The grad_fn of a loss whose gradients were computed in the forward pass.
IN_FORWARD = "_LossWithGradientsBackward"


def saved_tensors_hooks() -> torch.autograd.graph.saved_tensors_hooks:
    """Identity saved-tensor hooks (as activation offloading installs): scalar reductions then
    take the pass that recomputes the logits in backward."""
    return torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)


def make_inputs(
    name: str,
    shape: tuple[int, ...] = (3, 5),
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    with_bias: bool = True,
    device: torch.device = CPU,
    ignore_index: int = -100,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """hidden (*shape, H), weight (V, H), bias (V,) or None, labels (*shape), on ``device``."""
    vocab_size = VOCABS[name][1]
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(*shape, HIDDEN_SIZE, generator=generator, dtype=dtype)
    weight = torch.randn(vocab_size, HIDDEN_SIZE, generator=generator, dtype=dtype)
    bias = torch.randn(vocab_size, generator=generator, dtype=dtype) if with_bias else None
    labels = make_labels(name, shape, generator, ignore_index).to(device)
    params = [t.to(device).requires_grad_() for t in (hidden, weight, bias) if t is not None]
    return params[0], params[1], params[2] if with_bias else None, labels


def materialised_logits(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    logits = hidden @ weight.T
    return logits if bias is None else logits + bias


def grads_for(
    value: torch.Tensor, inputs: list[torch.Tensor]
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Value and gradients for a fixed random upstream gradient."""
    upstream = torch.randn(value.shape, generator=torch.Generator().manual_seed(99)).to(value)
    return value.detach(), torch.autograd.grad(value, inputs, upstream)


def assert_linear_matches_reference(
    name: str,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    chunk_size: int | None = None,
    recompute: bool = False,
    impl: str = "torch",
    **settings: Any,
) -> CEWithNTLOutput:
    """``recompute=True`` runs the linear path under saved-tensor hooks, which send scalar
    reductions to the pass that recomputes the logits in backward; the path taken is checked.
    ``impl`` chooses the backend of the row pass."""
    vocab = make_vocab(name)
    inputs = [hidden, weight] + ([bias] if bias is not None else [])
    with saved_tensors_hooks() if recompute else contextlib.nullcontext():
        out = linear_cross_entropy_with_ntl(
            hidden,
            weight,
            labels,
            vocab,
            bias=bias,
            chunk_size=chunk_size,
            ntl_weight=WEIGHT,
            impl=impl,
            **settings,
        )
    in_forward = not recompute and settings.get("reduction", "mean") != "none"
    assert (type(out.loss.grad_fn).__name__ == IN_FORWARD) == in_forward
    value, grads = grads_for(out.loss, inputs)
    logits = materialised_logits(hidden, weight, bias)
    ref_value, ref_grads = grads_for(reference(logits, labels, vocab, **settings)[0], inputs)
    torch.testing.assert_close(value, ref_value, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(grads, ref_grads, rtol=1e-9, atol=1e-12)
    return out


@pytest.mark.parametrize(("name", "shape", "seed", "settings"), REFERENCE_CASES)
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
def test_reference_cases(
    name: str,
    shape: tuple[int, ...],
    seed: int,
    settings: dict[str, Any],
    with_bias: bool,
    device: torch.device,
) -> None:
    """Every case of the fused and unfused losses, in chunks of 4 rows (the last one partial
    for most shapes)."""
    ignore_index = settings.get("ignore_index", -100)
    if "loss_weights" in settings:
        settings = {**settings, "loss_weights": settings["loss_weights"].to(device)}
    hidden, weight, bias, labels = make_inputs(
        name, shape, seed, with_bias=with_bias, device=device, ignore_index=ignore_index
    )
    assert_linear_matches_reference(name, hidden, weight, bias, labels, 4, **settings)


@pytest.mark.parametrize("reweigh", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("chunk_size", [None, 1, 4, 15, 100])
@pytest.mark.parametrize("recompute", [False, True], ids=["in-forward", "recompute"])
def test_chunk_sizes(
    reweigh: bool, reduction: str, chunk_size: int | None, recompute: bool, device: torch.device
) -> None:
    """15 positions: chunks of 4 leave a partial last chunk, 15 is one chunk, 100 exceeds N."""
    name = "chunks"
    hidden, weight, bias, labels = make_inputs(name, device=device)
    assert_linear_matches_reference(
        name,
        hidden,
        weight,
        bias,
        labels,
        chunk_size,
        recompute,
        reweigh=reweigh,
        reduction=reduction,
    )


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("recompute", [False, True], ids=["in-forward", "recompute"])
def test_kinds_match_reference(kind: Any, recompute: bool, device: torch.device) -> None:
    hidden, weight, bias, labels = make_inputs("chunks", seed=1, device=device)
    assert_linear_matches_reference(
        "chunks", hidden, weight, bias, labels, 4, recompute, kind=kind, reweigh=True
    )


@pytest.mark.parametrize(
    "extra",
    [
        {"shift": True, "reweigh": True},
        {"shift": True, "reduction": "none"},
        {"num_items_in_batch": 7, "squash_factor": 3.0},
        {"num_items_in_batch": torch.tensor(9), "reduction": "sum"},
        {"ignore_index": 0},
        {"loss_weights": "random", "shift": True, "kind": "huber"},
        {"logit_softcap": 2.0, "reweigh": True, "shift": True},
        {"logit_softcap": 2.0, "reduction": "none", "kind": "mse"},
    ],
    ids=str,
)
@pytest.mark.parametrize("recompute", [False, True], ids=["in-forward", "recompute"])
def test_settings_match_reference(
    extra: dict[str, Any], recompute: bool, device: torch.device
) -> None:
    ignore_index = extra.get("ignore_index", -100)
    hidden, weight, bias, labels = make_inputs(
        "chunks", (2, 7), 2, with_bias=False, device=device, ignore_index=ignore_index
    )
    if extra.get("loss_weights") == "random":
        weights = torch.rand(2, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
        extra = {**extra, "loss_weights": weights.to(device)}
    assert_linear_matches_reference("chunks", hidden, weight, bias, labels, 3, recompute, **extra)


@pytest.mark.parametrize("recompute", [False, True], ids=["in-forward", "recompute"])
def test_batch_without_numbers(recompute: bool, device: torch.device) -> None:
    """No label is a number token: NTL's mean over no position is 0, with and without
    reweighing."""
    hidden, weight, bias, labels = make_inputs("digits", seed=6, device=device)
    is_number = make_vocab("digits").tables(device).position_of_id[labels.clamp_min(0)] >= 0
    words = labels.masked_fill(is_number, 16)
    for reweigh in (False, True):
        out = assert_linear_matches_reference(
            "digits", hidden, weight, bias, words, 4, recompute, reweigh=reweigh
        )
        assert out.ntl == 0 and out.ce > 0


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("recompute", [False, True], ids=["in-forward", "recompute"])
def test_ignore_only_batch_gives_zero(
    reduction: str, recompute: bool, device: torch.device
) -> None:
    """Nothing but ignore_index: loss 0 and zero gradients (PyTorch's mean gives NaN)."""
    vocab = make_vocab("digits")
    hidden, weight, bias, labels = make_inputs("digits", seed=7, device=device)
    assert bias is not None
    labels = torch.full_like(labels, -100)
    with saved_tensors_hooks() if recompute else contextlib.nullcontext():
        out = linear_cross_entropy_with_ntl(
            hidden, weight, labels, vocab, bias=bias, reduction=reduction, chunk_size=4
        )
    grads = torch.autograd.grad(out.loss.sum(), [hidden, weight, bias])
    assert torch.all(out.loss == 0)
    assert all(torch.all(grad == 0) for grad in grads)


@pytest.mark.parametrize("recompute", [False, True], ids=["in-forward", "recompute"])
def test_tied_weights(recompute: bool, device: torch.device) -> None:
    assert_tied_weights_match_reference(device, recompute)


def assert_tied_weights_match_reference(
    device: torch.device, recompute: bool = False, impl: str = "torch"
) -> None:
    """The output layer's weight also embeds the input ids (tied embeddings): its gradient sums
    both uses."""
    vocab = make_vocab("chunks")
    generator = torch.Generator().manual_seed(10)
    weight = torch.randn(59, HIDDEN_SIZE, generator=generator, dtype=torch.float64)
    mix = torch.randn(HIDDEN_SIZE, HIDDEN_SIZE, generator=generator, dtype=torch.float64)
    weight, mix = weight.to(device).requires_grad_(), mix.to(device)
    input_ids = torch.randint(59, (3, 8), generator=generator).to(device)
    labels = make_labels("chunks", (3, 8), generator).to(device)

    def hidden() -> torch.Tensor:
        return torch.tanh(weight[input_ids] @ mix)  # (3, 8, H)

    with saved_tensors_hooks() if recompute else contextlib.nullcontext():
        out = linear_cross_entropy_with_ntl(
            hidden(), weight, labels, vocab, chunk_size=5, ntl_weight=WEIGHT, shift=True, impl=impl
        )
    value, grads = grads_for(out.loss, [weight])
    ref_value, ref_grads = grads_for(
        reference(hidden() @ weight.T, labels, vocab, shift=True)[0], [weight]
    )
    torch.testing.assert_close(value, ref_value, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(grads, ref_grads, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("recompute", [False, True], ids=["in-forward", "recompute"])
def test_gradcheck(recompute: bool) -> None:
    vocab = make_vocab("chunks")
    hidden, weight, bias, labels = make_inputs("chunks", shape=(2, 3), seed=3)

    def fn(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        with saved_tensors_hooks() if recompute else contextlib.nullcontext():
            return linear_cross_entropy_with_ntl(
                h, w, labels, vocab, bias=b, chunk_size=4, reweigh=True, kind="mse"
            ).loss

    assert bias is not None
    assert torch.autograd.gradcheck(fn, (hidden, weight, bias))


@pytest.mark.parametrize("recompute", [False, True], ids=["in-forward", "recompute"])
def test_only_the_gradients_asked_for(recompute: bool, device: torch.device) -> None:
    """A frozen weight, frozen hidden states, or the bias alone: only the gradients that are
    asked for are computed, and they are the right ones."""
    vocab = make_vocab("digits")
    hidden, weight, bias, labels = make_inputs("digits", seed=4, device=device)
    assert bias is not None
    for trainable in ([hidden], [weight], [bias], [hidden, bias]):
        inputs = [t if any(t is u for u in trainable) else t.detach() for t in (hidden, weight)]
        inputs.append(bias if any(bias is u for u in trainable) else bias.detach())
        with saved_tensors_hooks() if recompute else contextlib.nullcontext():
            out = linear_cross_entropy_with_ntl(
                inputs[0], inputs[1], labels, vocab, bias=inputs[2], chunk_size=4
            )
        ref = cross_entropy_with_ntl(materialised_logits(*inputs), labels, vocab)
        torch.testing.assert_close(
            torch.autograd.grad(out.loss, trainable), torch.autograd.grad(ref.loss, trainable)
        )


def test_evaluation_computes_no_gradient(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torch.no_grad, or with no input that requires a gradient, the gradient-in-forward
    pass is not entered: only the row statistics are computed, and the value is the same."""
    vocab = make_vocab("digits")
    hidden, weight, bias, labels = make_inputs("digits", seed=5)
    ref = cross_entropy_with_ntl(materialised_logits(hidden, weight, bias), labels, vocab)
    with torch.no_grad():
        expected = linear_cross_entropy_with_ntl(hidden, weight, labels, vocab, bias=bias).loss

    def refuse(*args: Any) -> None:
        raise AssertionError("the gradient-in-forward pass ran without a gradient to compute")

    monkeypatch.setattr("numtok.losses.linear.linear_loss_in_forward", refuse)
    with torch.no_grad():
        out = linear_cross_entropy_with_ntl(hidden, weight, labels, vocab, bias=bias)
    assert not out.loss.requires_grad
    torch.testing.assert_close(out.loss, ref.loss.detach(), rtol=1e-12, atol=0)
    frozen = [t.detach() for t in (hidden, weight, bias) if t is not None]
    out = linear_cross_entropy_with_ntl(frozen[0], frozen[1], labels, vocab, bias=frozen[2])
    assert not out.loss.requires_grad and torch.equal(out.loss, expected)


def test_no_logits_sized_tensor_is_kept_for_backward() -> None:
    """With V = 1000 columns: the gradient-in-forward pass keeps the gradients, (M, H), (V, H)
    and (V,); the recompute pass (under saved-tensor hooks, which see what it saves) keeps
    (M, H), (V, H), (M,) and (M, N) tensors."""
    vocab = NumberVocab.from_values(dict(VOCABS["digits"][0]), vocab_size=1000)
    hidden = torch.randn(4, 25, HIDDEN_SIZE, requires_grad=True)
    weight = torch.randn(1000, HIDDEN_SIZE, requires_grad=True)
    bias = torch.randn(1000, requires_grad=True)
    labels = torch.randint(1000, (4, 25))
    out = linear_cross_entropy_with_ntl(hidden, weight, labels, vocab, bias=bias, reweigh=True)
    kept = out.loss.grad_fn.saved_tensors  # type: ignore[union-attr]
    assert [tuple(t.shape) for t in kept] == [(100, HIDDEN_SIZE), (1000, HIDDEN_SIZE), (1000,)]

    saved: list[torch.Tensor] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        linear_cross_entropy_with_ntl(hidden, weight, labels, vocab, bias=bias, reweigh=True)
    logits_size = labels.numel() * weight.shape[0]
    assert saved and max(t.numel() for t in saved) < logits_size / 4


@pytest.mark.parametrize("query", ["private query", "probe"])
def test_saved_tensor_hooks_take_the_recompute_pass(
    query: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under saved-tensor hooks (save_on_cpu here) the recompute pass serves the call, read from
    torch's private query of the hook stack (torch 2.8 and later) or, where torch has none (2.4
    to 2.7, as here with the query taken away), from the probe; without hooks, the
    gradient-in-forward pass; both equal the reference."""
    if query == "probe":
        monkeypatch.setattr("numtok.losses.linear._top_saved_tensors_hooks", None)
    vocab = make_vocab("chunks")
    hidden, weight, bias, labels = make_inputs("chunks", seed=5)
    inputs = [hidden, weight, bias]
    logits = materialised_logits(hidden, weight, bias)
    ref_value, ref_grads = grads_for(reference(logits, labels, vocab)[0], inputs)
    for hooks in (contextlib.nullcontext(), torch.autograd.graph.save_on_cpu()):
        with hooks:
            out = linear_cross_entropy_with_ntl(
                hidden, weight, labels, vocab, bias=bias, ntl_weight=WEIGHT
            )
        in_forward = isinstance(hooks, contextlib.nullcontext)
        assert (type(out.loss.grad_fn).__name__ == IN_FORWARD) == in_forward
        value, grads = grads_for(out.loss, inputs)
        torch.testing.assert_close(value, ref_value, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(grads, ref_grads, rtol=1e-9, atol=1e-12)


def test_backward_twice_with_retain_graph() -> None:
    """Backward scales the stored gradients without changing them: a second backward through a
    retained graph gives the same gradients again."""
    vocab = make_vocab("chunks")
    hidden, weight, bias, labels = make_inputs("chunks", seed=11)
    out = linear_cross_entropy_with_ntl(hidden, weight, labels, vocab, bias=bias, chunk_size=4)
    first = torch.autograd.grad(3 * out.loss, [hidden, weight, bias], retain_graph=True)
    second = torch.autograd.grad(3 * out.loss, [hidden, weight, bias])
    torch.testing.assert_close(first, second, rtol=0, atol=0)


def test_default_chunk_size() -> None:
    assert default_chunk_size(4096, 1024) == 1024  # the logits buffer as large as the weight
    assert default_chunk_size(4096, 64) == 256  # at least 256 rows
    assert default_chunk_size(100, 1024) == 100  # never more than N
    assert default_chunk_size(0, 8) == 1


# The chunked passes compute the logits with the same low-precision products as the
# materialised path (per chunk or block instead of at once). Gradient in forward: the hidden
# states' gradient is one product per row chunk, the weight's gradient a sum over the chunks in
# the weight's dtype (one rounding per chunk). Recompute: the weight's gradient is one product
# per block of columns, the hidden states' gradient a float32 sum over blocks. Against a float32
# reference on the same (upcast) inputs, the relative error of the loss is at most 1e-3 and that
# of each gradient (Frobenius norm) 2^-7 for bfloat16 and 2^-10 for float16; measured (8 chunks):
# about 6e-5 and 3e-3 (bfloat16), 1.4e-5 and 4e-4 (float16), as for the materialised path.
LOW_PRECISION = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}


@pytest.mark.parametrize("dtype", list(LOW_PRECISION), ids=str)
@pytest.mark.parametrize("recompute", [False, True], ids=["in-forward", "recompute"])
def test_low_precision_matches_float32_reference(
    dtype: torch.dtype, recompute: bool, device: torch.device
) -> None:
    vocab = make_vocab("chunks")
    hidden, weight, bias, labels = make_inputs(
        "chunks", shape=(4, 9), seed=8, dtype=torch.float32, device=device
    )
    assert bias is not None
    low = [t.detach().to(dtype).requires_grad_() for t in (hidden, weight, bias)]
    with saved_tensors_hooks() if recompute else contextlib.nullcontext():
        out = linear_cross_entropy_with_ntl(
            low[0], low[1], labels, vocab, bias=low[2], chunk_size=5, reweigh=True
        )
    grads = torch.autograd.grad(out.loss, low)
    upcast = [t.detach().float().requires_grad_() for t in low]
    ref, _ = reference(materialised_logits(*upcast), labels, vocab, ntl_weight=0.3, reweigh=True)
    ref_grads = torch.autograd.grad(ref, upcast)
    assert out.loss.dtype == torch.float32
    assert float((out.loss - ref).detach().abs() / ref.detach().abs()) < 1e-3
    for grad, ref_grad, tensor in zip(grads, ref_grads, low, strict=True):
        assert grad.dtype == dtype and grad.shape == tensor.shape
        assert float((grad.float() - ref_grad).norm() / ref_grad.norm()) < LOW_PRECISION[dtype]


# Dynamo traces the recompute pass (about 6 s a reduction): make test-slow.
@pytest.mark.slow
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_torch_compile_matches_eager(reduction: str, device: torch.device) -> None:
    """Under torch.compile every reduction takes the recompute pass: two custom ops in the
    graph."""
    torch._dynamo.reset()
    vocab = make_vocab("digits")
    hidden, weight, bias, labels = make_inputs("digits", seed=9, dtype=torch.float32, device=device)
    assert bias is not None

    def loss(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = linear_cross_entropy_with_ntl(
            h, w, labels, vocab, bias=b, chunk_size=4, shift=True, reduction=reduction
        )
        return out.loss.sum()

    compiled = torch.compile(loss, backend="aot_eager")
    torch.testing.assert_close(compiled(hidden, weight, bias), loss(hidden, weight, bias))
    eager_grads = torch.autograd.grad(loss(hidden, weight, bias), [hidden, weight, bias])
    compiled_grads = torch.autograd.grad(compiled(hidden, weight, bias), [hidden, weight, bias])
    torch.testing.assert_close(compiled_grads, eager_grads)


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"hidden": torch.zeros(3, 5, 6, dtype=torch.long)}, TypeError, "hidden must be floating"),
        ({"hidden": [[0.0] * 6]}, TypeError, "hidden must be a torch.Tensor"),
        ({"weight": torch.zeros(17, 6, dtype=torch.float64)}, TypeError, "weight must have the"),
        ({"weight": torch.zeros(17, 5)}, ValueError, "weight must have shape"),
        ({"weight": torch.zeros(16, 6)}, ValueError, "weight has 16 rows.*vocab_size=17"),
        ({"bias": torch.zeros(16)}, ValueError, r"bias must have shape \(17,\)"),
        ({"bias": 1.0}, TypeError, "bias must be a torch.Tensor"),
        ({"labels": torch.zeros(3, 4, dtype=torch.long)}, ValueError, "labels must have shape"),
        ({"labels": torch.zeros(3, 5)}, TypeError, "labels must be an integer"),
        ({"labels": torch.full((3, 5), -1)}, ValueError, r"\[0, 17\).*got -1"),
        ({"chunk_size": 0}, ValueError, "chunk_size must be a positive int"),
        ({"chunk_size": 2.0}, TypeError, "chunk_size must be a positive int"),
        ({"ntl_weight": -1}, ValueError, "ntl_weight"),
        ({"reduction": "avg"}, ValueError, "reduction must be one of"),
        ({"kind": "number"}, ValueError, "linear_cross_entropy_with_ntl does not take kind="),
    ],
    ids=lambda value: str(value)[:40],
)
def test_bad_input(change: dict[str, Any], error: type[Exception], match: str) -> None:
    arguments: dict[str, Any] = {
        "hidden": torch.zeros(3, 5, 6),
        "weight": torch.zeros(17, 6),
        "labels": torch.zeros(3, 5, dtype=torch.long),
        **change,
    }
    with pytest.raises(error, match=match):
        linear_cross_entropy_with_ntl(
            arguments.pop("hidden"),
            arguments.pop("weight"),
            arguments.pop("labels"),
            make_vocab("digits"),
            **arguments,
        )


@pytest.mark.parametrize("softcap", [None, 2.5])
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
def test_the_terms_of_each_position(softcap: float | None, dtype: torch.dtype) -> None:
    """``linear_loss_and_row_terms``: the loss and gradients of ``linear_cross_entropy_with_ntl``,
    and each position's cross-entropy, weighted NTL, entropy and top-1 (the first of equal
    maxima) against the float64 materialised logits."""
    vocab = make_vocab("chunks")
    hidden, weight, bias, labels = make_inputs("chunks", shape=(3, 6), seed=8, dtype=dtype)
    with torch.no_grad():  # two positions whose next label is their most likely token
        first = materialised_logits(hidden[:2, 0], weight, bias).argmax(-1)  # (2,)
        labels[:2, 1] = first
    weights = torch.rand(labels.shape, generator=torch.Generator().manual_seed(2)).to(dtype)
    spec = LossSpec.build(
        vocab, kind="was", reweigh=False, squash_factor=None, ignore_index=-100,
        reduction="mean", shift=True, logit_softcap=softcap,
    )  # fmt: skip
    out, rows = linear_loss_and_row_terms(
        hidden, weight, labels, vocab.tables(), spec, WEIGHT, weights, 11, bias=bias
    )
    expected = linear_cross_entropy_with_ntl(
        hidden, weight, labels, vocab, bias=bias, loss_weights=weights, num_items_in_batch=11,
        shift=True, logit_softcap=softcap, ntl_weight=WEIGHT,
    )  # fmt: skip
    torch.testing.assert_close(out.loss, expected.loss)
    got = torch.autograd.grad(out.loss, (hidden, weight, bias))
    for a, b in zip(got, torch.autograd.grad(expected.loss, (hidden, weight, bias)), strict=True):
        torch.testing.assert_close(a, b)

    logits = materialised_logits(hidden.double(), weight.double(), bias.double())
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    flat = logits.reshape(-1, logits.shape[-1])
    targets = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], 1).reshape(-1)
    ce = torch.nn.functional.cross_entropy(flat, targets, reduction="none")
    ntl = number_token_loss(logits, labels, vocab, shift=True, reduction="none")
    log_probs = torch.log_softmax(flat, dim=-1)
    # bfloat16: the pass rounds each chunk's logits to bfloat16 (8 bits), the reference not.
    tolerance = {"rtol": 1e-9, "atol": 1e-9}
    if dtype == torch.bfloat16:
        tolerance = {"rtol": 0, "atol": 3e-2}
    torch.testing.assert_close(rows.ce.double(), ce, **tolerance)
    expected_ntl = (ntl * torch.cat([weights[:, 1:], weights[:, :1] * 0], 1)).reshape(-1)
    torch.testing.assert_close(rows.ntl.double(), expected_ntl.double(), **tolerance)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    torch.testing.assert_close(rows.entropy.double(), entropy, **tolerance)
    if dtype == torch.float64:
        assert torch.equal(rows.is_top1, flat.argmax(-1) == targets)
        assert bool(rows.is_top1[[0, 6]].all())


def test_entropy_and_top1_take_the_first_of_equal_maxima() -> None:
    """As ``argmax``: a label tied with an earlier column for the maximum is not the top 1."""
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [1.0, 3.0, 3.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    lse = torch.logsumexp(logits, dim=-1)
    entropy, is_top1 = entropy_and_top1(logits, lse, torch.tensor([1, 2, 0]))
    assert is_top1.tolist() == [True, False, True]
    probs = torch.softmax(logits, dim=-1)
    torch.testing.assert_close(entropy, -(probs * probs.log()).sum(-1))


class _Multiplies(TorchDispatchMode):
    """Records the operands of every ``aten.mul`` that has a one-element tensor among them."""

    def __init__(self) -> None:
        super().__init__()
        self.operands: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        if func.overloadpacket == torch.ops.aten.mul:
            left, right = args[:2]
            if any(isinstance(t, torch.Tensor) and t.numel() == 1 for t in (left, right)):
                self.operands.append((left, right))
        return func(*args, **(kwargs or {}))


def _bfloat16_losses(device: torch.device) -> dict[str, Any]:
    """Callables giving the two losses whose gradients are computed in the forward pass, of the
    same bfloat16 inputs on ``device``, with those inputs."""
    vocab = make_vocab("digits")
    hidden, weight, _, labels = make_inputs(
        "digits", shape=(2, 5), seed=9, dtype=torch.bfloat16, with_bias=False, device=device
    )
    tables = vocab.tables(device)
    return {
        "linear_cross_entropy_with_ntl": lambda: linear_cross_entropy_with_ntl(
            hidden, weight, labels, vocab, ntl_weight=WEIGHT, impl="torch"
        ),
        "linear_loss_and_row_terms": lambda: linear_loss_and_row_terms(
            hidden, weight, labels, tables, _SPEC_DIGITS, WEIGHT, None, None
        )[0],
        "inputs": (hidden, weight),
    }


@pytest.mark.parametrize("entry", ["linear_cross_entropy_with_ntl", "linear_loss_and_row_terms"])
def test_the_upstream_gradient_multiplies_in_float32(entry: str) -> None:
    """Backward multiplies the bfloat16 gradients computed in forward by the float32 upstream
    gradient in a product whose result type is float32. A 0-dim factor does not promote, and
    CUDA computes in the result type: ``g * grad_loss`` rounded a loss scale or ``1/accumulation``
    to bfloat16 there (float16: 2^16 to inf), while the CPU's kernel keeps a 0-dim scalar in
    float32, so only the product's type shows it here (the values on the device:
    ``test_an_upstream_gradient_is_applied_in_float32_and_rounded_once``)."""
    losses = _bfloat16_losses(CPU)
    out = losses[entry]()
    upstream = torch.tensor(1.005859375)
    with _Multiplies() as multiplies:
        torch.autograd.grad(out.loss, losses["inputs"], upstream)
    assert len(multiplies.operands) == 2  # the hidden states' and the weight's gradients
    for left, right in multiplies.operands:
        assert {left.dtype, right.dtype} == {torch.bfloat16, torch.float32}
        assert torch.result_type(left, right) == torch.float32


def test_an_upstream_gradient_is_applied_in_float32_and_rounded_once(device: torch.device) -> None:
    """On the device: the gradients for an upstream gradient ``u`` that bfloat16 cannot hold
    (1 + 3·2^-9, 1.0078125 there) are those for 1 times ``u`` in float32, rounded once to
    bfloat16, bit for bit. CUDA's ``g * grad_loss`` of a 0-dim CUDA tensor used bfloat16's u."""
    losses = _bfloat16_losses(device)
    upstream = torch.tensor(1.005859375, device=device)
    assert float(upstream.bfloat16()) != float(upstream)
    for entry in ("linear_cross_entropy_with_ntl", "linear_loss_and_row_terms"):
        once = torch.autograd.grad(losses[entry]().loss, losses["inputs"])
        scaled = torch.autograd.grad(losses[entry]().loss, losses["inputs"], upstream)
        for got, unit in zip(scaled, once, strict=True):
            assert got.dtype == torch.bfloat16
            assert torch.equal(got, (unit.float() * upstream).bfloat16()), entry


def test_float16_gradients_are_refused_by_the_terms_of_each_position() -> None:
    """``linear_loss_and_row_terms`` computes the gradients in the forward pass: in float16 their
    small entries would be 0 before a loss scale arrives, so it refuses float16 with gradients
    (and computes float16 without, an evaluation)."""
    vocab = make_vocab("digits")
    hidden, weight, _, labels = make_inputs("digits", shape=(2, 5), seed=9, with_bias=False)
    low = [t.detach().half().requires_grad_() for t in (hidden, weight)]
    arguments = (labels, vocab.tables(), _SPEC_DIGITS, WEIGHT, None, None)
    with pytest.raises(ValueError, match=r"in torch.float16 their entries below 2\^-24 would be 0"):
        linear_loss_and_row_terms(*low, *arguments)
    with torch.no_grad():
        out, _ = linear_loss_and_row_terms(*low, *arguments)
        reference = linear_cross_entropy_with_ntl(hidden, weight, labels, vocab, ntl_weight=WEIGHT)
    torch.testing.assert_close(out.loss.double(), reference.loss, rtol=1e-2, atol=0)


_SPEC_DIGITS = LossSpec.build(
    make_vocab("digits"), kind="was", reweigh=False, squash_factor=None, ignore_index=-100,
    reduction="mean", shift=False,
)  # fmt: skip
