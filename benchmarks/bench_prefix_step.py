"""What one level of the readout's digit tree spends in the output layer: the bound on a cheaper
prefix (issue 59, item 2).

A level of ``predict_numbers``' tree (enumerated or drawn) is one cached forward of one new
token per live prefix (``CachedScorer.extend``: the decoder over the new tokens, attending to the
prompt's cached keys and values, then the output layer and a log-softmax over the whole
vocabulary). The number head would read the N number rows of the output weight instead of all
V, but the probability of a digit is its logit less the log-sum-exp over all V logits: the full
output layer stays, unless that normaliser came from elsewhere. So what the number head could
save at most is the output layer itself; this measures that share.

    .venv/bin/python benchmarks/bench_prefix_step.py [--model DIR] [--threads 2] [--rounds 15]

Cases: 8 word-problem prompts, 10 and 64 new tokens per prompt (a first level of the
enumeration; a level of 64 draws). Variants, interleaved rounds, medians with p20/p80:
``level`` (``start()``, which reuses the prompt pass, then ``extend`` of every row),
``output layer`` (``lm_head`` on as many hidden rows, then ``logsumexp``) and ``number rows``
(the hidden rows times the number tokens' rows of the output weight). Rows:
``benchmarks/results/<date>T<time>-prefix-step-<model>-cpu-t<threads>.{jsonl,md}``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
from bench_common import provenance, quantiles
from runner import time_calls

from numtok import NumberVocab
from numtok.readout.scorers import CachedScorer

PROMPTS = [f"Ann has {a} apples and gets {b} more. How many apples does Ann have? Answer: "
           for a, b in ((12, 30), (250, 41), (7, 99), (180, 180), (33, 5), (299, 1), (64, 64),
                        (101, 202))]  # fmt: skip


def _timed_level(
    model: Any, tokenizer: Any, prompts: list[list[int]], vocab: NumberVocab, per_prompt: int,
    rounds: int,
) -> dict[str, tuple[float, float, float]]:  # fmt: skip
    """The three variants' (p20, median, p80) milliseconds at ``per_prompt`` new tokens."""
    scorer = CachedScorer(model, prompts, pad_id=tokenizer.eos_token_id, batch_size=None)
    parents = torch.arange(len(prompts)).repeat_interleave(per_prompt)
    tokens = vocab.ids[torch.arange(len(parents)) % len(vocab.ids)]
    weight = model.get_output_embeddings().weight
    number_rows = weight[vocab.ids].detach()
    hidden = torch.randn(len(parents), weight.shape[1])

    def level() -> object:
        scorer.start()
        return scorer.extend(parents, tokens)

    with torch.no_grad():
        samples = time_calls(
            {"level": level,
             "output layer": lambda: torch.logsumexp(model.lm_head(hidden), dim=-1),
             "number rows": lambda: hidden @ number_rows.T},
            rounds, torch.device("cpu"),
        )  # fmt: skip
    return {name: quantiles(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--results", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import transformers

    from numtok_compare.pretrained import ensure_smollm2

    folder = args.model or ensure_smollm2(None)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model: Any = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.eval()
    vocab = NumberVocab.from_tokenizer(tokenizer, vocab_size=model.config.vocab_size)
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]
    rows = []
    for per_prompt in (10, 64):
        medians = _timed_level(model, tokenizer, prompts, vocab, per_prompt, args.rounds)
        rows.append({
            "prompts": len(prompts), "new_tokens_per_prompt": per_prompt,
            "rows": len(prompts) * per_prompt, "ms": medians,
            "output_layer_share": medians["output layer"][1] / medians["level"][1],
            "number_rows_share": medians["number rows"][1] / medians["level"][1],
            "vocab_size": model.config.vocab_size, "number_tokens": len(vocab.ids),
            "threads": args.threads, "rounds": args.rounds,
            **provenance(torch.device("cpu"), False),
        })  # fmt: skip
        print(json.dumps(rows[-1]))
    stem = f"{time.strftime('%Y-%m-%dT%H%M')}-prefix-step-{Path(folder).name}-cpu-t{args.threads}"
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / f"{stem}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = ["| rows (prompts × new tokens) | level (ms) | output layer + logsumexp (ms) | share "
             "| number rows (ms) | share |", "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        ms = r["ms"]
        lines.append(
            f"| {r['rows']} ({r['prompts']} × {r['new_tokens_per_prompt']}) | {ms['level'][1]:.1f} "
            f"| {ms['output layer'][1]:.1f} | {r['output_layer_share']:.0%} | "
            f"{ms['number rows'][1]:.2f} | {r['number_rows_share']:.1%} |"
        )
    (args.results / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
