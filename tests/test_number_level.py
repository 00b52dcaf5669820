"""numtok.losses.number_level: the number-level loss against a plain float64 reference, ntloss
0.3.2's NumberLevelLoss, true targets on a chunk tokenizer, gradients and properties."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from numtok import NumberVocab
from numtok.losses.number_level import NumberLevelLoss, number_level_loss
from numtok.numbers.spans import find_number_spans

from test_spans import reference_spans, token_kinds

torch.set_num_threads(1)


def reference_number_level_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    vocab: NumberVocab,
    *,
    error: str = "smape",
    reweigh: bool = False,
    loss_weights: torch.Tensor | None = None,
    reduction: str = "mean",
    num_items_in_batch: int | None = None,
    shift: bool = False,
) -> torch.Tensor:
    """The definition, with Python loops over rows and spans, in float64."""
    logits = logits.double()
    if shift:
        labels = torch.cat([labels[..., 1:], torch.full_like(labels[..., :1], -100)], dim=-1)
        if loss_weights is not None:
            loss_weights = torch.cat(
                [loss_weights[..., 1:], torch.zeros_like(loss_weights[..., :1])], dim=-1
            )
    width, size = labels.shape[-1], logits.shape[-1]
    rows = labels.reshape(-1, width).tolist()
    flat_logits = logits.reshape(-1, size)
    weights = None if loss_weights is None else loss_weights.reshape(-1).double()
    number_ids = vocab.ids.tolist()
    values = vocab.values.double()
    per_position = torch.zeros(len(rows) * width, dtype=torch.float64)
    kinds = token_kinds(vocab)
    total, weight_sum = torch.zeros((), dtype=torch.float64), 0.0
    for r, row in enumerate(rows):
        for span in reference_spans(row, kinds):
            predicted = torch.zeros((), dtype=torch.float64)
            for position, place in span.numbers:
                z = flat_logits[r * width + position]
                p = torch.softmax(z[number_ids], dim=0)
                predicted = predicted + (p * values).sum() * 10.0**place
            predicted = -predicted if span.negative else predicted
            target = float(span.text)
            if error == "smape":
                # smape's own definition: no constant in the denominator; 0 when both are 0.
                denominator = predicted.abs() + abs(target)
                loss = (predicted - target).abs() / denominator if denominator > 0 else 0 * z[0]
            else:
                slog = lambda x: torch.sign(x) * torch.log1p(x.abs())  # noqa: E731
                loss = (slog(predicted) - slog(torch.tensor(target, dtype=torch.float64))).abs()
            first = r * width + span.numbers[0][0]
            if reweigh:
                mass = torch.softmax(flat_logits[first], dim=0)[number_ids].sum()
                loss = loss * mass + 1.01 * (1 - mass)
            w = 1.0 if weights is None else float(weights[first])
            per_position[first] = loss * w
            total = total + loss * w
            weight_sum += w
    if reduction == "none":
        return per_position.reshape(labels.shape)
    if reduction == "sum":
        return total
    denominator = num_items_in_batch if num_items_in_batch is not None else max(weight_sum, 1e-300)
    return total / denominator


def _batch(tokenizer: Any, texts: list[str]) -> torch.Tensor:
    rows = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(map(len, rows))
    return torch.tensor([r + [-100] * (width - len(r)) for r in rows])


TEXTS = [
    "x = -12.34 and 1234567 or 3-4",
    "then 1.2.3.4 and -0.05, 007 ok",
    "no numbers at all",
    "9876.5 - 12 = 9864.5",
]


@pytest.fixture(scope="module", params=["digit_tokenizer", "llama3_style_tokenizer"])
def tokenizer_and_vocab(request: pytest.FixtureRequest) -> tuple[Any, NumberVocab]:
    tokenizer = request.getfixturevalue(request.param)
    return tokenizer, NumberVocab.from_tokenizer(tokenizer)


@pytest.mark.parametrize("error", ["smape", "log"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_matches_the_reference(
    tokenizer_and_vocab: tuple[Any, NumberVocab], error: str, reduction: str
) -> None:
    tokenizer, vocab = tokenizer_and_vocab
    labels = _batch(tokenizer, TEXTS)
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(*labels.shape, vocab.vocab_size, generator=generator, dtype=torch.float64)
    logits = 3 * logits
    weights = torch.rand(labels.shape, generator=generator, dtype=torch.float64)
    for options in (
        {},
        {"loss_weights": weights},
        {"shift": True},
        {"num_items_in_batch": 7},
        {"reweigh": True} if error == "smape" else {"loss_weights": weights, "shift": True},
    ):
        got = number_level_loss(logits, labels, vocab, error=error, reduction=reduction, **options)
        expected = reference_number_level_loss(
            logits, labels, vocab, error=error, reduction=reduction, **options
        )
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12, msg=str(options))


def test_module_equals_function_and_holds_buffers(
    tokenizer_and_vocab: tuple[Any, NumberVocab],
) -> None:
    tokenizer, vocab = tokenizer_and_vocab
    labels = _batch(tokenizer, TEXTS)
    logits = torch.randn(*labels.shape, vocab.vocab_size)
    module = NumberLevelLoss(vocab, error="log", reduction="sum", shift=True)
    expected = number_level_loss(logits, labels, vocab, error="log", reduction="sum", shift=True)
    assert torch.equal(module(logits, labels), expected)
    assert set(module.state_dict()) == {
        "ids",
        "values",
        "digit_counts",
        "position_of_id",
        "token_class",
    }
    assert "error='log'" in repr(module)
    # Moving the module to a low-precision dtype cannot round its integer value table.
    assert module.to(torch.bfloat16).values.dtype == torch.long


# ------------------------------------------------------------------ ntloss 0.3.2


@pytest.mark.parametrize("reweigh", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_equals_ntloss_number_level_loss_on_single_digit_integers(
    digit_tokenizer: Any, reweigh: bool, reduction: str
) -> None:
    from ntloss import NumberLevelLoss as NtlossNumberLevelLoss

    from conftest import build_digit_tokenizer

    # ntloss may add tokens to the tokenizer it is given: give it its own copy.
    reference = NtlossNumberLevelLoss(tokenizer=build_digit_tokenizer(), reweigh=reweigh)
    vocab = NumberVocab.from_tokenizer(digit_tokenizer)
    # Integer spans only: ntloss reads neither signs nor decimal points.
    labels = _batch(digit_tokenizer, ["ab 123 c 45 d", "x 9 yy 1007 z 0", "3 4 56789 x"])
    generator = torch.Generator().manual_seed(1)
    logits = 4 * torch.randn(*labels.shape, vocab.vocab_size, generator=generator)
    weights = torch.rand(labels.shape, generator=generator)
    for loss_weights in (None, weights):
        expected = reference(logits, labels, loss_weights=loss_weights, reduction=reduction)
        got = number_level_loss(
            logits, labels, vocab, reweigh=reweigh, loss_weights=loss_weights, reduction=reduction
        )
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ chunk tokenizers


def _peaked_logits(labels: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Logits whose softmax is exactly one-hot on the label (-inf elsewhere)."""
    logits = torch.full((*labels.shape, vocab_size), -math.inf, dtype=torch.float64)
    logits.scatter_(-1, labels.clamp_min(0)[..., None], 0.0)
    return logits


def test_chunk_tokenizer_targets_are_the_true_numbers(llama3_style_tokenizer: Any) -> None:
    tokenizer = llama3_style_tokenizer
    vocab = NumberVocab.from_tokenizer(tokenizer)
    labels = _batch(tokenizer, ["x=1234;", "y=-1234567.25"])
    assert tokenizer.convert_ids_to_tokens(labels[0, 2:4].tolist()) == ["123", "4"]
    assert find_number_spans(labels, vocab).values.tolist() == [1234.0, -1234567.25]

    # Predicting "124|4" where "123|4" is due: the prediction is the number 1244.
    predicted = labels.clone()
    predicted[0, 2] = tokenizer.convert_tokens_to_ids("124")
    logits = _peaked_logits(predicted, vocab.vocab_size)
    loss = number_level_loss(logits, labels, vocab, reduction="none")
    assert float(loss[0, 2]) == pytest.approx(10 / (1244 + 1234), rel=1e-12)
    assert float(loss[1].sum()) == 0.0
    # The token-level view would see "124" vs "123" (and "4" vs "4"): a small miss; the number
    # is off by 10, and a wrong leading chunk is not free.
    predicted[0, 2] = tokenizer.convert_tokens_to_ids("999")
    far = number_level_loss(
        _peaked_logits(predicted, vocab.vocab_size), labels, vocab, reduction="none"
    )
    assert float(far[0, 2]) == pytest.approx((9994 - 1234) / (9994 + 1234), rel=1e-12)


# ------------------------------------------------------------------ scale

#: Digits 0-9 (ids 0-9), a decimal point (10) and a word (11).
_DECIMALS = NumberVocab.from_values({i: str(i) for i in range(10)}, vocab_size=12,
                                    decimal_point_ids=[10])  # fmt: skip


def _power_of_ten(exponent: int, leading: int) -> list[int]:
    """The tokens of ``leading · 10**exponent``: ``1000``, or ``0.001`` for a negative one."""
    if exponent >= 0:
        return [leading] + [0] * exponent
    return [0, 10] + [0] * (-exponent - 1) + [leading]


def _ones_against_nines(exponents: list[int], dtype: torch.dtype) -> tuple[Any, Any]:
    """(labels, logits): a row per exponent, the label ``1·10**e`` and logits that predict
    ``9·10**e`` with certainty (the word 11 after the number, -100 after it)."""
    width = max(len(_power_of_ten(e, 1)) for e in exponents) + 1
    labels, predicted = [], []
    for e in exponents:
        row, guess = [*_power_of_ten(e, 1), 11], [*_power_of_ten(e, 9), 11]
        labels.append(row + [-100] * (width - len(row)))
        predicted.append(guess + [11] * (width - len(guess)))
    logits = _peaked_logits(torch.tensor(predicted), _DECIMALS.vocab_size).to(dtype)
    return torch.tensor(labels), logits


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_smape_is_scale_free_from_1e_minus_12_to_1e12(dtype: torch.dtype) -> None:
    """1 against 9 costs |9 - 1| / (9 + 1) = 0.8 at every power of ten, decimals as integers,
    against the float64 reference (whose smape has no constant of its own). ntloss's 1.19e-7 in
    the denominator gave 0.365 for 0.00000001 against 0.00000009 and 0.007 at 1e-10."""
    exponents = list(range(-12, 13))
    labels, logits = _ones_against_nines(exponents, dtype)
    got = number_level_loss(logits, labels, _DECIMALS, reduction="none")
    expected = reference_number_level_loss(logits.double(), labels, _DECIMALS, reduction="none")
    rounding = 1e-12 if dtype == torch.float64 else 2.0**-24  # the result's one rounding
    torch.testing.assert_close(got.double(), expected, rtol=rounding, atol=0.0)
    per_number = got.double()[:, 0]  # each span's loss sits at its first token
    torch.testing.assert_close(per_number, torch.full_like(per_number, 0.8), rtol=rounding, atol=0)


def test_smape_is_scale_free_at_every_power_of_ten_float64_holds() -> None:
    """0.8 from 10**-307 to 10**307, as float64 computes |9e - 1e| / (9e + 1e) for each: every
    power of ten whose number has at most the 308 digits the loss assembles in float64
    (0.00…01 at 10**-307 has 308 with its leading 0; 10**±308 have 309 and are refused)."""
    exponents = list(range(-307, 308))
    labels, logits = _ones_against_nines(exponents, torch.float64)
    got = number_level_loss(logits, labels, _DECIMALS, reduction="none")[:, 0]
    expected = [(float(f"9e{e}") - float(f"1e{e}")) / (float(f"9e{e}") + float(f"1e{e}"))
                for e in exponents]  # fmt: skip
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-12,
                               atol=0.0)  # fmt: skip


# ------------------------------------------------------------------ properties


@given(
    st.integers(min_value=-(10**12), max_value=10**12).filter(lambda n: abs(n) >= 10),
    st.booleans(),
    st.sampled_from(["smape", "log"]),
)
@settings(max_examples=30, deadline=None)
def test_zero_when_right_and_leading_errors_cost_more(
    digit_tokenizer: Any, llama3_style_tokenizer: Any, n: int, chunks: bool, error: str
) -> None:
    tokenizer = llama3_style_tokenizer if chunks else digit_tokenizer
    vocab = NumberVocab.from_tokenizer(tokenizer)
    labels = _batch(tokenizer, [f"is {n}."])
    spans = find_number_spans(labels, vocab)
    assert spans.values.tolist() == [float(n)]
    logits = _peaked_logits(labels, vocab.vocab_size)
    assert float(number_level_loss(logits, labels, vocab, error=error)) == 0.0

    # Change the first and the last number token of the span by one unit of its own value.
    positions = spans.number_positions.tolist()
    losses = []
    for position in (positions[0], positions[-1]):
        changed = labels.clone().reshape(-1)
        digits = tokenizer.convert_ids_to_tokens(int(changed[position]))
        replacement = str(int(digits) + 1 if digits[0] != "9" else int(digits) - 1)
        changed[position] = tokenizer.convert_tokens_to_ids(replacement.zfill(len(digits)))
        logits = _peaked_logits(changed.reshape(labels.shape), vocab.vocab_size)
        losses.append(float(number_level_loss(logits, labels, vocab, error=error)))
    if len(positions) > 1:
        assert losses[0] > losses[1] > 0
    else:
        assert losses[0] == losses[1] > 0


def test_monotone_in_the_distance_of_the_expected_number(digit_tokenizer: Any) -> None:
    vocab = NumberVocab.from_tokenizer(digit_tokenizer)
    labels = _batch(digit_tokenizer, ["50"])
    previous = -1.0
    for digit in "56789":  # predicting 50, 60, ..., 90
        predicted = labels.clone()
        predicted[0, 0] = digit_tokenizer.convert_tokens_to_ids(digit)
        loss = float(number_level_loss(_peaked_logits(predicted, vocab.vocab_size), labels, vocab))
        assert loss > previous
        previous = loss


# ------------------------------------------------------------------ gradients and dtypes


def _tiny_vocab() -> NumberVocab:
    numbers = {i: str(i) for i in range(4)} | {4: "12"}
    return NumberVocab.from_values(numbers, vocab_size=8, minus_ids=[5], decimal_point_ids=[6])


@pytest.mark.parametrize(
    "options",
    [
        {"error": "smape"},
        {"error": "log"},
        {"error": "smape", "reweigh": True, "reduction": "none"},
        {"error": "log", "shift": True, "reduction": "sum"},
    ],
)
def test_gradcheck(options: dict[str, Any]) -> None:
    vocab = _tiny_vocab()
    labels = torch.tensor([[5, 1, 4, 6, 3, 7], [2, 7, 0, 0, 1, -100]])  # -112.3, 2, 1 (001)
    logits = torch.randn(*labels.shape, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda z: number_level_loss(z, labels, vocab, **options), (logits,)
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_low_precision_logits(
    tokenizer_and_vocab: tuple[Any, NumberVocab], dtype: torch.dtype
) -> None:
    tokenizer, vocab = tokenizer_and_vocab
    labels = _batch(tokenizer, TEXTS)
    logits = torch.randn(*labels.shape, vocab.vocab_size, dtype=torch.float64)
    low = logits.to(dtype).requires_grad_()
    got = number_level_loss(low, labels, vocab, shift=True)
    expected = reference_number_level_loss(low.detach().double(), labels, vocab, shift=True)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-6)
    got.backward()
    assert low.grad is not None and low.grad.dtype == dtype and bool(low.grad.isfinite().all())


def test_masked_logits_give_no_nan(digit_tokenizer: Any) -> None:
    vocab = NumberVocab.from_tokenizer(digit_tokenizer)
    labels = _batch(digit_tokenizer, ["x 42 y"])
    logits = torch.randn(*labels.shape, vocab.vocab_size)
    logits[..., vocab.ids[:5]] = -math.inf
    logits.requires_grad_()
    loss = number_level_loss(logits, labels, vocab, reweigh=True)
    loss.backward()
    assert bool(loss.isfinite()) and logits.grad is not None
    assert not bool(logits.grad.isnan().any())


def test_no_numbers_gives_zero_with_a_graph(digit_tokenizer: Any) -> None:
    vocab = NumberVocab.from_tokenizer(digit_tokenizer)
    labels = _batch(digit_tokenizer, ["no numbers"])
    logits = torch.randn(*labels.shape, vocab.vocab_size, requires_grad=True)
    for reduction in ("mean", "sum", "none"):
        loss = number_level_loss(logits, labels, vocab, reduction=reduction)
        assert float(loss.detach().abs().sum()) == 0.0 and loss.requires_grad
        loss.sum().backward()
    assert logits.grad is not None and float(logits.grad.abs().sum()) == 0.0


# ------------------------------------------------------------------ bad input


def test_bad_input(digit_tokenizer: Any) -> None:
    vocab = NumberVocab.from_tokenizer(digit_tokenizer)
    labels = _batch(digit_tokenizer, ["12"])
    logits = torch.randn(*labels.shape, vocab.vocab_size)
    with pytest.raises(TypeError, match=r"vocab must be a NumberVocab \(.*\), got dict"):
        number_level_loss(logits, labels, {})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"digit strings; token id 3 has the value '2\.5'"):
        NumberLevelLoss(NumberVocab.from_values({3: 2.5}, vocab_size=5))
    with pytest.raises(ValueError, match=r"error must be one of \('smape', 'log'\), got 'mse'"):
        number_level_loss(logits, labels, vocab, error="mse")
    with pytest.raises(ValueError, match="reweigh=True needs a bounded error"):
        NumberLevelLoss(vocab, error="log", reweigh=True)
    with pytest.raises(ValueError, match="reduction must be one of"):
        number_level_loss(logits, labels, vocab, reduction="avg")
    with pytest.raises(ValueError, match="logits have 3 columns but"):
        number_level_loss(logits[..., :3], labels, vocab)
    with pytest.raises(ValueError, match="sequence dimension"):
        number_level_loss(logits[0, 0], labels[0, 0], vocab)
    with pytest.raises(ValueError, match="loss_weights must have the labels' shape"):
        number_level_loss(logits, labels, vocab, loss_weights=torch.ones(3))
    one = digit_tokenizer.convert_tokens_to_ids("1")
    zero = digit_tokenizer.convert_tokens_to_ids("0")
    long_labels = torch.tensor([[one] + [zero] * 400])
    with pytest.raises(ValueError, match=r"a number of 401 digits; .* at most 308 digits"):
        number_level_loss(torch.zeros(1, 401, vocab.vocab_size), long_labels, vocab)
