"""Character tokenizer, the RoPE transformer, and greedy decoding with its key/value cache."""

from __future__ import annotations

import pytest
import torch

from numtok_compare.scratch.model import KeyValueCache, ModelConfig, Transformer, rotate
from numtok_compare.scratch.readouts import greedy_answers
from numtok_compare.scratch.tokenizer import CharTokenizer


@pytest.fixture(scope="module")
def tokenizer() -> CharTokenizer:
    return CharTokenizer()


def _model(tokenizer: CharTokenizer, *, sharpen: float = 1.0) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(ModelConfig(len(tokenizer), d_model=32, n_layers=2, n_heads=2))
    with torch.no_grad():  # larger weights than the init, so greedy outputs vary with the input
        for parameter in model.parameters():
            parameter.mul_(sharpen)
    return model.eval()


def test_digits_are_the_only_number_tokens(tokenizer: CharTokenizer) -> None:
    vocab = tokenizer.number_vocab()
    assert [tokenizer.tokens[i] for i in vocab.ids.tolist()] == list("0123456789")
    assert vocab.values.tolist() == list(range(10))


def test_example_layout_puts_labels_on_the_answer_only(tokenizer: CharTokenizer) -> None:
    inputs, labels = tokenizer.encode_example("What is 2+3?", "-5")
    assert tokenizer.decode(inputs) == "What is 2+3?-5"
    assert inputs[len("What is 2+3?")] == tokenizer.separator_id
    answer = [*tokenizer.encode("-5"), tokenizer.end_id]
    assert labels == [-100] * len("What is 2+3?") + answer
    # labels[t] is the token after inputs[t]
    sequence = [*inputs, tokenizer.end_id]
    assert all(label in (-100, sequence[t + 1]) for t, label in enumerate(labels))


def test_unknown_character_is_a_clear_error(tokenizer: CharTokenizer) -> None:
    with pytest.raises(ValueError, match="'é'"):
        tokenizer.encode("café")


def test_model_config_rejects_odd_head_width() -> None:
    with pytest.raises(ValueError, match="d_model must be a multiple of 2 \\* n_heads"):
        ModelConfig(vocab_size=10, d_model=30, n_heads=4)


def test_rope_scores_depend_on_relative_position_only() -> None:
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(i: int, j: int) -> float:
        qi = rotate(q, torch.tensor([[i]]), 10_000.0)
        kj = rotate(k, torch.tensor([[j]]), 10_000.0)
        return float((qi * kj).sum())

    assert score(3, 1) == pytest.approx(score(12, 10), rel=1e-5)
    assert score(3, 1) != pytest.approx(score(3, 2), rel=1e-3)


def test_padding_and_cache_give_the_same_logits(tokenizer: CharTokenizer) -> None:
    model = _model(tokenizer)
    tokens = torch.tensor([tokenizer.encode("What is 12 + 7?")])  # (1, T)
    full = model(tokens)  # (1, T, V)

    # Left-padded by 3, padding masked, positions counting real tokens only.
    pad = 3
    padded = torch.cat((torch.zeros(1, pad, dtype=torch.long), tokens), dim=1)
    real = torch.arange(padded.shape[1]) >= pad
    positions = (real.long().cumsum(0) - 1).clamp_min(0)[None]
    size = padded.shape[1]
    allowed = (torch.ones(size, size, dtype=torch.bool).tril() & real) | torch.eye(
        size, dtype=torch.bool
    )
    padded_logits = model(padded, positions=positions, allowed=allowed[None, None])
    torch.testing.assert_close(padded_logits[:, pad:], full, atol=1e-5, rtol=1e-5)

    # Prefix through the cache, then one token at a time.
    cache = KeyValueCache(model.config.n_layers)
    split = 5
    pieces = [model(tokens[:, :split], cache=cache)]
    for t in range(split, tokens.shape[1]):
        pieces.append(model(tokens[:, t : t + 1], positions=torch.tensor([[t]]), cache=cache))
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-5)


def _naive_greedy(model: Transformer, tokenizer: CharTokenizer, question: str, limit: int) -> str:
    ids = [*tokenizer.encode(question), tokenizer.separator_id]
    answer: list[int] = []
    with torch.no_grad():
        for _ in range(limit):
            next_id = int(model(torch.tensor([ids]))[0, -1].argmax())
            if next_id == tokenizer.end_id:
                break
            answer.append(next_id)
            ids.append(next_id)
    return tokenizer.decode(answer)


def test_batched_cached_greedy_decoding_equals_one_by_one_decoding(
    tokenizer: CharTokenizer,
) -> None:
    model = _model(tokenizer, sharpen=8.0)
    questions = ["1+1", "What is 12 + 7?", "Subtract 150 from 364.", "9", "Sum 4315.5 and -0.1."]
    expected = [_naive_greedy(model, tokenizer, q, 12) for q in questions]
    assert len(set(expected)) > 1, "all answers equal: the comparison would prove little"
    answers = greedy_answers(
        model, tokenizer, questions, batch_size=3, device=torch.device("cpu"), max_new_tokens=12
    )
    assert answers == expected
