"""predict_numbers against a greedy generate() on the same prompts: the time of reading a number
out of a causal LM's distribution, exactly (every spelling of every number scored) and fast
(the likely prefixes only, the unexplored mass reported), as a multiple of decoding it greedily.

    python benchmarks/bench_readout.py                        # a random Llama, V = 128,256
    python benchmarks/bench_readout.py --model smollm2-135m   # a local model folder
    python benchmarks/bench_readout.py --device cuda

Cases: 1 to 5 digits, 8 prompts, digits + 1 new tokens for the greedy generate(). Variants, each on
the same prompts: ``generate`` (greedy, exactly that many new tokens: the base of the ratios); up
to ``--fast-digits`` (default 5) ``fast`` (``predict_numbers`` with ``tolerance=FAST_TOLERANCE``,
as ``numtok compare`` reads) and ``fast + greedy`` (the same with ``new_tokens``: the greedy
continuation and the readouts from one prompt pass, what compare runs per split); with
``--max-prefixes N`` (default 16; 0: none) ``fast, max_prefixes=N`` (at most N prefixes per prompt
and level: the cost bounded, the unexplored mass whatever it is); up to ``--exact-digits`` (default
3) ``exact`` (``predict_numbers`` with no tolerance: the prompt's key/value cache, one batched
one-token forward per level of the tree); and up to ``--whole-sequence-digits`` (default 0) ``whole
sequence``: every continuation scored from the first prompt token, as predict_numbers did before
the cache (and still does for models whose cache it cannot rebuild). Checks, from the untimed
warm-up calls: the fast readout's largest unexplored mass (``pruned``) and its largest ``pruned /
(mass + pruned)`` (the bound on the mean's move as a share of the values' range); against exact,
the largest difference of the means as a share of the range (10**digits - 1); the covered mass;
whole sequence - exact.

The random model (no ``--model``): a 2-layer Llama (hidden 256, MLP 512, 4 heads, 2 KV heads,
float32) with V = 128,256 and a Llama-3-style number vocabulary, the 1,110 tokens "0".."9",
"00".."99", "000".."999" (ids 100..1209); prompts are 32 random token ids. With ``--model``,
the folder's tokenizer and weights (float32) and arithmetic prompts ("What is 37 + 48? The
answer is "), of different lengths, left-padded for generate().

Method: ``--rounds`` interleaved rounds (the variants' order rotating between rounds) after one
untimed warm-up of each; medians with p20/p80; each call timed by benchmarks/runner.py's clock
(``time_calls``: ``perf_counter``, CUDA events on a GPU). The checks are the readout's own
measures (masses and shares of the range), not a relative error against a reference. Results
go to ``benchmarks/results/<date>T<time>-readout-<model>-<device>.{jsonl,md}``, rewritten after
each case; ``--note`` is stored in every row (e.g. that the machine was busy).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from bench_common import provenance, quantiles
from runner import time_calls

from numtok import NumberVocab
from numtok.readout.decoding import predict_numbers
from numtok.readout.distribution import FAST_TOLERANCE, number_distribution
from numtok.readout.scorers import WholeSequenceScorer

#: The default of ``--max-prefixes``.
CAPPED = 16

RESULTS = Path(__file__).resolve().parent / "results"
#: (digits, prompts, new tokens of the greedy generate()).
CASES = [(digits, 8, digits + 1) for digits in range(1, 6)]
FIRST_NUMBER_ID = 100
RANDOM_VOCAB = 128_256
RANDOM_PROMPT_TOKENS = 32


def random_llama(device: torch.device) -> tuple[Any, NumberVocab]:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=RANDOM_VOCAB,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(device).eval()
    strings = [f"{v}" for v in range(10)] + [f"{v:02d}" for v in range(100)]
    strings += [f"{v:03d}" for v in range(1000)]
    values = {FIRST_NUMBER_ID + i: text for i, text in enumerate(strings)}
    return model, NumberVocab.from_values(values, vocab_size=RANDOM_VOCAB)


def random_prompts(count: int) -> list[list[int]]:
    rng = random.Random(count)
    first_text_id = FIRST_NUMBER_ID + 1110
    return [
        [rng.randrange(first_text_id, RANDOM_VOCAB) for _ in range(RANDOM_PROMPT_TOKENS)]
        for _ in range(count)
    ]


def arithmetic_prompts(count: int) -> list[str]:
    rng = random.Random(count)
    return [
        f"What is {rng.randint(1, 99)} + {rng.randint(1, 99 * (i + 1))}? The answer is "
        for i in range(count)
    ]


def greedy(model: Any, tokenizer: Any, prompts: list[Any], new_tokens: int) -> Any:
    device = next(model.parameters()).device
    if tokenizer is None:
        batch = {"input_ids": torch.tensor(prompts, device=device)}
        batch["attention_mask"] = torch.ones_like(batch["input_ids"])
        pad = 0
    else:
        batch = tokenizer(prompts, return_tensors="pt", padding=True).to(device)
        pad = tokenizer.pad_token_id
    with torch.no_grad():
        return model.generate(
            **batch,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=pad,
        )


def whole_sequence(model: Any, vocab: NumberVocab, ids: list[list[int]], digits: int) -> Any:
    scorer = WholeSequenceScorer(model, ids, pad_id=0, batch_size=None)
    return number_distribution(scorer, vocab, max_digits=digits)


def run_case(
    model: Any,
    tokenizer: Any,
    vocab: NumberVocab,
    prompts: list[Any],
    case: tuple[int, int, int],
    rounds: int,
    max_prefixes: int | None,
    fast_digits: int,
    exact_digits: int,
    whole_digits: int,
    device: torch.device,
) -> tuple[dict[str, list[float]], dict[str, float]]:
    digits, _, new_tokens = case
    ids = prompts if tokenizer is None else [tokenizer(p)["input_ids"] for p in prompts]
    fast = {"max_digits": digits, "tolerance": FAST_TOLERANCE}
    # predict_numbers ends the greedy text at the tokenizer's end-of-sequence token.
    reader = vocab if tokenizer is None else tokenizer
    variants = {"generate": lambda: greedy(model, tokenizer, prompts, new_tokens)}
    if digits <= fast_digits:
        variants["fast"] = lambda: predict_numbers(model, vocab, ids, **fast)
        variants["fast + greedy"] = lambda: predict_numbers(
            model, reader, ids, new_tokens=new_tokens, **fast
        )
    capped = f"fast, max_prefixes={max_prefixes}"
    if max_prefixes is not None:
        variants[capped] = lambda: predict_numbers(
            model, vocab, ids, max_prefixes=max_prefixes, **fast
        )
    if digits <= exact_digits:
        variants["exact"] = lambda: predict_numbers(model, vocab, ids, max_digits=digits)
    if digits <= whole_digits:
        variants["whole sequence"] = lambda: whole_sequence(model, vocab, ids, digits)
    results = {name: work() for name, work in variants.items()}  # warm-up, and the checks
    checks: dict[str, float] = {}
    for name in ("fast", capped):
        if name not in results:
            continue
        read = results[name]
        checks[f"{name}: largest unexplored mass"] = float(read.pruned.max())
        bound = (read.pruned / (read.mass + read.pruned)).max()
        checks[f"{name}: largest pruned / (mass + pruned)"] = float(bound)
        checks[f"{name}: covered mass (median)"] = float(read.mass.median())
        if "exact" in results:
            moved = (read.mean - results["exact"].mean).abs().max()
            checks[f"{name} - exact: largest |mean difference| / range"] = float(
                moved / (10**digits - 1)
            )
    if "exact" in results:
        checks["exact: covered mass (median)"] = float(results["exact"].mass.median())
    if "whole sequence" in results and "exact" in results:
        difference = results["whole sequence"].probabilities - results["exact"].probabilities
        checks["whole sequence - exact, largest |difference|"] = float(difference.abs().max())
    return time_calls(variants, rounds, device), checks


def summary(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| digits | prompts | new tokens (generate) | variant | ms median (p20-p80) | × generate |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['digits']} | {row['prompts']} | {row['new_tokens']} | {row['variant']} "
            f"| {row['median_ms']:.0f} ({row['p20_ms']:.0f}-{row['p80_ms']:.0f}) "
            f"| {row['time_ratio']:.2f} |"
        )
    checks = {(r["digits"], name): value for r in rows for name, value in r["checks"].items()}
    lines.append("")
    lines += [f"- {digits} digits, {name}: {value:.3g}" for (digits, name), value in checks.items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a local causal LM folder (default: random)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per variant")
    parser.add_argument(
        "--digits", type=lambda t: [int(d) for d in t.split(",")], default=[1, 2, 3, 4, 5]
    )
    parser.add_argument(
        "--fast-digits",
        type=int,
        default=5,
        help="time the fast readout without a prefix limit up to this many digits (default 5)",
    )
    parser.add_argument(
        "--exact-digits",
        type=int,
        default=3,
        help="time the exact readout up to this many digits (default 3)",
    )
    parser.add_argument(
        "--whole-sequence-digits",
        type=int,
        default=0,
        help="time the whole-sequence scorer up to this many digits (default 0: never)",
    )
    parser.add_argument(
        "--max-prefixes",
        type=int,
        default=CAPPED,
        help=f"also time the fast readout with this max_prefixes (default {CAPPED}; 0: not)",
    )
    parser.add_argument("--note", default="", help="stored in every row (e.g. 'machine busy')")
    parser.add_argument("--out", type=Path, help="JSONL file (default: results/...)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    device = torch.device(args.device)
    import transformers

    if args.model is None:
        model, vocab = random_llama(device)
        tokenizer = None
        label = "random-llama-128k"
    else:
        tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
        tokenizer.padding_side = "left"
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
        model = model.to(device).eval()
        vocab = NumberVocab.from_tokenizer(tokenizer, vocab_size=model.config.vocab_size)
        label = args.model.name
    meta = {
        **provenance(device, compiled=False),
        "transformers": transformers.__version__,
        "threads": args.threads,
        "model": label,
        "number_tokens": len(vocab),
        "tolerance": FAST_TOLERANCE,
        "note": args.note,
    }
    out = args.out
    if out is None:
        stamp = meta["date"][:16].replace(":", "")
        where = f"{device.type}-t{args.threads}" if device.type == "cpu" else device.type
        out = RESULTS / f"{stamp}-readout-{label}-{where}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for case in [c for c in CASES if c[0] in args.digits]:
        digits, count, new_tokens = case
        prompts = random_prompts(count) if tokenizer is None else arithmetic_prompts(count)
        samples, checks = run_case(
            model,
            tokenizer,
            vocab,
            prompts,
            case,
            args.rounds,
            args.max_prefixes or None,
            args.fast_digits,
            args.exact_digits,
            args.whole_sequence_digits,
            device,
        )
        base = quantiles(samples["generate"])[1]
        for variant, seconds in samples.items():
            p20, median, p80 = quantiles(seconds)
            rows.append(
                {
                    **meta,
                    "digits": digits,
                    "prompts": count,
                    "new_tokens": new_tokens,
                    "variant": variant,
                    "rounds": len(seconds),
                    "median_ms": round(median, 1),
                    "p20_ms": round(p20, 1),
                    "p80_ms": round(p80, 1),
                    "time_ratio": round(median / base, 3),
                    "checks": checks,
                }
            )
        print(summary([r for r in rows if r["digits"] == digits]), flush=True)
        # Written after every case, so that a run stopped at a time limit keeps what it measured.
        out.write_text("".join(json.dumps(row) + "\n" for row in rows))
        note = f"Note: {args.note}\n\n" if args.note else ""
        out.with_suffix(".md").write_text(note + summary(rows) + "\n")
    print(f"results: {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
