"""The scenarios of tests/test_vllm_readout.py, run in the vLLM environment: python
_vllm_worker.py FOLDER GPT2_TOKENIZER_DATA. Prints ``SCENARIO <name> ...`` for each one passed."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch


def build(folder: Path, data: Path) -> tuple[object, object]:
    """A tiny random Llama with GPT-2's tokenizer, saved in ``folder``; its logits spread wider
    than the default initialisation gives, so the readouts differ between prompts."""
    from transformers import GPT2Tokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = GPT2Tokenizer(str(data / "encoder.json"), str(data / "vocab.bpe"))
    config = LlamaConfig(
        vocab_size=50304,  # the output layer padded beyond the tokenizer's 50,257
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        initializer_range=0.2,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model, tokenizer


def same(name: str, ours: object, theirs: object) -> str:
    """Checks that two NumberPredictions agree; returns the largest differences."""
    probabilities = ours.probabilities / ours.mass[:, None]
    reference = theirs.probabilities / theirs.mass[:, None]
    worst = {
        "probabilities": float((ours.probabilities - theirs.probabilities).abs().max()),
        "relative probabilities": float((probabilities - reference).abs().max()),
        "mass": float(((ours.mass - theirs.mass) / theirs.mass).abs().max()),
        "mean": float((ours.mean - theirs.mean).abs().max()),
        "pruned": float((ours.pruned - theirs.pruned).abs().max()),
    }
    assert worst["relative probabilities"] < 1e-5, (name, worst)
    assert worst["mass"] < 1e-5, (name, worst)
    # float32 sums of values up to 99: a relative tolerance, like the probabilities'
    mean_tolerance = 1e-5 * max(1.0, float(theirs.mean.abs().max()))
    assert worst["mean"] < mean_tolerance, (name, worst)
    assert worst["pruned"] <= 1e-5 * max(1e-12, float(theirs.pruned.max())), (name, worst)
    assert torch.equal(ours.median, theirs.median), (name, ours.median, theirs.median)
    assert torch.equal(ours.mode, theirs.mode), (name, ours.mode, theirs.mode)
    # ``number`` is the chosen readout: the median or the mode exactly, the mean within its
    # tolerance
    number_difference = float((ours.number - theirs.number).abs().max())
    assert torch.equal(ours.number, theirs.number) or number_difference < mean_tolerance, (
        name,
        ours.number,
        theirs.number,
    )
    return " ".join(f"{k}={v:.1e}" for k, v in worst.items())


def main() -> None:
    start = time.perf_counter()
    folder, data = Path(sys.argv[1]) / "tiny", Path(sys.argv[2])
    model, tokenizer = build(folder, data)

    from vllm import LLM

    from numtok import NumberVocab
    from numtok.integrations.vllm import VLLMScorer, predict_numbers
    from numtok.readout.decoding import predict_numbers as hf_predict_numbers

    llm = LLM(
        model=str(folder),
        dtype="float32",
        max_model_len=64,
        max_logprobs=128,
        enforce_eager=True,
        # A fixed KV cache (64 MiB; the model needs 2 KiB a token) instead of a share of memory:
        # on CPU, vLLM subtracts the worker's resident memory from that share, which is
        # negative on a 12 GiB machine at 0.05 and fails the engine's start.
        kv_cache_memory_bytes=64 * 2**20,
        seed=0,
    )
    print(f"engine up after {time.perf_counter() - start:.0f} s", flush=True)
    prompts = ["12 + 30 =", "The answer is", "Score:"]

    def scenario(name: str, **kwargs: object) -> None:
        began = time.perf_counter()
        ours = predict_numbers(llm, prompts, **kwargs)
        theirs = hf_predict_numbers(model, tokenizer, prompts, **kwargs)
        print(
            f"SCENARIO {name} {same(name, ours, theirs)} mean={ours.mean.tolist()} "
            f"{time.perf_counter() - began:.1f} s",
            flush=True,
        )

    scenario("one-digit", max_digits=1)
    scenario("two-digits", max_digits=2, readout="median")
    scenario("up-to-eleven", max_digits=2, max_value=11)
    scenario("most-likely-three", max_digits=2, max_prefixes=3)

    began = time.perf_counter()
    vocab = NumberVocab.from_tokenizer(tokenizer, vocab_size=50304)
    ids = [tokenizer(p)["input_ids"] for p in prompts]
    ours = predict_numbers(llm, ids, vocab=vocab, max_digits=1, readout="mode")
    theirs = hf_predict_numbers(model, vocab, ids, max_digits=1, readout="mode")
    scorer = VLLMScorer(llm, ids, vocab)
    assert scorer.slice_size == 128 and len(scorer.continuing) < len(scorer.number_ids)
    print(
        f"SCENARIO token-ids {same('token-ids', ours, theirs)} {time.perf_counter() - began:.1f} s",
        flush=True,
    )

    began = time.perf_counter()
    # About half the first number tokens of two digits or fewer are pruned: a threshold between
    # the two middle ones of their probabilities after the prompts (away from both, which the
    # two readouts compute in different precisions).
    short = vocab.ids[torch.tensor([len(d) <= 2 for d in vocab.digits])]
    with torch.no_grad():
        last = [model(torch.tensor([row])).logits[0, -1].double().log_softmax(-1) for row in ids]
    middle = torch.stack(last)[:, short].flatten().sort().values
    threshold = float(((middle[len(middle) // 2 - 1] + middle[len(middle) // 2]) / 2).exp())
    ours = predict_numbers(llm, prompts, max_digits=2, min_probability=threshold)
    theirs = hf_predict_numbers(model, tokenizer, prompts, max_digits=2, min_probability=threshold)
    assert float(theirs.pruned.min()) > 0 and float(theirs.mass.min()) > 0, theirs
    print(
        f"SCENARIO pruned {same('pruned', ours, theirs)} pruned={ours.pruned.tolist()} "
        f"{time.perf_counter() - began:.1f} s",
        flush=True,
    )

    refusals = [
        (lambda: predict_numbers(llm, prompts, readout="mean"), ValueError, "readout"),
        (lambda: predict_numbers(llm, prompts, max_digits=6), ValueError, "max_digits"),
        (lambda: predict_numbers(llm, "Score:"), TypeError, "list of strings"),
        (lambda: predict_numbers(llm, []), ValueError, "at least one"),
        (lambda: predict_numbers(model, prompts), TypeError, "vllm.LLM"),
    ]
    for call, error, words in refusals:
        try:
            call()
        except error as raised:
            assert words in str(raised), raised
        else:
            raise AssertionError(f"no {error.__name__} mentioning {words!r}")
    print("SCENARIO refusals", flush=True)
    print(f"done in {time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":  # vLLM's engine starts a process of its own
    main()
