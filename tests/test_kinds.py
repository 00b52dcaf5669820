"""DEL, SMMD and DIST2 (numtok.maths.kinds) against their float64 references (reference_kinds.py):
values and gradients on a digit and a multi-digit vocabulary (word starts and a decimal point
included), every reduction, loss weights and ``shift=True``; the place weights on the authors'
examples; the fused and logits-free paths equal to the reference path (the logits-free path and
torch.compile on both backends); bad settings. (The Triton kernels' other tests of these kinds:
test_kinds_triton.py.)"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from numtok import (
    DEL,
    DIST2,
    SMMD,
    NumberTokenLoss,
    NumberVocab,
    cross_entropy_with_ntl,
    number_token_loss,
)
from numtok.losses.linear import linear_cross_entropy_with_ntl
from numtok.maths.kinds import smmd_kernel
from numtok.maths.ntl import LossSpec, place_weights

import reference_kinds

#: ids 3..12 the digits, 13 the decimal point, in a vocabulary of 17.
DIGITS: dict[int, str] = {3 + d: str(d) for d in range(10)}
DIGIT_POINT = 13
#: 1-3-digit chunks, ids 10..19 the word-start digits (``Ġ7``), 55 the decimal point.
CHUNKS: dict[int, str] = {
    **{d: str(d) for d in range(10)},
    **{10 + d: str(d) for d in range(10)},
    **{20 + k: f"{i:02d}" for k, i in enumerate(range(0, 100, 7))},
    **{40 + k: f"{i:03d}" for k, i in enumerate(range(0, 1000, 97))},
}
CHUNK_POINT, CHUNK_WORD_STARTS = 55, set(range(10, 20))
VOCABS: dict[str, tuple[dict[int, str], int, int, set[int]]] = {
    "digits": (DIGITS, 17, DIGIT_POINT, set()),
    "chunks": (CHUNKS, 59, CHUNK_POINT, CHUNK_WORD_STARTS),
}
KINDS: list[Any] = [
    DEL(),
    DEL(place_weights=False),
    SMMD(),
    SMMD(kernel="laplace", sigmas=(1.0, 3.0), squash_factor=None, mode="mmd"),
    SMMD(mode="smooth", alpha=0.25),
    DIST2(),
    DIST2(place_weights=False, temperature=2.0),
]
KIND_IDS = ["del", "del-flat", "smmd", "smmd-laplace-mmd", "smmd-smooth", "dist2", "dist2-flat"]
SETTINGS: list[dict[str, Any]] = [
    {},
    {"shift": True},
    {"shift": True, "reduction": "none"},
    {"reduction": "sum", "loss_weights": "random"},
    {"num_items_in_batch": 7, "shift": True},
]


def make_vocab(name: str) -> NumberVocab:
    tokens, size, point, word_starts = VOCABS[name]
    return NumberVocab.from_values(
        dict(tokens), vocab_size=size, decimal_point_ids=[point], word_start_ids=word_starts
    )


def make_batch(name: str, seed: int = 0, shape: tuple[int, int] = (3, 9)) -> tuple[Any, ...]:
    """Logits (B, T, V) and labels mixing number tokens (~55%), decimal points (~10%), other
    tokens (~25%) and ignore_index (~10%)."""
    tokens, size, point, _ = VOCABS[name]
    generator = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(*shape, size, generator=generator, dtype=torch.float64)
    number_ids = torch.tensor(sorted(tokens))
    labels = number_ids[torch.randint(len(number_ids), shape, generator=generator)]
    text = torch.randint(size, shape, generator=generator)
    choice = torch.rand(shape, generator=generator)
    labels = torch.where(choice < 0.25, text, labels)
    labels = torch.where((choice >= 0.25) & (choice < 0.35), torch.full_like(labels, point), labels)
    labels = torch.where(choice > 0.9, torch.full_like(labels, -100), labels)
    weights = torch.rand(shape, generator=generator, dtype=torch.float64)
    return logits.requires_grad_(), labels, weights


def reference(
    name: str, kind: Any, logits: torch.Tensor, labels: torch.Tensor, **settings: Any
) -> torch.Tensor:
    tokens, _, point, word_starts = VOCABS[name]
    return reference_kinds.kind_loss(
        kind, logits, labels, tokens, point_ids={point}, word_start_ids=word_starts, **settings
    )


def resolved(settings: dict[str, Any], weights: torch.Tensor) -> dict[str, Any]:
    return {k: (weights if v == "random" else v) for k, v in settings.items()}


# ---------------------------------------------------------------------------------- place weights


def _weights_of(name: str, ids: list[int], kind: Any) -> list[float]:
    vocab = make_vocab(name)
    spec = LossSpec.build(
        vocab, kind=kind, reweigh=False, squash_factor=None, ignore_index=-100,
        reduction="mean", shift=False,
    )  # fmt: skip
    weights = place_weights(torch.tensor([ids]), vocab.tables(), spec, torch.float64)
    assert weights is not None
    return [round(float(w), 3) for w in weights[0]]


def _digit_ids(text: str) -> list[int]:
    return [DIGIT_POINT if c == "." else 3 + int(c) if c.isdigit() else 0 for c in text]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("12345", [10, 8, 6, 4, 2]),
        ("3.14159", [2, 0, 0.961, 0.942, 0.924, 0.906, 0.888]),
        ("0.05", [2, 0, 0.961, 0.942]),
        (".5", [0, 2]),
        ("1.2.3", [2, 0, 0.961, 0, 0.942]),
        ("12x3", [4, 2, 0, 2]),
    ],
)
def test_del_place_weights_are_the_authors(text: str, expected: list[float]) -> None:
    assert _weights_of("digits", _digit_ids(text), "del") == expected


def test_dist2_place_weights_count_within_runs_of_digits() -> None:
    assert _weights_of("digits", _digit_ids("123.45"), "dist2") == [3, 2, 1, 0, 2, 1]


def test_multi_digit_tokens_take_the_place_of_their_last_digit() -> None:
    # 097|42 (places 3 and 1), then Ġ7 (id 17) begins a new number: 7|1|.|000|07, whose
    # fraction tokens end at the 3rd and the 5th decimal.
    ids = [41, 26, 17, 1, CHUNK_POINT, 40, 21]
    assert _weights_of("chunks", ids, "del") == [6, 2, 4, 2, 0, 0.924, 0.888]
    assert _weights_of("chunks", ids, "dist2") == [3, 1, 2, 1, 0, 3, 1]


# ---------------------------------------------------------------------------------- reference


@pytest.mark.parametrize("settings", SETTINGS, ids=str)
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("name", list(VOCABS))
def test_number_token_loss_equals_the_reference(
    name: str, kind: Any, settings: dict[str, Any]
) -> None:
    logits, labels, weights = make_batch(name, seed=len(str(settings)))
    options = resolved(settings, weights)
    expected = reference(name, kind, logits, labels, **options)
    got = number_token_loss(logits, labels, make_vocab(name), kind=kind, **options)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    probe = torch.randn_like(expected)
    (expected_grad,) = torch.autograd.grad((expected * probe).sum(), logits)
    (grad,) = torch.autograd.grad((got * probe).sum(), logits)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["del", "smmd", "dist2"])
def test_gradcheck(kind: str) -> None:
    logits, labels, _ = make_batch("chunks", seed=3, shape=(2, 5))
    vocab = make_vocab("chunks")
    assert torch.autograd.gradcheck(
        lambda x: number_token_loss(x, labels, vocab, kind=kind, shift=True), (logits,)
    )


@pytest.mark.parametrize("kind", ["del", "smmd", "dist2"])
def test_a_batch_without_numbers_gives_zero_with_a_graph(kind: str) -> None:
    logits, _, _ = make_batch("digits")
    labels = torch.zeros(logits.shape[:-1], dtype=torch.long)  # id 0: text
    loss = number_token_loss(logits, labels, make_vocab("digits"), kind=kind)
    assert float(loss.detach()) == 0 and loss.requires_grad


def test_the_smmd_kernel_of_0_to_999_is_nearly_flat() -> None:
    kernel = smmd_kernel(torch.arange(1000, dtype=torch.float64), SMMD())
    assert float(kernel[0, 1]) == pytest.approx(0.8825, abs=1e-4)
    assert float(kernel[0, 9]) == pytest.approx(0.868, abs=1e-3)
    digits = smmd_kernel(torch.arange(10, dtype=torch.float64), SMMD())
    # The squash is the identity on digits (s = 9 = the largest distance).
    torch.testing.assert_close(
        digits[0, 3], torch.tensor(float(torch.exp(torch.tensor(-9 / 8.0)))).double()
    )


# ---------------------------------------------------------------------------------- fused, linear


@pytest.mark.parametrize("settings", SETTINGS[1:4], ids=str)
@pytest.mark.parametrize("kind", ["del", "smmd", "dist2"])
@pytest.mark.parametrize("name", list(VOCABS))
def test_fused_equals_cross_entropy_plus_the_reference(
    name: str, kind: str, settings: dict[str, Any]
) -> None:
    logits, labels, weights = make_batch(name, seed=5)
    options = resolved(settings, weights)
    ntl_weight = 0.7
    out = cross_entropy_with_ntl(
        logits, labels, make_vocab(name), kind=kind, ntl_weight=ntl_weight, **options
    )
    shifted = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], 1)
    ce_labels = shifted if options.get("shift") else labels
    ce = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        ce_labels.reshape(-1),
        reduction=options.get("reduction", "mean"),
    ).reshape(ce_labels.shape if options.get("reduction") == "none" else ())
    ntl_options = {k: v for k, v in options.items()}
    expected = ce + ntl_weight * reference(name, kind_settings(kind), logits, labels, **ntl_options)
    torch.testing.assert_close(out.loss, expected, rtol=1e-10, atol=1e-12)
    (grad,) = torch.autograd.grad(out.loss.sum(), logits)
    (expected_grad,) = torch.autograd.grad(expected.sum(), logits)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-12)


def kind_settings(kind: str) -> Any:
    return {"del": DEL(), "smmd": SMMD(), "dist2": DIST2()}[kind]


@pytest.mark.parametrize(
    ("recompute", "impl"),
    [(False, "torch"), (True, "torch"), (False, "triton")],
    ids=["in-forward", "recompute", "in-forward-triton"],  # Triton does not recompute
)
@pytest.mark.parametrize("kind", ["del", "smmd", "dist2"])
def test_logits_free_equals_the_logits_path(kind: str, recompute: bool, impl: str) -> None:
    _, labels, _ = make_batch("chunks", seed=7)
    generator = torch.Generator().manual_seed(7)
    hidden = torch.randn(*labels.shape, 6, generator=generator, dtype=torch.float64)
    weight = torch.randn(59, 6, generator=generator, dtype=torch.float64)
    hidden.requires_grad_()
    weight.requires_grad_()
    vocab = make_vocab("chunks")
    reduction = "none" if recompute else "mean"  # "none" with a gradient recomputes
    out = linear_cross_entropy_with_ntl(
        hidden, weight, labels, vocab, kind=kind, ntl_weight=0.5, shift=True,
        reduction=reduction, chunk_size=4, impl=impl,
    )  # fmt: skip
    expected = cross_entropy_with_ntl(
        hidden @ weight.T, labels, vocab, kind=kind, ntl_weight=0.5, shift=True,
        reduction=reduction, impl="torch",
    )  # fmt: skip
    torch.testing.assert_close(out.loss, expected.loss, rtol=1e-10, atol=1e-12)
    grads = torch.autograd.grad(out.loss.sum(), (hidden, weight))
    expected_grads = torch.autograd.grad(expected.loss.sum(), (hidden, weight))
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_the_module_takes_the_kinds() -> None:
    logits, labels, _ = make_batch("digits")
    vocab = make_vocab("digits")
    module = NumberTokenLoss(vocab, kind=SMMD(mode="mmd"))
    torch.testing.assert_close(
        module(logits, labels), number_token_loss(logits, labels, vocab, kind=SMMD(mode="mmd"))
    )
    assert "kind='smmd'" in repr(module)


# ---------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("settings", "error", "match"),
    [
        ({"kind": "del", "reweigh": True}, ValueError, "reweigh applies to NTL's kinds"),
        ({"kind": "smmd", "squash_factor": 3.0}, ValueError, r"SMMD\(squash_factor=...\)"),
        ({"kind": "dels"}, ValueError, r"'del', 'smmd', 'dist2'"),
    ],
)
def test_settings_these_kinds_do_not_take_are_refused(
    settings: dict[str, Any], error: type[Exception], match: str
) -> None:
    logits, labels, _ = make_batch("digits")
    with pytest.raises(error, match=match):
        number_token_loss(logits, labels, make_vocab("digits"), **settings)


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: SMMD(kernel="cosine"), ValueError, "SMMD\\(kernel=...\\) must be 'gaussian'"),
        (lambda: SMMD(sigmas=[2.0]), TypeError, "non-empty tuple"),
        (lambda: SMMD(sigmas=(0.0,)), ValueError, "finite number > 0, got 0.0"),
        (lambda: SMMD(squash_factor=1.0), ValueError, "must be a finite number > 1, got 1.0"),
        (lambda: SMMD(mode="both"), ValueError, "'smmd', 'mmd' or 'smooth'"),
        (lambda: SMMD(alpha=-1), ValueError, "'auto' or a number >= 0"),
        (lambda: DEL(place_weights=1), TypeError, "must be a bool, got 1"),
        (lambda: DIST2(temperature=0), ValueError, "finite number > 0, got 0"),
    ],
)
def test_bad_settings_name_themselves(build: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        build()


def test_the_trainer_loss_takes_the_kinds() -> None:
    from numtok.hf import NTLossForTrainer

    logits, labels, _ = make_batch("chunks")
    vocab = make_vocab("chunks")
    loss_fn = NTLossForTrainer(vocab, kind="del", ntl_weight=0.5)
    expected = cross_entropy_with_ntl(logits, labels, vocab, kind="del", ntl_weight=0.5, shift=True)
    torch.testing.assert_close(loss_fn(logits, labels), expected.loss)


# Triton's interpreter under torch.compile takes 2-3 s a kind: one kind in make test, the rest slow.
_SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    ("kind", "impl"),
    [
        ("del", "torch"),
        ("smmd", "torch"),
        ("dist2", "torch"),
        ("dist2", "triton"),
        pytest.param("del", "triton", marks=_SLOW),
        pytest.param("smmd", "triton", marks=_SLOW),
    ],
)
def test_torch_compile_keeps_one_graph_and_matches_eager(kind: str, impl: str) -> None:
    """fullgraph: both backends' kinds compile to one graph (Triton's as its custom ops)."""
    torch._dynamo.reset()
    logits, labels, weights = make_batch("chunks", seed=12)
    vocab = make_vocab("chunks")

    def loss(x: torch.Tensor) -> torch.Tensor:
        return cross_entropy_with_ntl(
            x, labels, vocab, kind=kind, ntl_weight=0.7, shift=True, loss_weights=weights,
            reduction="none", impl=impl,
        ).loss  # fmt: skip

    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
    eager_value, compiled_value = loss(logits), compiled(logits)
    torch.testing.assert_close(compiled_value, eager_value, rtol=1e-12, atol=1e-14)
    upstream = torch.rand(eager_value.shape, dtype=torch.float64) + 0.5
    (eager_grad,) = torch.autograd.grad(eager_value, logits, upstream)
    (compiled_grad,) = torch.autograd.grad(compiled_value, logits, upstream)
    torch.testing.assert_close(compiled_grad, eager_grad, rtol=1e-12, atol=1e-14)
