"""DEL, SMMD and DIST2 in the Triton kernels (``impl="triton"``): the fused loss against
``F.cross_entropy`` + λ·the float64 reference of each kind (values and gradients, digit and
multi-digit vocabularies, every reduction, loss weights, ``shift=True``), in place and in
evaluation bit for bit, rows read in blocks, SMMD's kernel read in tiles, finite differences and
low precision (the logits-free path and torch.compile of both backends: test_kinds.py). On CPU
the kernels run in Triton's interpreter."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from numtok import DEL, DIST2, SMMD, cross_entropy_with_ntl
from numtok.maths.ntl import LossSpec
from numtok.ops.kernels import dispatch, triton_loss

from test_fused import assert_matches_finite_differences
from test_kinds import KIND_IDS, KINDS, VOCABS, make_batch, make_vocab, reference, resolved

NTL_WEIGHT = 0.7


def _expected(
    name: str, kind: Any, logits: torch.Tensor, labels: torch.Tensor, options: dict[str, Any]
) -> torch.Tensor:
    """``F.cross_entropy`` + λ·the kind's float64 reference, with the options' shift and
    reduction (and loss weights and num_items_in_batch on the NTL term)."""
    ce_labels = labels
    if options.get("shift"):
        ce_labels = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], 1)
    reduction = options.get("reduction", "mean")
    flat = logits.reshape(-1, logits.shape[-1])
    if "num_items_in_batch" in options:
        ce = F.cross_entropy(flat, ce_labels.reshape(-1), reduction="sum")
        ce = ce / options["num_items_in_batch"]
    else:
        ce = F.cross_entropy(flat, ce_labels.reshape(-1), reduction=reduction)
    ce = ce.reshape(ce_labels.shape if reduction == "none" else ())
    return ce + NTL_WEIGHT * reference(name, kind, logits, labels, **options)


def _assert_triton_matches(
    name: str,
    kind: Any,
    options: dict[str, Any],
    device: torch.device,
    *,
    seed: int = 5,
) -> None:
    """The kernel on ``device`` against the reference on the CPU (float64)."""
    logits, labels, weights = make_batch(name, seed=seed)
    options = resolved(options, weights)
    on_device = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in options.items()}
    logits_there = logits.detach().to(device).requires_grad_()
    out = cross_entropy_with_ntl(
        logits_there, labels.to(device), make_vocab(name), kind=kind, ntl_weight=NTL_WEIGHT,
        impl="triton", **on_device,
    )  # fmt: skip
    expected = _expected(name, kind, logits, labels, options)
    torch.testing.assert_close(out.loss.cpu(), expected, rtol=1e-10, atol=1e-12)
    upstream = torch.rand(expected.shape, dtype=torch.float64) + 0.5
    (grad,) = torch.autograd.grad(out.loss, logits_there, upstream.to(device))
    (expected_grad,) = torch.autograd.grad(expected, logits, upstream)
    torch.testing.assert_close(grad.cpu(), expected_grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "options",
    [{"shift": True, "reduction": "none"}, {"reduction": "sum", "loss_weights": "random"}],
    ids=["shift-none", "sum-weights"],
)
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("name", list(VOCABS))
def test_the_kernel_equals_cross_entropy_plus_the_reference(
    name: str, kind: Any, options: dict[str, Any], device: torch.device
) -> None:
    _assert_triton_matches(name, kind, options, device)


@pytest.mark.parametrize(
    "options",
    [{}, {"num_items_in_batch": 7, "shift": True}, {"shift": True, "loss_weights": "random"}],
    ids=["mean", "num-items-shift", "mean-weights-shift"],
)
@pytest.mark.parametrize("kind", ["del", "smmd", "dist2"])
def test_the_means_match_the_reference(
    kind: str, options: dict[str, Any], device: torch.device
) -> None:
    defaults = {"del": DEL(), "smmd": SMMD(), "dist2": DIST2()}
    _assert_triton_matches("chunks", defaults[kind], options, device)


@pytest.mark.parametrize("kind", [DEL(), SMMD(mode="smooth", alpha=0.25), DIST2()], ids=str)
def test_in_place_and_evaluation_agree_bit_for_bit(kind: Any) -> None:
    logits, labels, _ = make_batch("chunks", seed=9)
    vocab = make_vocab("chunks")

    def run(x: torch.Tensor, inplace: bool) -> tuple[torch.Tensor, torch.Tensor]:
        out = cross_entropy_with_ntl(
            x * 1.0, labels, vocab, kind=kind, ntl_weight=NTL_WEIGHT, shift=True,
            inplace_backward=inplace, impl="triton",
        )  # fmt: skip
        return out.loss, torch.autograd.grad(out.loss, x)[0]

    loss, grad = run(logits, inplace=False)
    in_place_loss, in_place_grad = run(logits, inplace=True)
    assert torch.equal(loss, in_place_loss) and torch.equal(grad, in_place_grad)
    with torch.no_grad():
        evaluation = cross_entropy_with_ntl(
            logits, labels, vocab, kind=kind, ntl_weight=NTL_WEIGHT, shift=True, impl="triton"
        )
    assert torch.equal(evaluation.loss, loss)


# The interpreter runs every block and tile in Python (11 s): make test-slow.
@pytest.mark.slow
def test_rows_in_blocks_and_the_smmd_kernel_in_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of 4 columns (the two-pass loop of rows longer than 32,768 columns; float64 rows
    take half) and SMMD's (46, 46) kernel read 2 columns at a time (23 tiles): still the
    reference."""
    monkeypatch.setattr(triton_loss, "_MAX_BLOCK_V", 8)
    monkeypatch.setattr(triton_loss, "_PAIR_TILE", 128)
    assert triton_loss._row_launch(59, 46, torch.float64)[:3] == (4, 64, 2)
    options = {"shift": True, "reduction": "none"}
    _assert_triton_matches("chunks", SMMD(), options, torch.device("cpu"), seed=11)


@pytest.mark.parametrize("kind", ["del", "smmd", "dist2"])
def test_the_gradient_matches_finite_differences(kind: str) -> None:
    logits, labels, weights = make_batch("chunks", seed=13, shape=(2, 5))
    vocab = make_vocab("chunks")

    def fn(x: torch.Tensor) -> torch.Tensor:
        return cross_entropy_with_ntl(
            x, labels, vocab, kind=kind, ntl_weight=NTL_WEIGHT, loss_weights=weights,
            shift=True, reduction="none", impl="triton",
        ).loss  # fmt: skip

    assert_matches_finite_differences(fn, logits, directions=2)


@pytest.mark.parametrize("kind", ["del", "smmd", "dist2"])
def test_numtok_impl_triton_takes_the_kernels_for_these_kinds(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = LossSpec.build(
        make_vocab("digits"), kind=kind, reweigh=False, squash_factor=None, ignore_index=-100,
        reduction="mean", shift=False,
    )  # fmt: skip
    assert dispatch.triton_unsupported(spec, weights_need_grad=False) is None
    monkeypatch.setenv(dispatch.IMPL_VARIABLE, "triton")
    monkeypatch.setattr(dispatch, "_first_failure", lambda device: None)  # a GPU that runs it
    assert dispatch.resolve_impl("auto", torch.device("cuda"), None) == "triton"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", ["del", "smmd", "dist2"])
def test_low_precision_and_masked_logits_match_the_torch_path(
    kind: str, dtype: torch.dtype, device: torch.device
) -> None:
    """float32 and bfloat16 logits (computed in float32), a third of the number logits (never
    the label's) masked to -inf (raised to the most negative finite value by both backends):
    finite, and the torch path's values and gradients within rounding."""
    logits, labels, _ = make_batch("chunks", seed=21)
    hidden = torch.zeros(logits.shape, dtype=torch.bool)
    hidden[..., 20:35] = True
    hidden.scatter_(-1, labels.clamp_min(0).unsqueeze(-1), False)  # never the label's own logit
    masked = logits.detach().masked_fill(hidden, -torch.inf).to(device, dtype)
    vocab = make_vocab("chunks")
    results = []
    for impl in ("triton", "torch"):
        x = masked.clone().requires_grad_()
        out = cross_entropy_with_ntl(
            x, labels.to(device), vocab, kind=kind, ntl_weight=NTL_WEIGHT, reduction="none",
            impl=impl,
        )  # fmt: skip
        (grad,) = torch.autograd.grad(out.loss.sum(), x)
        results.append((out.loss.float(), grad.float()))
    (loss, grad), (expected_loss, expected_grad) = results
    assert torch.isfinite(loss).all() and torch.isfinite(grad).all()
    rounding = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(loss, expected_loss, rtol=rounding, atol=rounding)
    torch.testing.assert_close(grad, expected_grad, rtol=rounding, atol=rounding)
