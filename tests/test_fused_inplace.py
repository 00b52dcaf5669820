"""The gradient-in-forward path of cross_entropy_with_ntl: backward only scales the gradient kept
from forward and can run once; ``inplace_backward=True`` writes it into the logits' memory and
refuses, or makes autograd refuse, what it cannot do exactly. Values and gradients of both against
the float64 reference are in test_fused.py (every reference case, both dtypes)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch

from numtok.losses.fused import cross_entropy_with_ntl
from numtok.ops.kernels.gradient_in_forward import gradient_in_backward

from cases import make_batch, make_vocab
from test_fused import reference

VOCAB = make_vocab("chunks")


def loss_of(logits: torch.Tensor, labels: torch.Tensor, **settings: Any) -> torch.Tensor:
    return cross_entropy_with_ntl(logits, labels, VOCAB, reweigh=True, **settings).loss


def batch(seed: int = 30) -> tuple[torch.Tensor, torch.Tensor]:
    logits, labels = make_batch("chunks", shape=(3, 5), seed=seed)
    return logits.detach(), labels


def test_the_gradient_is_written_into_the_logits_memory(device: torch.device) -> None:
    logits, labels = batch()
    logits, labels = logits.to(device), labels.to(device)
    leaf = logits.clone().requires_grad_()
    copy = leaf.clone()  # (3, 5, 59), a non-leaf as in a model
    pointer = copy.data_ptr()
    loss = loss_of(copy, labels, inplace_backward=True)
    assert copy._version > 0  # bumped: autograd knows the values changed
    (grad,) = torch.autograd.grad(loss, copy)
    assert grad.data_ptr() == pointer
    (expected,) = torch.autograd.grad(loss_of(logits.requires_grad_(), labels), logits)
    torch.testing.assert_close(grad, expected, rtol=0, atol=0)


def test_a_leafs_grad_shares_its_memory() -> None:
    logits, labels = batch()
    leaf = logits.clone().requires_grad_()
    loss_of(leaf, labels, inplace_backward=True).backward()
    assert leaf.grad is not None and leaf.grad.data_ptr() == leaf.data_ptr()


def test_other_terms_that_do_not_save_the_logits_get_exact_gradients() -> None:
    """A soft cap c·tanh(x/c) before the call (tanh saves its own output, not the capped logits)
    and a term linear in the logits after it: the gradients add up exactly."""
    logits, labels = batch()

    def total(inplace: bool) -> torch.Tensor:
        leaf = logits.clone().requires_grad_()
        capped = 30.0 * torch.tanh(leaf / 30.0)
        extra = 0.1 * capped.sum()
        loss = loss_of(capped, labels, inplace_backward=inplace) + extra
        (grad,) = torch.autograd.grad(loss, leaf)
        return grad

    torch.testing.assert_close(total(True), total(False), rtol=1e-12, atol=1e-15)


def test_a_node_that_saved_the_logits_fails_loudly_in_backward() -> None:
    """x**2 saves x for its backward; the call overwrites x, so autograd refuses instead of using
    the gradient as if it were the logits."""
    logits, labels = batch()
    leaf = logits.clone().requires_grad_()
    copy = leaf.clone()
    penalty = copy.square().mean()
    loss = loss_of(copy, labels, inplace_backward=True) + penalty
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_a_view_saved_elsewhere_fails_loudly_too() -> None:
    logits, labels = batch()
    leaf = logits.clone().requires_grad_()
    copy = leaf.clone()
    first_row = copy[0].exp()  # exp saves its output, not its input; pow saves the view
    penalty = copy[0].pow(3).sum() + first_row.sum()
    loss = loss_of(copy, labels, inplace_backward=True) + penalty
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize(
    "make",
    [
        lambda x: x[:, :-1],
        lambda x: x[:1].expand(3, 5, 59),
        lambda x: x.permute(2, 0, 1).contiguous().permute(1, 2, 0),
    ],
    ids=["slice of positions", "expanded", "vocabulary not innermost"],
)
def test_logits_without_their_own_contiguous_rows_are_refused(make: Any) -> None:
    logits, labels = batch()
    leaf = logits.clone().requires_grad_()
    view = make(leaf)
    with pytest.raises(ValueError, match="rows of contiguous, non-overlapping memory"):
        loss_of(view, labels[:, : view.shape[1]], inplace_backward=True)
    assert torch.equal(leaf.detach(), logits)  # nothing was written


def test_differentiable_loss_weights_are_refused_in_place_and_exact_otherwise() -> None:
    logits, labels = batch()
    weights = torch.rand(3, 5, dtype=torch.float64, requires_grad=True)
    leaf = logits.clone().requires_grad_()
    with pytest.raises(ValueError, match="loss_weights that do not require grad"):
        loss_of(leaf, labels, loss_weights=weights, inplace_backward=True)
    # Without inplace_backward, autograd reaches the weights through the row statistics.
    grads = torch.autograd.grad(loss_of(leaf, labels, loss_weights=weights), [leaf, weights])
    ref, _ = reference(leaf, labels, VOCAB, ntl_weight=0.3, reweigh=True, loss_weights=weights)
    torch.testing.assert_close(grads, torch.autograd.grad(ref, [leaf, weights]))


@pytest.mark.slow  # compilation, about 8 s
def test_under_torch_compile_in_place_is_exact() -> None:
    """Where dynamo traces the call, the compiled loss writes its gradient in backward, into a
    fresh buffer; where it falls back to eager (a graph break), in place. Either way exact."""
    torch._dynamo.reset()
    logits, labels = batch()
    leaf = logits.clone().requires_grad_()
    compiled = torch.compile(
        lambda x: loss_of(x.clone(), labels, inplace_backward=True), backend="aot_eager"
    )
    (grad,) = torch.autograd.grad(compiled(leaf), leaf)
    (expected,) = torch.autograd.grad(loss_of(leaf, labels), leaf)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-15)
    torch._dynamo.reset()


@pytest.mark.parametrize("inplace", [False, True])
def test_without_a_gradient_the_logits_are_untouched(inplace: bool) -> None:
    logits, labels = batch()
    frozen = logits.clone()
    loss_of(frozen, labels, inplace_backward=inplace)  # does not require grad
    with torch.no_grad():
        loss_of(frozen.requires_grad_(), labels, inplace_backward=inplace)
    assert torch.equal(frozen.detach(), logits)


@pytest.mark.parametrize("inplace", [False, True])
def test_a_second_backward_is_refused(inplace: bool) -> None:
    logits, labels = batch()
    leaf = logits.clone().requires_grad_()
    loss = loss_of(leaf.clone(), labels, inplace_backward=inplace)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward through the same call"):
        loss.backward()


def test_backward_scales_the_kept_gradient_by_the_upstream_gradient() -> None:
    """Gradient accumulation divides the loss: 0.25·loss gives 0.25 times the gradient, and a
    unit upstream gradient leaves the kept buffer as it is."""
    logits, labels = batch()
    leaf = logits.clone().requires_grad_()
    (unit,) = torch.autograd.grad(loss_of(leaf, labels), leaf)
    (quarter,) = torch.autograd.grad(0.25 * loss_of(leaf, labels), leaf)
    torch.testing.assert_close(quarter, 0.25 * unit, rtol=1e-15, atol=0)


def test_inplace_backward_must_be_a_bool() -> None:
    logits, labels = batch()
    with pytest.raises(TypeError, match="inplace_backward must be a bool"):
        loss_of(logits, labels, inplace_backward=1)


@pytest.mark.parametrize(
    ("dtype", "reduction", "autocast", "in_backward"),
    [
        (torch.float32, "mean", None, False),
        (torch.bfloat16, "sum", None, False),
        (torch.bfloat16, "mean", torch.bfloat16, False),
        (torch.float16, "mean", None, True),
        (torch.float32, "none", None, True),
        (torch.bfloat16, "mean", torch.float16, True),
    ],
)
def test_the_gradient_waits_for_backward_where_the_upstream_gradient_will_not_be_1(
    dtype: torch.dtype, reduction: str, autocast: torch.dtype | None, in_backward: bool
) -> None:
    """Forward writes the gradient (2 passes over the logits for an upstream gradient of 1, 4
    otherwise) unless it knows the upstream gradient will not be 1: float16 logits, a loss per
    position, a scalar loss under float16 autocast (GradScaler's scale); then backward writes
    it (3 passes, rounded once)."""
    logits = torch.zeros(2, 3, dtype=dtype)
    context = (
        torch.autocast("cpu", dtype=autocast) if autocast is not None else contextlib.nullcontext()
    )
    with context:
        assert gradient_in_backward(logits, reduction) is in_backward
