"""linear_cross_entropy_with_ntl against materialising ``hidden @ weight.T + bias`` and calling
the unfused reference ``F.cross_entropy + w * number_token_loss``: values and the gradients for
hidden, weight and bias within 1e-9 in float64, for chunk sizes that do and do not divide N."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from numtok import NumberVocab
from numtok.fused import cross_entropy_with_ntl
from numtok.linear import default_chunk_size, linear_cross_entropy_with_ntl

from cases import KIND_IDS, KINDS, VOCABS, make_labels, make_vocab
from test_fused import WEIGHT, reference

HIDDEN_SIZE = 6


def make_inputs(
    name: str,
    shape: tuple[int, ...] = (3, 5),
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    with_bias: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """hidden (*shape, H), weight (V, H), bias (V,) or None, labels (*shape)."""
    vocab_size = VOCABS[name][1]
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(*shape, HIDDEN_SIZE, generator=generator, dtype=dtype)
    weight = torch.randn(vocab_size, HIDDEN_SIZE, generator=generator, dtype=dtype)
    bias = torch.randn(vocab_size, generator=generator, dtype=dtype) if with_bias else None
    labels = make_labels(name, shape, generator)
    params = [hidden, weight] + ([bias] if bias is not None else [])
    for tensor in params:
        tensor.requires_grad_()
    return hidden, weight, bias, labels


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
    **settings: Any,
) -> None:
    vocab = make_vocab(name)
    inputs = [hidden, weight] + ([bias] if bias is not None else [])
    out = linear_cross_entropy_with_ntl(
        hidden,
        weight,
        labels,
        vocab,
        bias=bias,
        chunk_size=chunk_size,
        ntl_weight=WEIGHT,
        **settings,
    )
    value, grads = grads_for(out.loss, inputs)
    logits = materialised_logits(hidden, weight, bias)
    ref_value, ref_grads = grads_for(reference(logits, labels, vocab, **settings)[0], inputs)
    torch.testing.assert_close(value, ref_value, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(grads, ref_grads, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", list(VOCABS))
@pytest.mark.parametrize("reweigh", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("chunk_size", [None, 1, 4, 15, 100])
def test_matches_reference(
    name: str, reweigh: bool, reduction: str, chunk_size: int | None
) -> None:
    """15 positions: chunks of 4 leave a partial last chunk, 15 is one chunk, 100 exceeds N."""
    hidden, weight, bias, labels = make_inputs(name)
    assert_linear_matches_reference(
        name, hidden, weight, bias, labels, chunk_size, reweigh=reweigh, reduction=reduction
    )


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_kinds_match_reference(kind: Any) -> None:
    hidden, weight, bias, labels = make_inputs("chunks", seed=1)
    assert_linear_matches_reference("chunks", hidden, weight, bias, labels, 4, kind=kind)


@pytest.mark.parametrize(
    "extra",
    [
        {"shift": True, "reweigh": True},
        {"shift": True, "reduction": "none"},
        {"num_items_in_batch": 7, "squash_factor": 3.0},
        {"ignore_index": 0},
        {"loss_weights": "random", "shift": True, "kind": "huber"},
    ],
    ids=str,
)
def test_settings_match_reference(extra: dict[str, Any]) -> None:
    hidden, weight, bias, labels = make_inputs("chunks", shape=(2, 7), seed=2, with_bias=False)
    labels = labels.masked_fill(labels == -100, extra.get("ignore_index", -100))
    if extra.get("loss_weights") == "random":
        weights = torch.rand(2, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
        extra = {**extra, "loss_weights": weights}
    assert_linear_matches_reference("chunks", hidden, weight, bias, labels, 3, **extra)


def test_gradcheck() -> None:
    vocab = make_vocab("chunks")
    hidden, weight, bias, labels = make_inputs("chunks", shape=(2, 3), seed=3)

    def fn(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return linear_cross_entropy_with_ntl(
            h, w, labels, vocab, bias=b, chunk_size=4, reweigh=True, kind="mse"
        ).loss

    assert bias is not None
    assert torch.autograd.gradcheck(fn, (hidden, weight, bias))


def test_frozen_weight_or_frozen_hidden() -> None:
    """Only the gradients that are asked for are computed, and they are the right ones."""
    vocab = make_vocab("digits")
    hidden, weight, _, labels = make_inputs("digits", seed=4, with_bias=False)
    frozen = weight.detach()
    out = linear_cross_entropy_with_ntl(hidden, frozen, labels, vocab, chunk_size=4)
    (grad_hidden,) = torch.autograd.grad(out.loss, [hidden])
    ref = cross_entropy_with_ntl(hidden @ frozen.T, labels, vocab)
    torch.testing.assert_close(grad_hidden, torch.autograd.grad(ref.loss, [hidden])[0])

    features = hidden.detach()
    out = linear_cross_entropy_with_ntl(features, weight, labels, vocab, chunk_size=4)
    out.loss.backward()
    assert features.grad is None and weight.grad is not None
    ref = cross_entropy_with_ntl(features @ weight.T, labels, vocab)
    torch.testing.assert_close(weight.grad, torch.autograd.grad(ref.loss, [weight])[0])


def test_without_grad_returns_the_same_value() -> None:
    vocab = make_vocab("digits")
    hidden, weight, bias, labels = make_inputs("digits", seed=5)
    with torch.no_grad():
        out = linear_cross_entropy_with_ntl(hidden, weight, labels, vocab, bias=bias)
    ref = cross_entropy_with_ntl(materialised_logits(hidden, weight, bias), labels, vocab)
    assert not out.loss.requires_grad
    torch.testing.assert_close(out.loss, ref.loss.detach(), rtol=1e-12, atol=0)


def test_no_logits_sized_tensor_is_kept_for_backward() -> None:
    """With V = 1000 columns: only (M, H), (V, H), (M,) and (M, N) tensors are saved."""
    vocab = NumberVocab.from_values(dict(VOCABS["digits"][0]), vocab_size=1000)
    hidden = torch.randn(4, 25, HIDDEN_SIZE, requires_grad=True)
    weight = torch.randn(1000, HIDDEN_SIZE, requires_grad=True)
    bias = torch.randn(1000, requires_grad=True)
    labels = torch.randint(1000, (4, 25))
    saved: list[torch.Tensor] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        linear_cross_entropy_with_ntl(hidden, weight, labels, vocab, bias=bias, reweigh=True)
    logits_size = labels.numel() * weight.shape[0]
    assert saved and max(t.numel() for t in saved) < logits_size / 4


def test_default_chunk_size() -> None:
    assert default_chunk_size(4096, 1024) == 1024  # the logits buffer as large as the weight
    assert default_chunk_size(4096, 64) == 256  # at least 256 rows
    assert default_chunk_size(100, 1024) == 100  # never more than N
    assert default_chunk_size(0, 8) == 1


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_ignore_only_batch_gives_zero(reduction: str) -> None:
    vocab = make_vocab("digits")
    hidden, weight, bias, _ = make_inputs("digits", seed=7)
    labels = torch.full((3, 5), -100)
    out = linear_cross_entropy_with_ntl(
        hidden, weight, labels, vocab, bias=bias, reduction=reduction
    )
    grads = torch.autograd.grad(out.loss.sum(), [hidden, weight])
    assert torch.all(out.loss == 0)
    assert all(torch.all(grad == 0) for grad in grads)


# The chunked path computes the logits with the same low-precision products as the materialised
# path (per chunk or block instead of at once); the weight's gradient is one product per block
# of columns, the hidden states' gradient a float32 sum over blocks. Against a float32 reference
# on the same (upcast) inputs, the relative error of the loss is at most 1e-3 and that of each
# gradient (Frobenius norm) 2^-7 for bfloat16 and 2^-10 for float16; measured: about 6e-5 and
# 3e-3 (bfloat16), 1.4e-5 and 4e-4 (float16), as for the materialised path.
LOW_PRECISION = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}


@pytest.mark.parametrize("dtype", list(LOW_PRECISION), ids=str)
def test_low_precision_matches_float32_reference(dtype: torch.dtype) -> None:
    vocab = make_vocab("chunks")
    hidden, weight, bias, labels = make_inputs("chunks", shape=(4, 9), seed=8, dtype=torch.float32)
    assert bias is not None
    low = [t.detach().to(dtype).requires_grad_() for t in (hidden, weight, bias)]
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


def test_torch_compile_matches_eager() -> None:
    torch._dynamo.reset()
    vocab = make_vocab("digits")
    hidden, weight, bias, labels = make_inputs("digits", seed=9, dtype=torch.float32)
    assert bias is not None

    def loss(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = linear_cross_entropy_with_ntl(h, w, labels, vocab, bias=b, chunk_size=4, shift=True)
        return out.loss

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
        ({"kind": "number"}, ValueError, "has no fused path"),
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
