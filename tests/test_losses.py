"""number_token_loss and NumberTokenLoss against the float64 reference, plus the properties that
pin the behaviour."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch

from numtok import NumberTokenLoss, NumberVocab, number_token_loss

from cases import REFERENCE_CASES, VOCABS, make_batch, make_vocab
from reference import reference_number_token_loss


def loss_and_grad(fn: Any, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    value = fn(logits)
    (grad,) = torch.autograd.grad(value.sum(), logits)
    return value.detach(), grad


def assert_matches_reference(
    name: str, logits: torch.Tensor, labels: torch.Tensor, **settings: Any
) -> None:
    vocab = make_vocab(name)
    values, _ = VOCABS[name]
    ours, ours_grad = loss_and_grad(
        lambda x: number_token_loss(x, labels, vocab, **settings), logits
    )
    ref, ref_grad = loss_and_grad(
        lambda x: reference_number_token_loss(x, labels, values, **settings), logits
    )
    torch.testing.assert_close(ours, ref, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(ours_grad, ref_grad, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(("name", "shape", "seed", "settings"), REFERENCE_CASES)
def test_matches_reference(
    name: str, shape: tuple[int, ...], seed: int, settings: dict[str, Any]
) -> None:
    ignore_index = settings.get("ignore_index", -100)
    logits, labels = make_batch(name, shape=shape, seed=seed, ignore_index=ignore_index)
    assert_matches_reference(name, logits, labels, **settings)


@pytest.mark.parametrize("name", list(VOCABS))
@pytest.mark.parametrize("kind", ["was", "mse", "huber"])
@pytest.mark.parametrize("reweigh", [False, True])
def test_gradcheck(name: str, kind: str, reweigh: bool) -> None:
    vocab = make_vocab(name)
    logits, labels = make_batch(name, shape=(2, 3), seed=5)
    weights = torch.rand(2, 3, dtype=torch.float64)
    squash = 4.0 if kind == "was" else None

    def fn(x: torch.Tensor) -> torch.Tensor:
        return number_token_loss(
            x, labels, vocab, kind=kind, reweigh=reweigh, squash_factor=squash, loss_weights=weights
        )

    assert torch.autograd.gradcheck(fn, (logits.detach().requires_grad_(),))


# ------------------------------------------------------------------ properties


def test_one_hot_prediction_costs_the_distance() -> None:
    """A confident prediction of digit k for label y costs |k - y| (WAS), (k - y)² (MSE)."""
    vocab = make_vocab("digits")
    for predicted, label in itertools.product(range(10), range(10)):
        logits = torch.full((1, 17), -50.0, dtype=torch.float64)
        logits[0, 3 + predicted] = 50.0
        labels = torch.tensor([3 + label])
        was = number_token_loss(logits, labels, vocab)
        mse = number_token_loss(logits, labels, vocab, kind="mse")
        assert float(was) == pytest.approx(abs(predicted - label), abs=1e-12)
        assert float(mse) == pytest.approx((predicted - label) ** 2, abs=1e-12)


@pytest.mark.parametrize("name", list(VOCABS))
@pytest.mark.parametrize("kind", ["was", "mse", "mae"])
def test_minimal_at_the_right_token_and_monotone_in_distance(name: str, kind: str) -> None:
    """Putting most mass on candidate j: the loss is smallest for j == label and grows with
    |v_j - y| among tokens of the label's length."""
    vocab = make_vocab(name)
    scaled = vocab.scaled_values.tolist()
    for label_position in range(len(vocab)):
        group = vocab.lengths[label_position]
        candidates = [j for j in range(len(vocab)) if vocab.lengths[j] == group]
        losses = []
        for j in candidates:
            logits = torch.zeros(1, vocab.vocab_size, dtype=torch.float64)
            logits[0, vocab.ids[j]] = 30.0
            loss = number_token_loss(
                logits, vocab.ids[label_position : label_position + 1], vocab, kind=kind
            )
            losses.append((abs(scaled[j] - scaled[label_position]), float(loss)))
        losses.sort()
        assert losses[0][0] == 0
        for (d1, l1), (d2, l2) in itertools.pairwise(losses):
            assert l1 <= l2 + 1e-9 if d2 - d1 < 1e-9 else l1 < l2


def test_zero_at_non_number_positions_and_no_gradient_from_them() -> None:
    vocab = make_vocab("chunks")
    logits, labels = make_batch("chunks", shape=(4, 9), seed=6)
    is_number = (labels >= 0) & torch.isin(labels, vocab.ids)
    for kind in ["was", "mse"]:
        per_position = number_token_loss(
            logits, labels, vocab, kind=kind, reduction="none", reweigh=True
        )
        assert per_position.shape == labels.shape
        assert torch.all(per_position[~is_number] == 0)
        assert torch.all(per_position[is_number] > 0)
        (grad,) = torch.autograd.grad(per_position.sum(), logits)
        assert torch.all(grad[~is_number] == 0)


def test_mean_is_the_weighted_mean_over_number_positions() -> None:
    vocab = make_vocab("digits")
    logits, labels = make_batch("digits", shape=(3, 8), seed=7)
    weights = torch.rand(3, 8, dtype=torch.float64)
    per_position = number_token_loss(logits, labels, vocab, reduction="none", loss_weights=weights)
    is_number = torch.isin(labels, vocab.ids)
    mean = number_token_loss(logits, labels, vocab, loss_weights=weights)
    torch.testing.assert_close(mean, per_position.sum() / weights[is_number].sum())
    total = number_token_loss(logits, labels, vocab, loss_weights=weights, reduction="sum")
    torch.testing.assert_close(total, per_position.sum())


def test_gradient_accumulation_with_num_items_in_batch_is_exact() -> None:
    """Two halves with num_items_in_batch = the whole batch's number count sum to the whole."""
    vocab = make_vocab("chunks")
    logits, labels = make_batch("chunks", shape=(4, 6), seed=8)
    count = int(torch.isin(labels, vocab.ids).sum())
    whole, whole_grad = loss_and_grad(lambda x: number_token_loss(x, labels, vocab), logits)
    halves = sum(
        number_token_loss(logits[part], labels[part], vocab, num_items_in_batch=count)
        for part in (slice(0, 2), slice(2, 4))
    )
    (halves_grad,) = torch.autograd.grad(halves, logits)
    torch.testing.assert_close(halves.detach(), whole)
    torch.testing.assert_close(halves_grad, whole_grad)
    tensor_count = number_token_loss(logits, labels, vocab, num_items_in_batch=torch.tensor(count))
    torch.testing.assert_close(tensor_count.detach(), whole)


def test_batch_without_number_positions_is_zero_and_backpropagates() -> None:
    vocab = make_vocab("digits")
    logits = torch.randn(2, 4, 17, dtype=torch.float64, requires_grad=True)
    for labels in [torch.full((2, 4), -100), torch.tensor([[0, 1, 2, 13]] * 2)]:
        for reduction in ["mean", "sum"]:
            for reweigh in [False, True]:
                loss = number_token_loss(
                    logits, labels, vocab, reduction=reduction, reweigh=reweigh
                )
                assert loss.item() == 0.0 and loss.requires_grad
                (grad,) = torch.autograd.grad(loss, logits)
                assert torch.all(grad == 0)


def test_shift_compares_logits_with_the_next_label() -> None:
    vocab = make_vocab("digits")
    logits, labels = make_batch("digits", shape=(2, 6), seed=9)
    shifted = number_token_loss(logits, labels, vocab, shift=True, reduction="none")
    manual = number_token_loss(logits[:, :-1], labels[:, 1:], vocab, reduction="none")
    torch.testing.assert_close(shifted[:, :-1], manual)
    assert torch.all(shifted[:, -1] == 0)
    torch.testing.assert_close(
        number_token_loss(logits, labels, vocab, shift=True),
        number_token_loss(logits[:, :-1], labels[:, 1:], vocab),
    )


def test_squash_is_scale_free() -> None:
    """Squashed distances depend on ratios only: scaling every value by 10 changes nothing."""
    base = {i: float(v) for i, v in enumerate([0, 1, 2, 5, 9])}
    scaled = {i: 10 * v for i, v in base.items()}
    logits = torch.randn(6, 8, dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 3, 4, 7])
    results = [
        number_token_loss(
            logits, labels, NumberVocab.from_values(v, vocab_size=8), squash_factor=3.0
        )
        for v in (base, scaled)
    ]
    torch.testing.assert_close(results[0], results[1])
    unsquashed = [
        number_token_loss(logits, labels, NumberVocab.from_values(v, vocab_size=8))
        for v in (base, scaled)
    ]
    torch.testing.assert_close(unsquashed[1], 10 * unsquashed[0])


def test_squash_factor_sets_the_cost_ratio() -> None:
    vocab = make_vocab("digits")

    def cost(predicted: int) -> float:
        logits = torch.full((1, 17), -60.0, dtype=torch.float64)
        logits[0, 3 + predicted] = 60.0
        return float(number_token_loss(logits, torch.tensor([3]), vocab, squash_factor=4.0))

    assert (
        cost(0) == pytest.approx(0, abs=1e-12)
        and cost(1) == pytest.approx(1.0)
        and cost(9) == pytest.approx(4.0)
    )


def test_multi_digit_tokens_are_meaningful_not_zero(llama3_style_tokenizer: Any) -> None:
    """ntloss gives 0 for label "123" predicted as "999"; here it costs 8.76 on the 3-digit scale
    (|9.99 - 1.23|), nearly the maximum, while "124" costs 0.01."""
    tokenizer = llama3_style_tokenizer
    vocab = NumberVocab.from_tokenizer(tokenizer)
    label = torch.tensor(tokenizer.convert_tokens_to_ids(["123"]))

    def cost(token: str, **settings: Any) -> float:
        logits = torch.full((1, len(tokenizer)), -80.0, dtype=torch.float64)
        logits[0, tokenizer.convert_tokens_to_ids(token)] = 80.0
        return float(number_token_loss(logits, label, vocab, **settings))

    assert cost("123") == pytest.approx(0, abs=1e-12)
    assert cost("124") == pytest.approx(0.01)
    assert cost("999") == pytest.approx(8.76)
    assert cost("9") == pytest.approx(9.99)  # another length: the maximum distance
    assert cost("999", kind="mse") == pytest.approx(8.76**2)
    assert cost("12", kind="mse") == pytest.approx(9.99**2)


def test_single_digit_vocab_reduces_to_the_plain_definition() -> None:
    """With digits only, WAS is Σ p_j |j - y| and MSE is (Σ p_j j - y)² with p over digits."""
    vocab = make_vocab("digits")
    logits, labels = make_batch("digits", shape=(20,), seed=10)
    keep = torch.isin(labels, vocab.ids)
    probs = torch.softmax(logits[keep][:, 3:13], dim=-1)
    y = (labels[keep] - 3).double()
    digits = torch.arange(10, dtype=torch.float64)
    was = (probs * (digits[None] - y[:, None]).abs()).sum(-1).mean()
    mse = ((probs @ digits - y) ** 2).mean()
    torch.testing.assert_close(number_token_loss(logits, labels, vocab), was)
    torch.testing.assert_close(number_token_loss(logits, labels, vocab, kind="mse"), mse)


def test_reweigh_penalises_mass_on_text() -> None:
    """With reweigh, a position whose mass sits on a text token costs more than any number."""
    vocab = make_vocab("digits")
    on_text = torch.full((1, 17), -40.0, dtype=torch.float64)
    on_text[0, 0] = 40.0
    worst_number = torch.full((1, 17), -40.0, dtype=torch.float64)
    worst_number[0, 12] = 40.0  # predicts 9 for label 0
    label = torch.tensor([3])
    text_cost = number_token_loss(on_text, label, vocab, reweigh=True)
    number_cost = number_token_loss(worst_number, label, vocab, reweigh=True)
    assert float(number_cost) == pytest.approx(9.0)
    assert float(text_cost) == pytest.approx(1.01 * 9.0)


# ------------------------------------------------------------------ dtypes and -inf


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("reweigh", [False, True])
@pytest.mark.parametrize("kind", ["was", "mse"])
def test_low_precision_logits_match_float64(dtype: torch.dtype, reweigh: bool, kind: str) -> None:
    """Logits are rounded to ``dtype``; the loss is computed in float32 from them, so it matches
    float64 on the same rounded logits to float32 accuracy, and gradients come back in
    ``dtype`` (tolerance: that dtype's rounding of values of order 1)."""
    vocab = make_vocab("chunks")
    logits, labels = make_batch("chunks", shape=(4, 9), seed=11)
    low = logits.detach().to(dtype).requires_grad_()
    exact = low.detach().double().requires_grad_()
    ours, ours_grad = loss_and_grad(
        lambda x: number_token_loss(x, labels, vocab, kind=kind, reweigh=reweigh), low
    )
    ref, ref_grad = loss_and_grad(
        lambda x: number_token_loss(x, labels, vocab, kind=kind, reweigh=reweigh), exact
    )
    assert ours.dtype == torch.float32 and ours_grad.dtype == dtype
    torch.testing.assert_close(ours.double(), ref, rtol=2e-6, atol=2e-6)
    grad_tolerance = {torch.float32: 1e-6, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]
    torch.testing.assert_close(
        ours_grad.double(), ref_grad, rtol=grad_tolerance, atol=grad_tolerance
    )


@pytest.mark.parametrize("kind", ["was", "mse"])
@pytest.mark.parametrize("reweigh", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_masked_vocabulary_entries_never_give_nan(
    kind: str, reweigh: bool, dtype: torch.dtype
) -> None:
    vocab = make_vocab("chunks")
    logits, labels = make_batch("chunks", shape=(3, 5), seed=12, dtype=dtype)
    masked = logits.detach().clone()
    masked[..., ::3] = -torch.inf  # some number and text tokens masked everywhere
    masked[0, 0, :] = -torch.inf  # one row masked entirely
    masked[1, 0, vocab.ids] = -torch.inf  # one row with every number token masked
    masked.requires_grad_()
    labels = labels.clone()
    labels[0, 0] = 5
    labels[1, 0] = 7
    for reduction in ["mean", "none"]:
        loss = number_token_loss(
            masked, labels, vocab, kind=kind, reweigh=reweigh, reduction=reduction
        )
        (grad,) = torch.autograd.grad(loss.sum(), masked)
        assert torch.isfinite(loss).all() and torch.isfinite(grad).all()


# ------------------------------------------------------------------ the module


def test_module_equals_function_and_moves_with_to() -> None:
    vocab = make_vocab("chunks")
    module = NumberTokenLoss(vocab, kind="mse", reweigh=True, reduction="sum", shift=True)
    logits, labels = make_batch("chunks", shape=(2, 5), seed=13)
    expected = number_token_loss(
        logits, labels, vocab, kind="mse", reweigh=True, reduction="sum", shift=True
    )
    torch.testing.assert_close(module(logits, labels), expected)
    weights = torch.rand(2, 5, dtype=torch.float64)
    torch.testing.assert_close(
        module(logits, labels, loss_weights=weights, num_items_in_batch=3),
        number_token_loss(
            logits,
            labels,
            vocab,
            kind="mse",
            reweigh=True,
            reduction="sum",
            shift=True,
            loss_weights=weights,
        ),
    )
    assert {name for name, _ in module.named_buffers()} == {
        "ids",
        "scaled_values",
        "groups",
        "position_of_id",
    }
    moved = module.to(torch.bfloat16)  # as when the loss is a submodule of a bf16 model
    assert moved.scaled_values.dtype == torch.float64, "values must not be rounded to bf16"
    torch.testing.assert_close(moved(logits, labels), expected)
    assert "kind='mse'" in repr(module) and "number_tokens=" in repr(module)


def test_module_state_dict_round_trip() -> None:
    vocab = make_vocab("digits")
    source = NumberTokenLoss(vocab)
    target = NumberTokenLoss(vocab)
    target.load_state_dict(source.state_dict())
    assert set(source.state_dict()) == {"ids", "scaled_values", "groups", "position_of_id"}
    logits, labels = make_batch("digits")
    torch.testing.assert_close(source(logits, labels), target(logits, labels))


# inductor compiles C++ for the CPU (about 40 s on 2 cores): slow, in `make test-slow`.
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_module_under_torch_compile(backend: str) -> None:
    torch._dynamo.reset()
    vocab = make_vocab("chunks")
    module = NumberTokenLoss(vocab, kind="was", reweigh=True)
    compiled = torch.compile(module, backend=backend)
    logits, labels = make_batch("chunks", shape=(2, 6), seed=14, dtype=torch.float32)
    eager, eager_grad = loss_and_grad(lambda x: module(x, labels), logits)
    fast, fast_grad = loss_and_grad(lambda x: compiled(x, labels), logits)
    torch.testing.assert_close(fast, eager)
    torch.testing.assert_close(fast_grad, eager_grad)
    # Inside a compiled graph the label check is a device assert instead of a host read-back.
    bad = labels.clone()
    bad[0, 0] = 59
    with pytest.raises(RuntimeError, match=r"labels must be token ids in \[0, 59\)"):
        compiled(logits, bad)
