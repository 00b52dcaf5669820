"""loss_and_row_gradients, the building block of the gradient-in-forward paths: chunk by chunk, its
loss terms and its row gradient pieces, expanded by write_row_gradient, give the value and the
logits' gradient of the float64 reference ``F.cross_entropy + w * number_token_loss`` for every
case of tests/cases.py, and autograd through combine_terms agrees piece by piece."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from numtok.maths.ntl import LossSpec
from numtok.ops.kernels.torch_rows import compute_row_statistics, write_row_gradient
from numtok.ops.row_algebra import (
    combine_terms,
    loss_and_row_gradients,
    prepare_rows,
    reduce_terms,
    reduction_scales,
)

from cases import REFERENCE_CASES, make_batch, make_vocab
from test_fused import WEIGHT, on_device, reference, value_and_grads

CPU = torch.device("cpu")

SPEC_ARGUMENTS = ("kind", "reweigh", "squash_factor", "ignore_index", "reduction", "shift")
DEFAULTS: dict[str, Any] = {
    "kind": "was",
    "reweigh": False,
    "squash_factor": None,
    "ignore_index": -100,
    "reduction": "mean",
    "shift": False,
}


def chunked_terms(
    name: str, logits: torch.Tensor, labels: torch.Tensor, chunk: int, **settings: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ce, ntl, loss) reduced and the logits' gradient for a unit upstream gradient per row,
    computed chunk by chunk of ``chunk`` rows as a gradient-in-forward path does."""
    vocab = make_vocab(name)
    spec = LossSpec.build(vocab, **{k: settings.get(k, DEFAULTS[k]) for k in SPEC_ARGUMENTS})
    tables = vocab.tables(logits.device)
    rows, shape = prepare_rows(labels, settings.get("loss_weights"), tables, spec, logits.dtype)
    scales = reduction_scales(rows, spec, settings.get("num_items_in_batch"))
    flat = logits.detach().reshape(-1, logits.shape[-1])  # (M, V)
    gradient = torch.empty_like(flat)
    ce_rows, ntl_rows = [], []
    for start in range(0, flat.shape[0], chunk):
        index = slice(start, start + chunk)
        part = rows.take(index)
        lse, target_logit, number_logits = compute_row_statistics(
            flat[index], part.target_ids, tables.ids, logits.dtype
        )
        terms = loss_and_row_gradients(
            lse, target_logit, number_logits, part, tables, spec, WEIGHT, scales
        )
        ce_rows.append(terms.ce)
        ntl_rows.append(terms.ntl)
        write_row_gradient(
            gradient[index],
            flat[index],
            lse,
            part.target_ids,
            tables.ids,
            terms.grad_lse,
            terms.grad_target,
            terms.grad_numbers,
        )
    num_items = settings.get("num_items_in_batch")
    ce, ntl = reduce_terms(torch.cat(ce_rows), torch.cat(ntl_rows), rows, spec, num_items, shape)
    return ce, ntl, ce + WEIGHT * ntl, gradient.reshape(logits.shape)


@pytest.mark.parametrize(("name", "shape", "seed", "settings"), REFERENCE_CASES)
def test_chunked_gradient_matches_reference(
    name: str, shape: tuple[int, ...], seed: int, settings: dict[str, Any], device: torch.device
) -> None:
    """Chunks of 4 rows: the last one partial for most shapes."""
    assert_chunked_matches_reference(name, shape, seed, settings, chunk=4, device=device)


@pytest.mark.parametrize("chunk", [1, 1000])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_one_row_and_all_rows_per_chunk(chunk: int, reduction: str) -> None:
    weights = torch.rand(2, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    settings = {"reweigh": True, "reduction": reduction, "shift": True, "loss_weights": weights}
    assert_chunked_matches_reference("chunks", (2, 7), 5, settings, chunk=chunk)


def assert_chunked_matches_reference(
    name: str,
    shape: tuple[int, ...],
    seed: int,
    settings: dict[str, Any],
    chunk: int,
    device: torch.device = CPU,
) -> None:
    ignore_index = settings.get("ignore_index", -100)
    batch = make_batch(name, shape=shape, seed=seed, ignore_index=ignore_index)
    logits, labels, settings = on_device(device, *batch, settings)
    vocab = make_vocab(name)
    _, _, value, unit_gradient = chunked_terms(name, logits, labels, chunk, **settings)
    ref_value, (ref_grad,) = value_and_grads(
        lambda: reference(logits, labels, vocab, **settings)[0], [logits]
    )
    # value_and_grads drew this upstream gradient for the reference: a scalar for the scalar
    # reductions, one number per position for "none", which scales that position's row.
    upstream = torch.randn(ref_value.shape, generator=torch.Generator().manual_seed(99))
    upstream = upstream.to(ref_value)[..., None] if upstream.dim() else upstream.to(ref_value)
    torch.testing.assert_close(value, ref_value, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(unit_gradient * upstream, ref_grad, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("reweigh", [False, True])
@pytest.mark.parametrize("kind", ["was", "mse", "huber"])
def test_pieces_equal_autograd_through_combine_terms(
    kind: str, reweigh: bool, reduction: str
) -> None:
    """The three row gradient pieces are those autograd finds through combine_terms, including
    rows that are ignored or not numbers and the reweighing's clamp."""
    vocab = make_vocab("chunks")
    logits, labels = make_batch("chunks", shape=(4, 6), seed=21)
    spec = LossSpec.build(
        vocab,
        kind=kind,
        reweigh=reweigh,
        squash_factor=None,
        ignore_index=-100,
        reduction=reduction,
        shift=False,
    )
    tables = vocab.tables(None)
    rows, shape = prepare_rows(labels, None, tables, spec, torch.float64)
    stats = compute_row_statistics(
        logits.detach().reshape(-1, 59), rows.target_ids, tables.ids, torch.float64
    )
    leaves = [s.clone().requires_grad_() for s in stats]
    out = combine_terms(*leaves, rows, tables, spec, WEIGHT, None, shape)
    expected = torch.autograd.grad(out.loss.sum(), leaves)
    terms = loss_and_row_gradients(
        *stats, rows, tables, spec, WEIGHT, reduction_scales(rows, spec, None)
    )
    pieces = (terms.grad_lse, terms.grad_target, terms.grad_numbers)
    torch.testing.assert_close(pieces, expected, rtol=1e-12, atol=1e-15)
    ce, ntl = reduce_terms(terms.ce, terms.ntl, rows, spec, None, shape)
    torch.testing.assert_close((ce, ntl), (out.ce, out.ntl), rtol=1e-12, atol=1e-15)
