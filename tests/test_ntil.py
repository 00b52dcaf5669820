"""NTIL (numtok.ntil_loss, numtok.NTILLoss): values and gradients against the float64 loop
reference (reference_ntil.py) on single-digit, 1-3-digit chunk and SentencePiece-style
vocabularies, gradcheck, the loss's properties, F.cross_entropy's conventions and the argument
checks."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import reference_ntil
from numtok import NTILLoss, NumberVocab, ntil_loss

#: ids 3..12 the digits, 13 the decimal point, in a vocabulary of 17.
DIGITS: dict[int, str] = {3 + d: str(d) for d in range(10)}
#: 1-3-digit chunks, ids 10..19 the word-start digits (``Ġ7``), 55 the decimal point.
CHUNKS: dict[int, str] = {
    **{d: str(d) for d in range(10)},
    **{10 + d: str(d) for d in range(10)},
    **{20 + k: f"{i:02d}" for k, i in enumerate(range(0, 100, 7))},
    **{40 + k: f"{i:03d}" for k, i in enumerate(range(0, 1000, 97))},
}
VOCABS: dict[str, tuple[dict[int, str], int, int, set[int]]] = {
    "digits": (DIGITS, 17, 13, set()),
    "chunks": (CHUNKS, 59, 55, set(range(10, 20))),
}
SETTINGS: list[dict[str, Any]] = [
    {},
    {"shift": True},
    {"reduction": "none"},
    {"reduction": "sum", "loss_weights": "random"},
    {"loss_weights": "random", "shift": True},
    {"num_items_in_batch": 7},
    {"place_base": 1.0, "value_weight": 0.0},
    {"digit_weight": 0.5, "magnitude_weight": 1.0, "temperature": 1.0},
    {"ignore_index": 0},
]
SETTING_IDS = ["mean", "shift", "none", "sum-weights", "weights-shift", "num_items", "flat",
               "mixed", "ignore0"]  # fmt: skip


def make_vocab(name: str) -> NumberVocab:
    tokens, size, point, word_starts = VOCABS[name]
    return NumberVocab.from_values(
        dict(tokens), vocab_size=size, decimal_point_ids=[point], word_start_ids=word_starts
    )


def make_batch(
    name: str, seed: int = 0, shape: tuple[int, int] = (3, 9), ignore_index: int = -100
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits (B, T, V) and labels mixing number tokens (~55%), decimal points (~10%), other
    tokens (~25%) and ignore_index (~10%), and random weights."""
    tokens, size, point, _ = VOCABS[name]
    generator = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(*shape, size, generator=generator, dtype=torch.float64)
    number_ids = torch.tensor(sorted(tokens))
    labels = number_ids[torch.randint(len(number_ids), shape, generator=generator)]
    text = torch.randint(size, shape, generator=generator)
    choice = torch.rand(shape, generator=generator)
    labels = torch.where(choice < 0.25, text, labels)
    labels = torch.where((choice >= 0.25) & (choice < 0.35), torch.full_like(labels, point), labels)
    labels = torch.where(choice > 0.9, torch.full_like(labels, ignore_index), labels)
    weights = torch.rand(shape, generator=generator, dtype=torch.float64)
    return logits.requires_grad_(), labels, weights


def reference(
    vocab: NumberVocab, logits: torch.Tensor, labels: torch.Tensor, **settings: Any
) -> torch.Tensor:
    return reference_ntil.ntil(
        logits, labels, vocab.ids.tolist(), list(vocab.digits),
        word_start_ids=set(vocab.word_start_ids), **settings,
    )  # fmt: skip


def assert_same_value_and_gradient(
    logits: torch.Tensor, ours: torch.Tensor, theirs: torch.Tensor
) -> None:
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)
    (g_ours,) = torch.autograd.grad(ours.sum(), logits, allow_unused=True)
    (g_ref,) = torch.autograd.grad(theirs.sum(), logits, allow_unused=True)
    g_ours = torch.zeros_like(logits) if g_ours is None else g_ours
    g_ref = torch.zeros_like(logits) if g_ref is None else g_ref
    torch.testing.assert_close(g_ours, g_ref, rtol=1e-9, atol=1e-12)


# ---------------------------------------------------------------------------- against the reference


@pytest.mark.parametrize("settings", SETTINGS, ids=SETTING_IDS)
@pytest.mark.parametrize("name", list(VOCABS))
def test_equals_the_reference(name: str, settings: dict[str, Any]) -> None:
    vocab = make_vocab(name)
    ignore_index = settings.get("ignore_index", -100)
    logits, labels, weights = make_batch(name, seed=1, ignore_index=ignore_index)
    settings = {k: (weights if v == "random" else v) for k, v in settings.items()}
    ours = ntil_loss(logits, labels, vocab, gumbel_noise=0.0, **settings)
    theirs = reference(vocab, logits, labels, **settings)
    assert_same_value_and_gradient(logits, ours, theirs)


@pytest.mark.parametrize("name", list(VOCABS))
def test_the_gumbel_noise_is_one_draw_of_the_generator(name: str) -> None:
    vocab = make_vocab(name)
    logits, labels, _ = make_batch(name, seed=2)
    # Large noise, so that it changes picks; the same seed gives the same draw.
    ours = ntil_loss(logits, labels, vocab, gumbel_noise=3.0,
                     generator=torch.Generator().manual_seed(5))  # fmt: skip
    count = int(torch.isin(labels, vocab.ids).sum())
    draw = torch.empty((count, len(vocab.ids)), dtype=torch.float64)
    noise = -draw.exponential_(generator=torch.Generator().manual_seed(5)).log()
    theirs = reference(vocab, logits, labels, gumbel_noise=3.0, noise=noise)
    assert_same_value_and_gradient(logits, ours, theirs)
    again = ntil_loss(logits, labels, vocab, gumbel_noise=3.0,
                      generator=torch.Generator().manual_seed(5))  # fmt: skip
    assert float(again.detach()) == float(ours.detach())


# GPT-2's 50,257 tokens through the float64 reference take 7 s: make test-slow.
TOKENIZERS = ["digit_tokenizer", "llama3_style_tokenizer", "sentencepiece_style_tokenizer",
              pytest.param("gpt2_tokenizer", marks=pytest.mark.slow)]  # fmt: skip


@pytest.mark.parametrize("fixture", TOKENIZERS)
def test_equals_the_reference_on_real_tokenizers(fixture: str, request: Any) -> None:
    tokenizer = request.getfixturevalue(fixture)
    vocab = NumberVocab.from_tokenizer(tokenizer)
    texts = ["x 1234 y 56.07 z", "a 9 + 10 = 19 b", "1000000 007"]
    rows = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    width = max(len(r) for r in rows)
    labels = torch.tensor([r + [-100] * (width - len(r)) for r in rows])
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(*labels.shape, vocab.vocab_size, generator=generator, dtype=torch.float64)
    logits.requires_grad_()
    for settings in ({}, {"reduction": "none", "shift": True}):
        ours = ntil_loss(logits, labels, vocab, gumbel_noise=0.0, **settings)
        theirs = reference(vocab, logits, labels, **settings)
        assert_same_value_and_gradient(logits, ours, theirs)


def test_the_module_equals_the_function() -> None:
    vocab = make_vocab("chunks")
    logits, labels, weights = make_batch("chunks", seed=4)
    module = NTILLoss(vocab, place_base=1.5, gumbel_noise=0.0, reduction="sum", shift=True)
    expected = ntil_loss(logits, labels, vocab, place_base=1.5, gumbel_noise=0.0,
                         reduction="sum", shift=True, loss_weights=weights)  # fmt: skip
    torch.testing.assert_close(module(logits, labels, loss_weights=weights), expected)
    assert "place_base=1.5" in repr(module)
    assert set(module.state_dict()) >= {"ids", "costs", "position_of_id", "word_start"}


# ------------------------------------------------------------------------------------- gradcheck


@pytest.mark.parametrize("name", list(VOCABS))
def test_gradcheck_of_the_digit_term(name: str) -> None:
    # The value and magnitude terms pass a straight-through gradient by design (the forward
    # value is that of the argmax token): their gradient is checked against the reference above.
    vocab = make_vocab(name)
    logits, labels, _ = make_batch(name, seed=5, shape=(2, 5))
    torch.autograd.gradcheck(
        lambda x: ntil_loss(x, labels, vocab, value_weight=0.0, magnitude_weight=0.0),
        (logits.detach().requires_grad_(),),
    )


def test_gradcheck_of_the_per_position_digit_terms() -> None:
    vocab = make_vocab("chunks")
    logits, labels, _ = make_batch("chunks", seed=6, shape=(2, 4))
    torch.autograd.gradcheck(
        lambda x: ntil_loss(x, labels, vocab, value_weight=0.0, magnitude_weight=0.0,
                            reduction="none", shift=True),
        (logits.detach().requires_grad_(),),
    )  # fmt: skip


# ------------------------------------------------------------------------------------ properties


def _confident(labels: list[int], predicted: list[int], size: int) -> torch.Tensor:
    logits = torch.full((len(labels), size), -20.0, dtype=torch.float64)
    for t, token in enumerate(predicted):
        logits[t, token] = 20.0
    return logits


def _digit_ids(text: str) -> list[int]:
    return [3 + int(c) if c.isdigit() else 0 for c in text]


def test_zero_at_non_number_positions_and_for_a_right_prediction() -> None:
    vocab = make_vocab("digits")
    labels = _digit_ids("x12y3")
    logits = torch.randn(5, 17, dtype=torch.float64)
    per_position = ntil_loss(logits, torch.tensor(labels), vocab, reduction="none")
    assert per_position[0] == 0 and per_position[3] == 0
    assert (per_position[[1, 2, 4]] > 0).all()
    right = _confident(labels, labels, 17)
    assert float(ntil_loss(right, torch.tensor(labels), vocab)) < 1e-12


def test_minimal_at_the_right_digit_and_growing_with_the_distance() -> None:
    vocab = make_vocab("digits")
    labels = torch.tensor(_digit_ids("45"))
    losses = []
    for d in range(10):
        logits = _confident(labels.tolist(), [3 + 4, 3 + d], 17)
        losses.append(float(ntil_loss(logits, labels, vocab, gumbel_noise=0.0)))
    assert min(range(10), key=losses.__getitem__) == 5
    assert losses[5] < 1e-12
    assert losses[6] < losses[7] < losses[8] < losses[9]
    assert losses[4] < losses[3] < losses[2] < losses[1] < losses[0]


@pytest.mark.parametrize("terms", [{}, {"value_weight": 0.0, "magnitude_weight": 0.0},
                                   {"digit_weight": 0.0}])  # fmt: skip
def test_an_error_in_a_more_significant_digit_costs_more(terms: dict[str, float]) -> None:
    vocab = make_vocab("digits")
    labels = _digit_ids("1234")
    costs = []
    for place in range(4):  # the digit at index 3 - place is off by one
        predicted = list(labels)
        predicted[3 - place] += 1
        logits = _confident(labels, predicted, 17)
        costs.append(float(ntil_loss(logits, torch.tensor(labels), vocab, **terms)))
    assert costs[0] < costs[1] < costs[2] < costs[3]


def test_a_chunk_costs_what_its_digits_cost_on_a_digit_tokenizer() -> None:
    # "1234" written 1|2|3|4 or 123|4 (every 3-digit chunk a token), predicted "1244".
    chunks = {i: f"{i:03d}" for i in range(1000)} | {1000 + d: str(d) for d in range(10)}
    chunk_vocab = NumberVocab.from_values(chunks, vocab_size=1010)
    digit_vocab = make_vocab("digits")
    digit_labels = _digit_ids("1234")
    digit_loss = ntil_loss(_confident(digit_labels, _digit_ids("1244"), 17),
                           torch.tensor(digit_labels), digit_vocab)  # fmt: skip
    chunk_labels = [123, 1004]
    chunk_loss = ntil_loss(_confident(chunk_labels, [124, 1004], 1010),
                           torch.tensor(chunk_labels), chunk_vocab)  # fmt: skip
    # Digit term 1.2·|4 - 3| over 4 digits; value term |1244 - 1234| / 1245; magnitude term.
    torch.testing.assert_close(chunk_loss, digit_loss)
    expected = 1.2 / 4 + 0.2 * 10 / 1245 + 0.2 * abs(torch.log1p(torch.tensor(1244.0)) -
                                                     torch.log1p(torch.tensor(1234.0)))  # fmt: skip
    torch.testing.assert_close(digit_loss, expected.to(torch.float64), rtol=1e-6, atol=1e-9)


def test_a_candidate_of_another_length_costs_nine_per_digit() -> None:
    vocab = make_vocab("chunks")
    # Label "07" (id 21, two digits) against a confident "5" (id 5, one digit): 9 + 1.2·9.
    logits = _confident([21], [5], 59)
    loss = ntil_loss(logits, torch.tensor([21]), vocab, value_weight=0.0, magnitude_weight=0.0,
                     reduction="sum")  # fmt: skip
    torch.testing.assert_close(loss, torch.tensor(9 + 1.2 * 9, dtype=torch.float64))


def test_a_batch_without_numbers_gives_zero_with_a_graph() -> None:
    vocab = make_vocab("digits")
    logits = torch.randn(2, 3, 17, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([[0, 1, -100], [2, 13, 14]])
    for reduction in ("mean", "sum"):
        loss = ntil_loss(logits, labels, vocab, reduction=reduction)
        assert float(loss.detach()) == 0.0 and loss.requires_grad
        loss.backward()


# ----------------------------------------------------------------- F.cross_entropy's conventions


def test_reductions_agree() -> None:
    vocab = make_vocab("chunks")
    logits, labels, _ = make_batch("chunks", seed=7)
    none = ntil_loss(logits, labels, vocab, reduction="none", gumbel_noise=0.0)
    total = ntil_loss(logits, labels, vocab, reduction="sum", gumbel_noise=0.0)
    assert none.shape == labels.shape
    torch.testing.assert_close(none.sum(), total)
    by_count = ntil_loss(logits, labels, vocab, num_items_in_batch=torch.tensor(6),
                         gumbel_noise=0.0)  # fmt: skip
    torch.testing.assert_close(by_count, total / 6)


def test_ignore_index_ends_a_number_and_is_skipped() -> None:
    vocab = make_vocab("digits")
    labels = torch.tensor(_digit_ids("12x34"))
    logits = torch.randn(5, 17, dtype=torch.float64)
    with_text = ntil_loss(logits, labels, vocab, reduction="sum", gumbel_noise=0.0)
    labels[2] = -100
    assert float(ntil_loss(logits, labels, vocab, reduction="sum", gumbel_noise=0.0)) == float(
        with_text
    )
    labels[2] = 7
    joined = ntil_loss(logits, labels, vocab, reduction="sum", gumbel_noise=0.0)
    assert float(joined) != float(with_text)


def test_loss_weights_scale_free_under_mean() -> None:
    vocab = make_vocab("chunks")
    logits, labels, weights = make_batch("chunks", seed=8)
    one = ntil_loss(logits, labels, vocab, loss_weights=weights, gumbel_noise=0.0)
    three = ntil_loss(logits, labels, vocab, loss_weights=3 * weights, gumbel_noise=0.0)
    torch.testing.assert_close(one, three)
    ones = ntil_loss(logits, labels, vocab, loss_weights=torch.ones_like(weights), gumbel_noise=0.0)
    torch.testing.assert_close(ones, ntil_loss(logits, labels, vocab, gumbel_noise=0.0))


def test_low_precision_logits_give_float32() -> None:
    vocab = make_vocab("digits")
    logits, labels, _ = make_batch("digits", seed=9)
    loss = ntil_loss(logits.detach().bfloat16(), labels, vocab, gumbel_noise=0.0)
    assert loss.dtype == torch.float32
    expected = ntil_loss(logits.detach().bfloat16().double(), labels, vocab, gumbel_noise=0.0)
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("settings", "error", "match"),
    [
        ({"digit_weight": -1.0}, ValueError, r"digit_weight must be a finite number >= 0, got -1"),
        ({"value_weight": "0.2"}, TypeError, r"value_weight must be a number >= 0, got '0.2'"),
        ({"magnitude_weight": float("nan")}, ValueError, r"magnitude_weight .* got nan"),
        ({"place_base": 0}, ValueError, r"place_base must be a finite number > 0 .*got 0"),
        ({"temperature": 0.0}, ValueError, r"temperature must be a finite number > 0, got 0.0"),
        ({"gumbel_noise": -0.1}, ValueError, r"gumbel_noise must be .*>= 0, got -0.1"),
        ({"reduction": "avg"}, ValueError, r"reduction must be one of .*got 'avg'"),
        ({"shift": 1}, TypeError, r"shift must be a bool, got 1"),
        ({"ignore_index": 1.5}, TypeError, r"ignore_index must be an int, got 1.5"),
        ({"generator": 3}, TypeError, r"generator must be a torch.Generator or None, got 3"),
        ({"num_items_in_batch": 0}, ValueError, r"num_items_in_batch must be > 0, got 0"),
    ],
)
def test_bad_settings_name_themselves(settings: dict[str, Any], error: type, match: str) -> None:
    vocab = make_vocab("digits")
    logits, labels, _ = make_batch("digits")
    with pytest.raises(error, match=match):
        ntil_loss(logits, labels, vocab, **settings)
    module_settings = {k: v for k, v in settings.items()
                       if k not in ("generator", "num_items_in_batch")}  # fmt: skip
    if module_settings:
        with pytest.raises(error, match=match):
            NTILLoss(vocab, **module_settings)


def test_bad_tensors_name_themselves() -> None:
    vocab = make_vocab("digits")
    logits, labels, weights = make_batch("digits")
    with pytest.raises(ValueError, match="17"):
        ntil_loss(logits[..., :16], labels, vocab)
    with pytest.raises(ValueError, match=r"loss_weights must have the labels' shape \(3, 9\)"):
        ntil_loss(logits, labels, vocab, loss_weights=weights[:, :4])
    with pytest.raises(ValueError, match="sequence dimension"):
        ntil_loss(logits[0, 0], labels[0, 0], vocab)


def test_a_vocabulary_without_digit_strings_is_refused() -> None:
    vocab = NumberVocab.from_values({1: 0.5, 4: -2.0, 6: 3.25}, vocab_size=11)
    with pytest.raises(ValueError, match=r"ntil_loss needs number tokens that are digit strings"):
        ntil_loss(torch.zeros(2, 11), torch.tensor([1, 4]), vocab)


def test_a_number_longer_than_float64_holds_is_refused() -> None:
    vocab = make_vocab("digits")
    labels = torch.full((1, 309), 4)
    with pytest.raises(ValueError, match="309 digits"):
        ntil_loss(torch.zeros(1, 309, 17), labels, vocab)


# --------------------------------------------------------------------------------- experiment arm


def test_the_ntil_arm_trains_on_ce_plus_lambda_ntil() -> None:
    import torch.nn.functional as F

    # make test-versions installs numtok alone; make test has the harness beside it
    pytest.importorskip(
        "numtok_compare", reason="the experiment harness (compare/) is not installed"
    )
    from numtok_compare.finetune.config import FINETUNE_ARMS
    from numtok_compare.objectives import ARM_LABELS, NUMBER_LOSS_ARMS, Objective

    assert "ntil" in NUMBER_LOSS_ARMS and "ntil" in FINETUNE_ARMS
    assert ARM_LABELS["ntil"] == "CE+NTIL"
    vocab = make_vocab("digits")
    logits, labels, _ = make_batch("digits", seed=10)
    objective = Objective("ntil", vocab, ntl_weight=0.5)
    torch.manual_seed(0)
    loss, ce, ntil = objective(logits, labels)
    torch.manual_seed(0)
    expected = ntil_loss(logits, labels, vocab)
    assert ntil is not None
    torch.testing.assert_close(ntil, expected)
    torch.testing.assert_close(ce, F.cross_entropy(logits.flatten(0, 1), labels.flatten()))
    torch.testing.assert_close(loss, ce + 0.5 * expected)
