"""predict_numbers' key/value-cached scorer on tiny Llama, GPT-2 and Qwen2 models, against the
brute-force enumeration of ``test_readout`` with each sequence scored whole by the model: digit,
multi-digit and word-start tokens, 1-3 digits, prompts of different lengths, any batch size,
pruning; and the fall-back to whole-sequence scoring for models whose cache it cannot rebuild."""

from __future__ import annotations

import functools
import importlib.metadata
import warnings
from typing import Any

import pytest
import torch
from packaging.version import Version

pytest.importorskip("transformers")

from numtok import NumberVocab
from numtok.readout.decoding import greedy_tokens, predict_numbers
from numtok.readout.distribution import number_distribution
from numtok.readout.scorers import CachedScorer, WholeSequenceScorer, cache_argument

from test_readout import RecordingScorer, brute_force, mixed_vocab

# mixed_vocab(): ids 0-14 are number tokens (digits, "12", "007", "45", word starts "▁3" and
# "▁12"); 15 and 16 are text.
VOCAB_SIZE = 17
PROMPTS = [[15, 16, 15], [16], [15, 3, 16, 16, 15, 16, 15]]
FALLBACK = "scored from the prompt's first token instead"

# The cached scorer reads transformers' cache layers (4.56 and later). Before, every readout takes
# the exact whole-sequence path (test_before_cache_layers_the_readout_falls_back_exactly).
TRANSFORMERS = importlib.metadata.version("transformers")
CACHE_LAYERS = Version(TRANSFORMERS) >= Version("4.56")
pytestmark = pytest.mark.skipif(
    not CACHE_LAYERS,
    reason=f"transformers {TRANSFORMERS}: the cached readout needs 4.56's cache layers",
)


def tiny_config(kind: str) -> Any:
    import transformers

    shape = {
        "vocab_size": VOCAB_SIZE,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 64,
    }
    if kind == "llama":
        return transformers.LlamaForCausalLM, transformers.LlamaConfig(**shape)
    if kind == "llama-eager":
        # Eager attention adds the mask to the scores: the tree's mask must be additive.
        config = transformers.LlamaConfig(**shape)
        config._attn_implementation = "eager"
        return transformers.LlamaForCausalLM, config
    if kind == "qwen2":
        return transformers.Qwen2ForCausalLM, transformers.Qwen2Config(**shape)
    if kind == "mistral-sliding":
        return transformers.MistralForCausalLM, transformers.MistralConfig(
            sliding_window=4, **shape
        )
    config = transformers.GPT2Config(
        vocab_size=VOCAB_SIZE, n_positions=64, n_embd=16, n_layer=2, n_head=2
    )
    return transformers.GPT2LMHeadModel, config


def tiny_model(kind: str, seed: int = 5) -> Any:
    """Weights 4× the initialisation, so that next-token distributions are far from flat."""
    model_class, config = tiny_config(kind)
    torch.manual_seed(seed)
    model = model_class(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(4.0)
    return model


def model_logits(model: Any) -> Any:
    @torch.no_grad()
    def logits(sequence: tuple[int, ...]) -> torch.Tensor:
        output = model(input_ids=torch.tensor([sequence]))
        logits = output.logits if hasattr(output, "logits") else output[0]
        return logits[0, -1].double()

    return logits


def expected_table(model: Any, vocab: NumberVocab, prompt: list[int], digits: int) -> torch.Tensor:
    table = torch.zeros(10**digits, dtype=torch.float64)
    for value, probability in brute_force(
        tuple(prompt), vocab, model_logits(model), digits
    ).items():
        table[value] = probability
    return table


@pytest.mark.parametrize(
    ("kind", "digits"),
    # Three digits enumerate 1,111 prefixes by brute force (8 s): make test-slow.
    [
        ("llama", 1),
        ("llama", 2),
        ("llama-eager", 2),
        pytest.param("llama", 3, marks=pytest.mark.slow),
        ("gpt2", 2),
        ("qwen2", 2),
    ],
)
def test_cached_scorer_matches_brute_force(kind: str, digits: int) -> None:
    model = tiny_model(kind)
    vocab = mixed_vocab()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=f".*{FALLBACK}")
        result = predict_numbers(model, vocab, PROMPTS, max_digits=digits)
    for row, prompt in enumerate(PROMPTS):
        expected = expected_table(model, vocab, prompt, digits)
        torch.testing.assert_close(result.probabilities[row], expected, rtol=1e-5, atol=1e-9)
    assert bool((result.mass > 0.01).all()), "the test needs models that write numbers"
    assert bool((result.pruned == 0).all())


@pytest.mark.parametrize("batch_size", [1, 3, 1000])
def test_any_batch_size_gives_the_same_table(batch_size: int) -> None:
    model = tiny_model("gpt2", seed=6)
    vocab = mixed_vocab()
    default = predict_numbers(model, vocab, PROMPTS, max_digits=2)
    split = predict_numbers(model, vocab, PROMPTS, max_digits=2, batch_size=batch_size)
    torch.testing.assert_close(split.probabilities, default.probabilities, rtol=1e-5, atol=1e-9)


def test_pruning_matches_the_whole_sequence_scorer() -> None:
    model = tiny_model("llama", seed=7)
    vocab = mixed_vocab()
    cached = predict_numbers(model, vocab, PROMPTS, max_digits=3, min_probability=1e-3)
    whole = number_distribution(
        WholeSequenceScorer(model, PROMPTS, pad_id=0, batch_size=None),
        vocab,
        max_digits=3,
        min_probability=1e-3,
    )
    torch.testing.assert_close(cached.probabilities, whole.probabilities, rtol=1e-5, atol=1e-9)
    torch.testing.assert_close(cached.pruned, whole.pruned, rtol=1e-5, atol=1e-9)
    assert bool((cached.pruned > 0).all()), "the threshold must prune something"


class WithoutLogitsToKeep(torch.nn.Module):
    """A cached causal LM whose forward cannot restrict its logits to some positions."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Any = None,
        use_cache: bool = False,
    ) -> Any:
        # The wrapped model's own name for the cache: `cache` from transformers 5, before
        # `past_key_values` (which takes **kwargs and would drop a `cache` unread).
        return self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=use_cache,
            **{cache_argument(self.model): cache},
        )


def test_a_model_that_computes_every_position_s_logits_is_served_too() -> None:
    model = WithoutLogitsToKeep(tiny_model("llama", seed=8))
    vocab = mixed_vocab()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=f".*{FALLBACK}")
        result = predict_numbers(model, vocab, PROMPTS, max_digits=2)
    for row, prompt in enumerate(PROMPTS):
        expected = expected_table(model, vocab, prompt, 2)
        torch.testing.assert_close(result.probabilities[row], expected, rtol=1e-5, atol=1e-9)


def test_under_peft_lora_the_output_layer_reads_only_each_prompt_s_last_position() -> None:
    """PeftModel.forward takes ``**kwargs`` rather than ``logits_to_keep`` and the cache, and
    passes them on: the scorer reads their names off the wrapped model (``cache``, not the
    deprecated ``past_key_values``)."""
    peft = pytest.importorskip("peft")
    torch.manual_seed(3)
    lora = peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"])
    model = peft.get_peft_model(tiny_model("llama", seed=8), lora).eval()
    positions_read: list[int] = []
    widths: list[int] = []
    base = model.get_base_model()
    hooks = [
        base.lm_head.register_forward_hook(
            lambda _, args, __: positions_read.append(args[0].shape[1])
        ),
        base.register_forward_pre_hook(
            lambda _, args, kwargs: widths.append(kwargs["input_ids"].shape[1]), with_kwargs=True
        ),
    ]
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*past_key_values.*deprecated")
            result = predict_numbers(model, mixed_vocab(), PROMPTS, max_digits=2)
    finally:
        for hook in hooks:
            hook.remove()
    # The prompt forward keeps the distinct last positions (lengths 3, 1, 7), not all 7; each
    # extension reads its new tokens only.
    assert positions_read[0] == len({len(prompt) for prompt in PROMPTS})
    assert positions_read[1:] == widths[1:]
    for row, prompt in enumerate(PROMPTS):
        expected = expected_table(model, mixed_vocab(), prompt, 2)
        torch.testing.assert_close(result.probabilities[row], expected, rtol=1e-5, atol=1e-9)


class TupleLogits(torch.nn.Module):
    """A model without a key/value cache: ``forward(input_ids, attention_mask)`` -> (logits,)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor]:
        return (self.model(input_ids=input_ids, attention_mask=attention_mask).logits,)


@pytest.mark.parametrize(
    ("build", "reason"),
    [
        (lambda: tiny_model("mistral-sliding"), "DynamicSlidingWindowLayer"),
        (lambda: TupleLogits(tiny_model("llama")), "does not take attention_mask and position_ids"),
    ],
    ids=["sliding-window", "no-cache"],
)
@pytest.mark.parametrize("one_prompt_per_group", [False, True], ids=["one-group", "groups"])
def test_models_the_cache_cannot_serve_fall_back_with_one_warning(
    build: Any, reason: str, one_prompt_per_group: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import numtok.readout.decoding
    from numtok.readout.distribution import widest_level

    model = build()
    vocab = mixed_vocab()
    if one_prompt_per_group:
        budget = widest_level(vocab, 2) * VOCAB_SIZE * 4
        monkeypatch.setattr(numtok.readout.decoding, "LOGITS_BUDGET_BYTES", budget)
    with pytest.warns(UserWarning, match=FALLBACK) as caught:
        result = predict_numbers(model, vocab, PROMPTS, max_digits=2)
    assert len([w for w in caught if FALLBACK in str(w.message)]) == 1
    assert reason in str(next(w.message for w in caught if FALLBACK in str(w.message)))
    for row, prompt in enumerate(PROMPTS):
        expected = expected_table(model, vocab, prompt, 2)
        torch.testing.assert_close(result.probabilities[row], expected, rtol=1e-5, atol=1e-9)


def test_an_attention_that_ignores_the_tree_s_mask_is_refused() -> None:
    """Flash and flex attention do not apply a 4D mask: the tree's tokens would see each other,
    so the cached scorer refuses them (and predict_numbers scores the exact, slow way)."""
    from numtok.readout.scorers import CacheUnsupportedError

    model = tiny_model("llama", seed=5)
    model.config._attn_implementation = "flash_attention_2"
    scorer = CachedScorer(model, PROMPTS, pad_id=0, batch_size=None)
    with pytest.raises(CacheUnsupportedError, match=r"its attention \(flash_attention_2\) does"):
        scorer.start()


def widest_call(model: Any, vocab: NumberVocab, digits: int, max_value: int | None) -> int:
    """The most rows of logits one prompt's tree asked of the scorer in one call."""
    rows: list[int] = []
    whole = WholeSequenceScorer(model, [PROMPTS[0]], pad_id=0, batch_size=None)
    scorer = RecordingScorer(whole, rows)
    number_distribution(scorer, vocab, max_digits=digits, max_value=max_value)
    return max(rows)


@pytest.mark.parametrize(
    ("digits", "max_value"), [(1, None), (2, None), (3, None), (1, 4), (2, 11), (2, 45), (3, 120)]
)
def test_the_widest_level_bounds_every_call_of_the_scorer(
    digits: int, max_value: int | None
) -> None:
    from numtok.readout.distribution import widest_level

    model = tiny_model("llama", seed=9)
    mixed = mixed_vocab()
    widest = widest_level(mixed, digits, max_value=max_value)
    assert widest_call(model, mixed, digits, max_value) <= widest
    # Without word-start tokens (which start a number but do not continue one) it is exact.
    continuing = NumberVocab.from_values(
        {i: d for i, d in zip(mixed.ids.tolist(), mixed.digits, strict=True) if i < 13},
        vocab_size=VOCAB_SIZE,
    )
    widest = widest_level(continuing, digits, max_value=max_value)
    assert widest_call(model, continuing, digits, max_value) == widest
    only_digits = NumberVocab.from_values({i: str(i) for i in range(10)}, vocab_size=VOCAB_SIZE)
    widest = widest_level(only_digits, digits, max_value=max_value)
    assert widest_call(model, only_digits, digits, max_value) == widest
    # Single digits: 10**digits spellings at the last level, fewer where max_value cuts them
    # (0-11 in two digits: 00-09, 10 and 11 spelled in two tokens).
    expected = {None: 10**digits, 4: 5, 11: 12, 45: 46, 120: 121}[max_value]
    assert widest == expected


@pytest.mark.parametrize("per_group", [1, 2])
def test_prompts_are_read_in_groups_that_keep_the_logits_under_the_budget(
    per_group: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import numtok.readout.decoding
    from numtok.readout.distribution import widest_level

    model = tiny_model("llama", seed=10)
    vocab = mixed_vocab()
    whole = predict_numbers(model, vocab, PROMPTS, max_digits=2)
    widest = widest_level(vocab, 2)
    monkeypatch.setattr(
        numtok.readout.decoding, "LOGITS_BUDGET_BYTES", per_group * widest * VOCAB_SIZE * 4
    )
    cached_scorer, rows = numtok.readout.decoding.CachedScorer, []
    monkeypatch.setattr(
        numtok.readout.decoding,
        "CachedScorer",
        lambda *a, **k: RecordingScorer(cached_scorer(*a, **k), rows),
    )
    grouped = predict_numbers(model, vocab, PROMPTS, max_digits=2)
    assert max(rows) <= per_group * widest
    assert rows.count(per_group) >= len(PROMPTS) // per_group  # start() per group
    for field in ("probabilities", "mass", "mean", "median", "mode", "pruned"):
        torch.testing.assert_close(
            getattr(grouped, field), getattr(whole, field), rtol=1e-5, atol=1e-9, equal_nan=True
        )


def test_a_level_does_not_keep_every_forward_s_whole_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """A forward's cache holds the prompt's positions once per prefix; what a level keeps of it
    (the prefixes' own positions) must not hold the rest alive until the level ends."""
    import weakref

    import numtok.readout.scorers as scorers

    alive: list[int] = []
    caches: list[weakref.ref[torch.Tensor]] = []
    keys_values = scorers._keys_values

    def recording(cache: Any) -> Any:
        pairs = keys_values(cache)
        alive.append(sum(ref() is not None for ref in caches))
        caches.append(weakref.ref(pairs[0][0]))
        return pairs

    monkeypatch.setattr(scorers, "_keys_values", recording)
    model, vocab = tiny_model("llama", seed=11), mixed_vocab()
    number_distribution(
        scorers.CachedScorer(model, PROMPTS, pad_id=0, batch_size=2), vocab, max_digits=2
    )
    assert len(alive) > 10, "the test needs many forwards per level"
    assert max(alive) <= 2  # the prompts' cache and the forward before this one


def test_a_largest_value_reads_the_same_table_up_to_it() -> None:
    model, vocab = tiny_model("llama", seed=12), mixed_vocab()
    full = predict_numbers(model, vocab, PROMPTS, max_digits=2)
    capped = predict_numbers(model, vocab, PROMPTS, max_digits=2, max_value=11)
    expected = full.probabilities.clone()
    expected[:, 12:] = 0
    torch.testing.assert_close(capped.probabilities, expected, rtol=1e-5, atol=1e-9)
    assert bool((capped.number <= 11).all())
    with pytest.raises(ValueError, match="max_value must be a non-negative int, got -3"):
        predict_numbers(model, vocab, PROMPTS, max_value=-3)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_a_tolerance_reads_within_its_bound_of_the_exact_readout(kind: str) -> None:
    """Fast against exact on a tiny model, 3 digits: the unexplored mass ``pruned`` is at most
    ``tolerance · s`` (s from a float64 softmax of the prompt scored alone), it bounds the mass
    lost and the mean's move, and far fewer prefixes are scored."""
    model, vocab, tolerance = tiny_model(kind, seed=13), mixed_vocab(), 5e-2
    every: list[int] = []
    likely: list[int] = []
    exact = number_distribution(
        RecordingScorer(CachedScorer(model, PROMPTS, pad_id=0, batch_size=None), every),
        vocab,
        max_digits=3,
    )
    fast = number_distribution(
        RecordingScorer(CachedScorer(model, PROMPTS, pad_id=0, batch_size=None), likely),
        vocab,
        max_digits=3,
        tolerance=tolerance,
    )
    assert sum(likely) < sum(every) / 2
    assert bool((fast.pruned > 0).all()), "the tolerance must leave something out"
    logits = model_logits(model)
    s = torch.tensor([float(torch.softmax(logits(tuple(p)), 0)[vocab.ids].sum()) for p in PROMPTS])
    assert bool((fast.pruned <= tolerance * s * (1 + 1e-6)).all())
    lost = exact.mass - fast.mass
    assert bool((lost >= -1e-9).all()) and bool((lost <= fast.pruned + 1e-9).all())
    moved = (fast.mean - exact.mean).abs()
    assert bool((moved <= fast.pruned / (fast.mass + fast.pruned) * 999 + 1e-6).all())
    via_predict = predict_numbers(model, vocab, PROMPTS, max_digits=3, tolerance=tolerance)
    torch.testing.assert_close(via_predict.probabilities, fast.probabilities, rtol=1e-5, atol=1e-9)
    torch.testing.assert_close(via_predict.pruned, fast.pruned, rtol=1e-5, atol=1e-9)


def test_greedy_tokens_and_the_readout_share_one_prompt_pass() -> None:
    """``new_tokens``: each prompt's greedy continuation, as argmax over the prompt scored alone
    step by step, and the same table as without it; the prompts run through the model once."""
    model, vocab = tiny_model("llama", seed=14), mixed_vocab()
    logits = model_logits(model)
    expected = []
    for prompt in PROMPTS:
        sequence = tuple(prompt)
        for _ in range(4):
            sequence = (*sequence, int(logits(sequence).argmax()))
        expected.append(sequence[len(prompt) :])
    cached: list[bool] = []
    forward = model.forward

    @functools.wraps(forward)
    def recording(*args: Any, **kwargs: Any) -> Any:
        cached.append(kwargs.get(cache_argument(model)) is not None)
        return forward(*args, **kwargs)

    model.forward = recording
    both = predict_numbers(model, vocab, PROMPTS, max_digits=2, new_tokens=4)
    assert both.greedy == tuple(expected)
    assert cached.count(False) == 1  # the prompts' one pass
    assert cached.count(True) == 3 + 2  # three greedy steps after the first token, two levels
    alone = predict_numbers(model, vocab, PROMPTS, max_digits=2)
    torch.testing.assert_close(both.probabilities, alone.probabilities, rtol=1e-6, atol=1e-12)
    assert alone.greedy == ()


def test_greedy_tokens_end_at_the_end_of_sequence_token() -> None:
    model, vocab = tiny_model("llama", seed=14), mixed_vocab()
    scorer = CachedScorer(model, PROMPTS, pad_id=0, batch_size=None)
    free = greedy_tokens(scorer, 4, eos_id=None)
    stop = free[0][1]
    ended = greedy_tokens(scorer, 4, eos_id=stop)
    for row, tokens in zip(free, ended, strict=True):
        end = tokens.index(stop) + 1 if stop in tokens else len(row)
        assert tokens == row[:end]
    assert any(len(tokens) < len(row) for row, tokens in zip(free, ended, strict=True))
    with pytest.raises(ValueError, match="new_tokens must be a positive int, got 0"):
        greedy_tokens(scorer, 0, eos_id=None)
    with pytest.raises(ValueError, match="new_tokens must be a non-negative int, got -1"):
        predict_numbers(model, vocab, PROMPTS, new_tokens=-1)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_prompts_that_share_their_first_tokens_run_them_once(kind: str) -> None:
    """The leading tokens the prompts share run once, for one row, the rest after them; in
    float64 the table is the brute force's over each prompt scored whole."""
    prompts = [[15, 16, 15, 3], [15, 16, 15], [15, 16, 15, 16, 16, 2, 15]]
    model, vocab = tiny_model(kind, seed=15).double(), mixed_vocab()
    batches: list[tuple[int, int]] = []
    forward = model.forward

    @functools.wraps(forward)
    def recording(*args: Any, **kwargs: Any) -> Any:
        batches.append(tuple(kwargs["input_ids"].shape))
        return forward(*args, **kwargs)

    model.forward = recording
    result = predict_numbers(model, vocab, prompts, max_digits=2)
    assert batches[:2] == [(1, 2), (3, 5)]  # the shared tokens but the shortest's last; the rest
    for row, prompt in enumerate(prompts):
        expected = expected_table(model, vocab, prompt, 2)
        torch.testing.assert_close(result.probabilities[row], expected, rtol=1e-10, atol=1e-15)
