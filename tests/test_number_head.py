"""The number head (numtok.linear_number_token_loss) against the materialised path: NTL of the
logits ``hidden @ weight.T + bias`` by ``number_token_loss`` in float64 (values and the gradients
of hidden, weight, bias and lse within 1e-10) for every kind on digit and 1-3-digit-chunk
vocabularies, with and without the causal shift, every reduction; reweigh from ``lse`` and from
the labels' log-probabilities; gradcheck; where the gradients go (only the number-labelled rows
of hidden, only the number rows of weight and bias); low precision, soft cap, tied and padded
output layers; the module; bad input."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from numtok import (
    DEL,
    LinearNumberTokenLoss,
    NumberVocab,
    linear_number_token_loss,
    number_token_loss,
)

from cases import KIND_IDS, KINDS, VOCABS, make_labels, make_vocab

HIDDEN = 6
#: Every kind the number head takes, with an id: NTL's (cases.KINDS), the number-level loss and
#: the newer ones with their authors' settings.
ALL_KINDS: list[Any] = [*KINDS, "number", "del", "smmd", "dist2"]
ALL_KIND_IDS = [*KIND_IDS, "number", "del", "smmd", "dist2"]


def _layer(
    name: str, seed: int, shape: tuple[int, ...] = (3, 7), dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """hidden (*shape, H), weight (V, H), bias (V,) requiring grad, and labels of ``shape``."""
    generator = torch.Generator().manual_seed(seed)
    vocab_size = VOCABS[name][1]
    hidden = torch.randn(*shape, HIDDEN, generator=generator, dtype=torch.float64)
    weight = torch.randn(vocab_size, HIDDEN, generator=generator, dtype=torch.float64)
    bias = torch.randn(vocab_size, generator=generator, dtype=torch.float64)
    labels = make_labels(name, shape, generator)
    leaves = [t.to(dtype).requires_grad_() for t in (hidden, weight, bias)]
    return leaves[0], leaves[1], leaves[2], labels


def _logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return hidden @ weight.T + (0 if bias is None else bias)


def _gradients(value: torch.Tensor, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The gradients of ``value`` (weighted by fixed random numbers when it is not a scalar)."""
    upstream = torch.randn(
        value.shape, generator=torch.Generator().manual_seed(9), dtype=value.dtype
    )
    return torch.autograd.grad((value * upstream).sum(), inputs, retain_graph=True)


def _assert_close_with_gradients(
    out: torch.Tensor,
    reference: torch.Tensor,
    inputs: tuple[torch.Tensor, ...],
    reference_inputs: tuple[torch.Tensor, ...] | None = None,
    tolerance: float = 1e-10,
) -> None:
    torch.testing.assert_close(out, reference, rtol=tolerance, atol=tolerance)
    got = _gradients(out, inputs)
    expected = _gradients(reference, inputs if reference_inputs is None else reference_inputs)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("kind", ALL_KINDS, ids=ALL_KIND_IDS)
@pytest.mark.parametrize("name", ["digits", "chunks"])
def test_equals_the_loss_of_the_materialised_logits(
    name: str, kind: Any, shift: bool, reduction: str
) -> None:
    vocab = make_vocab(name)
    hidden, weight, bias, labels = _layer(name, seed=1)
    settings = {"kind": kind, "shift": shift, "reduction": reduction}
    out = linear_number_token_loss(hidden, weight, labels, vocab, bias=bias, **settings)
    reference = number_token_loss(_logits(hidden, weight, bias), labels, vocab, **settings)
    _assert_close_with_gradients(out, reference, (hidden, weight, bias))


@pytest.mark.parametrize(
    "settings",
    [
        {"kind": "was", "reduction": "none"},
        {"kind": "was", "squash_factor": 9.0, "num_items_in_batch": 5},
        {"kind": "mse", "shift": True},
        {"kind": "huber", "reduction": "sum"},
        {"kind": "number", "shift": True},
    ],
    ids=["was-none", "was-squash", "mse-shift", "huber-sum", "number-shift"],
)
@pytest.mark.parametrize("name", ["digits", "chunks"])
def test_reweigh_reads_lse_and_passes_its_gradient_on(name: str, settings: dict[str, Any]) -> None:
    """``lse`` as a cross-entropy kernel beside the head returns it: its gradient flows back
    into the logits it came from, as the reference's full-vocabulary log-sum-exp does."""
    vocab = make_vocab(name)
    hidden, weight, bias, labels = _layer(name, seed=2)
    lse = torch.logsumexp(_logits(hidden, weight, bias), dim=-1)  # (3, 7)
    out = linear_number_token_loss(
        hidden, weight, labels, vocab, bias=bias, lse=lse, reweigh=True, **settings
    )
    reference = number_token_loss(
        _logits(hidden, weight, bias), labels, vocab, reweigh=True, **settings
    )
    _assert_close_with_gradients(out, reference, (hidden, weight, bias))


@pytest.mark.parametrize("kind", ["was", "mse", "number"])
@pytest.mark.parametrize("name", ["digits", "chunks"])
def test_reweigh_from_the_labels_log_probabilities(name: str, kind: str) -> None:
    """TRL's fused LM head returns ``log p(label)`` per position, shifted: position t holds that of
    ``labels[t + 1]`` (padded with one 0); the head takes ``lse = z_label - log p`` from it."""
    vocab = make_vocab(name)
    hidden, weight, bias, labels = _layer(name, seed=3)
    log_probs = torch.log_softmax(_logits(hidden, weight, bias), dim=-1)[:, :-1]  # (3, 6, V)
    next_labels = labels[:, 1:]
    picked = log_probs.gather(-1, next_labels.clamp_min(0)[..., None]).squeeze(-1)
    label_log_probs = F.pad(torch.where(next_labels >= 0, picked, 0.0), (0, 1))  # (3, 7)
    out = linear_number_token_loss(
        hidden, weight, labels, vocab, bias=bias, label_log_probs=label_log_probs, kind=kind,
        reweigh=True, shift=True,
    )  # fmt: skip
    reference = number_token_loss(
        _logits(hidden, weight, bias), labels, vocab, kind=kind, reweigh=True, shift=True
    )
    _assert_close_with_gradients(out, reference, (hidden, weight, bias))


@pytest.mark.parametrize("settings", [{}, {"shift": True, "kind": "mse"}, {"kind": DEL()}])
def test_loss_weights_and_num_items(settings: dict[str, Any]) -> None:
    vocab = make_vocab("chunks")
    hidden, weight, bias, labels = _layer("chunks", seed=4)
    weights = torch.rand(labels.shape, generator=torch.Generator().manual_seed(5))
    weights = weights.double()
    for extra in ({"loss_weights": weights}, {"loss_weights": weights, "num_items_in_batch": 4}):
        out = linear_number_token_loss(
            hidden, weight, labels, vocab, bias=bias, **settings, **extra
        )
        reference = number_token_loss(
            _logits(hidden, weight, bias), labels, vocab, **settings, **extra
        )
        _assert_close_with_gradients(out, reference, (hidden, weight, bias))


def test_gradcheck() -> None:
    vocab = make_vocab("chunks")
    hidden, weight, bias, labels = _layer("chunks", seed=6, shape=(2, 4))
    lse = torch.logsumexp(_logits(hidden, weight, bias), dim=-1).detach().requires_grad_()

    def loss(*inputs: torch.Tensor) -> torch.Tensor:
        h, w, b, s = inputs
        return linear_number_token_loss(
            h, w, labels, vocab, bias=b, lse=s, reweigh=True, shift=True, reduction="none"
        )

    assert torch.autograd.gradcheck(loss, (hidden, weight, bias, lse))


@pytest.mark.parametrize("shift", [False, True])
def test_gradients_reach_only_the_number_rows(shift: bool) -> None:
    """The hidden states get a gradient only where the label (the next label with the shift) is a
    number token, the weight and the bias only in the number tokens' rows."""
    vocab = make_vocab("chunks")
    hidden, weight, bias, labels = _layer("chunks", seed=7, shape=(4, 9))
    out = linear_number_token_loss(hidden, weight, labels, vocab, bias=bias, shift=shift)
    grad_hidden, grad_weight, grad_bias = torch.autograd.grad(out, (hidden, weight, bias))
    targets = F.pad(labels[:, 1:], (0, 1), value=-100) if shift else labels
    is_number = torch.isin(targets, vocab.ids)
    assert bool(is_number.any()) and bool((~is_number).any())
    touched = grad_hidden.abs().sum(-1) > 0
    assert torch.equal(touched, is_number)
    number_rows = torch.zeros(weight.shape[0], dtype=torch.bool)
    number_rows[vocab.ids] = True
    assert bool((grad_weight[~number_rows] == 0).all()) and bool(
        (grad_bias[~number_rows] == 0).all()
    )
    assert bool((grad_weight[number_rows].abs().sum(-1) > 0).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["digits", "chunks"])
def test_low_precision_inputs_give_float32_number_logits(name: str, dtype: torch.dtype) -> None:
    """bfloat16/float16 hidden states and weights: the number logits are computed in float32
    from the given values, so the loss equals the float64 loss of those same values to float32
    precision (the materialised bf16 logits would be rounded to 8 bits first)."""
    vocab = make_vocab(name)
    hidden, weight, bias, labels = _layer(name, seed=8, dtype=dtype)
    out = linear_number_token_loss(hidden, weight, labels, vocab, bias=bias, shift=True)
    assert out.dtype == torch.float32
    exact = [t.detach().double().requires_grad_() for t in (hidden, weight, bias)]
    reference = number_token_loss(_logits(*exact), labels, vocab, shift=True)
    torch.testing.assert_close(out.double(), reference, rtol=1e-5, atol=1e-5)
    got = torch.autograd.grad(out, (hidden, weight, bias))
    expected = torch.autograd.grad(reference, exact)
    for a, b in zip(got, expected, strict=True):
        assert a.dtype == dtype
        scale = float(b.abs().max())
        torch.testing.assert_close(a.double(), b, rtol=0, atol=1e-2 * scale)


def test_soft_cap() -> None:
    vocab = make_vocab("chunks")
    hidden, weight, bias, labels = _layer("chunks", seed=10)
    cap = 1.5
    capped = cap * torch.tanh(_logits(hidden, weight, bias) / cap)
    lse = torch.logsumexp(cap * torch.tanh(_logits(hidden, weight, bias) / cap), dim=-1)
    out = linear_number_token_loss(
        hidden, weight, labels, vocab, bias=bias, lse=lse, reweigh=True, logit_softcap=cap,
        shift=True,
    )  # fmt: skip
    reference = number_token_loss(capped, labels, vocab, reweigh=True, shift=True)
    _assert_close_with_gradients(out, reference, (hidden, weight, bias))


def test_tied_embeddings_and_a_padded_output_layer() -> None:
    """A layer padded beyond the tokenizer (V = 64 rows for 59 tokens) whose weight is also the
    input embedding: the hidden states depend on the weight too, and both gradients add up."""
    values = dict(VOCABS["chunks"][0])
    vocab = NumberVocab.from_values(values, vocab_size=64)
    generator = torch.Generator().manual_seed(11)
    weight = torch.randn(64, HIDDEN, generator=generator, dtype=torch.float64, requires_grad=True)
    input_ids = torch.randint(64, (2, 8), generator=generator)
    labels = make_labels("chunks", (2, 8), generator)
    hidden = torch.tanh(F.embedding(input_ids, weight))  # (2, 8, H), from the same weight
    out = linear_number_token_loss(hidden, weight, labels, vocab, shift=True)
    reference = number_token_loss(hidden @ weight.T, labels, vocab, shift=True)
    _assert_close_with_gradients(out, reference, (weight,))


def test_no_number_label_gives_a_connected_zero() -> None:
    vocab = make_vocab("digits")
    hidden, weight, _, _ = _layer("digits", seed=12)
    labels = torch.full((3, 7), 15)  # a text token everywhere
    labels[0, :2] = -100
    for reduction in ("mean", "sum", "none"):
        out = linear_number_token_loss(hidden, weight, labels, vocab, reduction=reduction)
        assert bool((out == 0).all()) and out.requires_grad
        (grad,) = torch.autograd.grad(out.sum(), hidden)
        assert bool((grad == 0).all())


def test_module_equals_the_function_and_keeps_exact_values() -> None:
    vocab = make_vocab("chunks")
    hidden, weight, bias, labels = _layer("chunks", seed=13)
    module = LinearNumberTokenLoss(vocab, kind="mse", shift=True)
    function = linear_number_token_loss(hidden, weight, labels, vocab, bias=bias, kind="mse",
                                        shift=True)  # fmt: skip
    torch.testing.assert_close(module(hidden, weight, labels, bias=bias), function)
    module.to(torch.bfloat16)  # the value table stays float64 (9.99 is not rounded to 10)
    torch.testing.assert_close(module(hidden, weight, labels, bias=bias), function)
    assert "kind='mse'" in repr(module) and "number_tokens=46" in repr(module)
    number_level = LinearNumberTokenLoss(vocab, kind="number", shift=True)
    torch.testing.assert_close(
        number_level(hidden, weight, labels, bias=bias),
        number_token_loss(_logits(hidden, weight, bias), labels, vocab, kind="number", shift=True),
    )
    assert "kind='number'" in repr(number_level)


# ------------------------------------------------------------------------------- bad input


def _good() -> dict[str, Any]:
    hidden, weight, bias, labels = _layer("digits", seed=14)
    return {"hidden": hidden, "weight": weight, "labels": labels, "bias": bias}


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"reweigh": True}, ValueError, "pass lse= .* or label_log_probs="),
        ({"reweigh": True, "lse": torch.zeros(3, 6)}, ValueError, "lse must have the labels'"),
        ({"lse": torch.zeros(3, 7, dtype=torch.long)}, TypeError, "lse must be a floating-point"),
        ({"lse": torch.zeros(3, 7), "label_log_probs": torch.zeros(3, 7)}, ValueError, "not both"),
        ({"label_log_probs": [0.0]}, TypeError, "label_log_probs must be a torch.Tensor"),
        ({"weight": torch.zeros(16, HIDDEN).double()}, ValueError, "weight has 16 rows"),
        ({"weight": torch.zeros(17, HIDDEN)}, TypeError, "weight must have the hidden"),
        ({"labels": torch.zeros(3, 6).long()}, ValueError, "labels must have shape hidden"),
        ({"labels": torch.full((3, 7), 17)}, ValueError, r"token ids in \[0, 17\)"),
        ({"labels": torch.zeros(3, 7)}, TypeError, "labels must be an integer tensor"),
        ({"kind": "number", "squash_factor": 2.0}, ValueError, "squash_factor applies to"),
        ({"kind": "nope"}, ValueError, "kind must be one of"),
        ({"logit_softcap": 0.0}, ValueError, "logit_softcap must be"),
        ({"reduction": "avg"}, ValueError, "reduction must be"),
    ],
)  # fmt: skip
def test_bad_input_is_named(change: dict[str, Any], error: type, message: str) -> None:
    arguments = {**_good(), **change}
    vocab = make_vocab("digits")
    with pytest.raises(error, match=message):
        linear_number_token_loss(
            arguments.pop("hidden"), arguments.pop("weight"), arguments.pop("labels"), vocab,
            **arguments,
        )  # fmt: skip


def test_a_partitioned_zero3_weight_is_named_with_the_way_to_read_it() -> None:
    """DeepSpeed ZeRO-3 leaves a (0,) placeholder with the full shape in ``ds_shape`` outside the
    weight's own module call; read there, the number head says how to gather it."""
    good = _good()
    placeholder = torch.nn.Parameter(good["weight"].new_empty(0))
    placeholder.ds_shape = good["weight"].shape  # type: ignore[attr-defined]
    match = r"ZeRO-3 parameter.*shape \(0,\), full shape \(17, 6\).*GatheredParameters"
    with pytest.raises(ValueError, match=match):
        linear_number_token_loss(good["hidden"], placeholder, good["labels"], make_vocab("digits"))


def test_number_level_needs_digit_strings() -> None:
    with pytest.raises(ValueError, match="digit strings"):
        LinearNumberTokenLoss(make_vocab("custom"), kind="number")
