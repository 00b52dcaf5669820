"""linear_cross_entropy_with_ntl with the Triton row kernel (``impl="triton"``): each chunk's
logits from one matrix product, turned into their gradient in place by the kernel, against the
float64 reference of the materialised logits; chunks that do not divide N, the causal shift and
loss weights across chunk boundaries, bias, tied weights, evaluation, the weight's gradient summed
in float32, and what stays on the torch path. On CPU in Triton's interpreter (conftest), on a GPU
through the device fixture."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from numtok.losses.fused import cross_entropy_with_ntl
from numtok.losses.linear import linear_cross_entropy_with_ntl
from numtok.ops import linear_in_forward

from cases import make_vocab
from test_fused import WEIGHT, reference
from test_linear import (
    IN_FORWARD,
    assert_linear_matches_reference,
    assert_tied_weights_match_reference,
    make_inputs,
    materialised_logits,
    saved_tensors_hooks,
)


@pytest.mark.parametrize("kind", ["was", "mse", "mae", "huber"])
@pytest.mark.parametrize("reweigh", [False, True])
@pytest.mark.parametrize("name", ["digits", "chunks", "custom"])
def test_kinds_match_reference(kind: str, reweigh: bool, name: str, device: torch.device) -> None:
    """Chunks of 4 rows over 15: the last one partial."""
    hidden, weight, bias, labels = make_inputs(name, seed=1, device=device)
    assert_linear_matches_reference(
        name, hidden, weight, bias, labels, 4, impl="triton", kind=kind, reweigh=reweigh
    )


@pytest.mark.parametrize(
    "extra",
    [
        {"shift": True, "reweigh": True},
        {"num_items_in_batch": 7, "squash_factor": 3.0},
        {"num_items_in_batch": torch.tensor(9), "reduction": "sum"},
        {"ignore_index": 0, "kind": "mse"},
        {"loss_weights": "random", "shift": True, "kind": "huber", "reweigh": True},
        {"logit_softcap": 2.0, "reweigh": True, "shift": True},
    ],
    ids=str,
)
@pytest.mark.parametrize("chunk_size", [1, 3, 14, 100])
def test_settings_across_chunk_boundaries(
    extra: dict[str, Any], chunk_size: int, device: torch.device
) -> None:
    """Sequences of 7 in chunks of 1, 3, 14 and 100 rows: a shifted label or weight of a chunk's
    last row lies in the next chunk."""
    ignore_index = extra.get("ignore_index", -100)
    hidden, weight, bias, labels = make_inputs(
        "chunks", (2, 7), 2, with_bias=False, device=device, ignore_index=ignore_index
    )
    if extra.get("loss_weights") == "random":
        weights = torch.rand(2, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
        extra = {**extra, "loss_weights": weights.to(device)}
    assert_linear_matches_reference(
        "chunks", hidden, weight, bias, labels, chunk_size, impl="triton", **extra
    )


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_evaluation_reads_the_loss_off_each_chunk(reduction: str, device: torch.device) -> None:
    """Without a gradient the kernel writes no gradient; the values of every reduction."""
    vocab = make_vocab("chunks")
    hidden, weight, bias, labels = make_inputs("chunks", (3, 5), 5, device=device)
    logits = materialised_logits(hidden, weight, bias).detach()
    expected, _ = reference(logits, labels, vocab, reduction=reduction, reweigh=True)
    with torch.no_grad():
        out = linear_cross_entropy_with_ntl(
            hidden, weight, labels, vocab, bias=bias, chunk_size=4, ntl_weight=WEIGHT,
            reduction=reduction, reweigh=True, impl="triton",
        )  # fmt: skip
    assert not out.loss.requires_grad and out.loss.shape == expected.shape
    torch.testing.assert_close(out.loss, expected, rtol=1e-9, atol=1e-12)


def test_tied_weights(device: torch.device) -> None:
    assert_tied_weights_match_reference(device, impl="triton")


def test_the_weight_gradient_is_summed_in_float32(
    monkeypatch: pytest.MonkeyPatch, device: torch.device
) -> None:
    """bfloat16 hidden states and weight in chunks of one row (36 chunks). Summed over the chunks
    in float32 (a GPU's default; forced on CPU), the weight's gradient is as far from the float32
    reference as the materialised path's, whose error is the bfloat16 rounding of the logits'
    gradient; summed in bfloat16 it drifts further."""
    vocab = make_vocab("chunks")
    hidden, weight, _, labels = make_inputs(
        "chunks", (4, 9), 12, dtype=torch.float32, with_bias=False, device=device
    )
    low = [t.detach().to(torch.bfloat16).requires_grad_() for t in (hidden, weight)]
    upcast = [t.detach().float().requires_grad_() for t in low]
    ref, _ = reference(materialised_logits(*upcast, None), labels, vocab, reweigh=True)
    (ref_grad,) = torch.autograd.grad(ref, upcast[1])

    def error(loss: torch.Tensor) -> float:
        grad = torch.autograd.grad(loss, low[1])[0].float()
        return float((grad - ref_grad).norm() / ref_grad.norm())

    def linear_error(dtype: torch.dtype) -> float:
        monkeypatch.setattr(linear_in_forward, "weight_gradient_dtype", lambda weight: dtype)
        return error(
            linear_cross_entropy_with_ntl(
                low[0], low[1], labels, vocab, chunk_size=1, ntl_weight=WEIGHT, reweigh=True,
                impl="triton",
            ).loss
        )  # fmt: skip

    materialised = cross_entropy_with_ntl(
        low[0] @ low[1].T, labels, vocab, ntl_weight=WEIGHT, reweigh=True, impl="triton"
    )
    in_float32, in_bfloat16 = linear_error(torch.float32), linear_error(torch.bfloat16)
    assert in_float32 <= 1.05 * error(materialised.loss)
    assert in_bfloat16 > 1.2 * in_float32


def test_what_the_kernel_does_not_compute_stays_on_the_torch_path(device: torch.device) -> None:
    """reduction="none" with a gradient and saved-tensor hooks take the pass that recomputes the
    logits in backward, on the torch row passes: "auto" runs it, "triton" refuses."""
    vocab = make_vocab("digits")
    hidden, weight, bias, labels = make_inputs("digits", seed=8, device=device)
    out = assert_linear_matches_reference(
        "digits", hidden, weight, bias, labels, 4, impl="auto", reduction="none"
    )
    assert type(out.loss.grad_fn).__name__ != IN_FORWARD
    assert_linear_matches_reference("digits", hidden, weight, bias, labels, 4, True, impl="auto")
    with pytest.raises(ValueError, match="impl='triton' does not compute the pass that recompute"):
        linear_cross_entropy_with_ntl(
            hidden, weight, labels, vocab, bias=bias, reduction="none", impl="triton"
        )
    with (
        saved_tensors_hooks(),
        pytest.raises(ValueError, match="impl='triton' does not compute the pass"),
    ):
        linear_cross_entropy_with_ntl(hidden, weight, labels, vocab, bias=bias, impl="triton")
    with pytest.raises(ValueError, match="impl must be one of"):
        linear_cross_entropy_with_ntl(hidden, weight, labels, vocab, impl="gpu")


def test_float16_under_a_loss_scale_takes_the_pass_that_knows_it() -> None:
    """float16 hidden states and weight, 16 tokens of a batch of 32,768, GradScaler's 2^16:
    rounding each chunk's gradient before the scale arrives flushed most of it to 0, and
    multiplying by the scale as a float16 number (2^16 is past float16's largest, 65,504) made
    the gradients inf and NaN. float16 takes the pass that recomputes the logits in backward,
    where the scale is known: the gradients within float16's precision of the float32
    reference's. The Triton row kernel, which serves the gradient-in-forward pass only,
    refuses it."""
    vocab = make_vocab("chunks")
    hidden, weight, _, labels = make_inputs("chunks", (2, 8), 17, torch.float32, False)
    low = [t.detach().half().requires_grad_() for t in (hidden, weight)]
    settings: dict[str, Any] = {"num_items_in_batch": 32768, "reweigh": True}
    loss_scale = torch.tensor(2.0**16)
    out = linear_cross_entropy_with_ntl(
        *low, labels, vocab, chunk_size=4, ntl_weight=WEIGHT, **settings
    )
    grads = torch.autograd.grad(out.loss, low, loss_scale)
    upcast = [t.detach().float().requires_grad_() for t in low]
    ref, _ = reference(materialised_logits(*upcast, None), labels, vocab, **settings)
    ref_grads = torch.autograd.grad(ref, upcast, loss_scale)
    for grad, ref_grad in zip(grads, ref_grads, strict=True):
        assert grad.dtype == torch.float16
        assert float((grad.float() - ref_grad).norm() / ref_grad.norm()) < 2.0**-10
    with pytest.raises(ValueError, match=r"does not compute the pass .*float16 with a gradient"):
        linear_cross_entropy_with_ntl(*low, labels, vocab, impl="triton", **settings)
