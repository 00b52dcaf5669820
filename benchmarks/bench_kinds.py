"""What each number loss costs in the fused pass: ``cross_entropy_with_ntl`` forward + backward
with ``kind`` = was, del, smmd, dist2, against ``F.cross_entropy`` alone on the same logits, on a
digit vocabulary (10 number tokens) and on Llama-3's 1–3-digit chunks (1,110 number tokens).

Logits (N, V) float32, 10 % of the labels number tokens; each kind is first checked against
``F.cross_entropy + 0.3 * number_token_loss(kind=...)`` (value and gradient), then every
implementation is timed in each of ``--rounds`` interleaved rounds (benchmarks/runner.py) and
the median reported, with each kind's time as a multiple of NTL-WAS's (the kinds differ only in
the per-row terms of the K number logits), of ``F.cross_entropy``'s and of the other anchors
that ran: Liger's cross-entropy (CUDA, where installed), ``F.cross_entropy`` + ntloss (digits,
where installed).

Usage: ``python benchmarks/bench_kinds.py [--rows 4096] [--vocab 32768] [--rounds 5]
[--threads 2] [--device cpu] [--out PATH] [--quick]``; prints a Markdown table and writes
``PATH.{jsonl,md}`` (default ``benchmarks/results/<date>-kinds-<device>``). On CUDA the fused
path of every kind is the Triton row kernel (``impl="triton"``, opt-in) and the logits are drawn
on the device. ``--quick``: 256 × 4,096, 2 rounds (a dry run of ``benchmarks/gpu.sh``).
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path
from typing import Any

import torch
from anchors import (
    DIGITS,
    cross_entropy,
    liger_available,
    liger_cross_entropy,
    ntloss,
    ntloss_available,
    vocabularies,
)
from bench_common import provenance, quantiles
from runner import Implementation, Inputs, run

from numtok import NumberVocab, cross_entropy_with_ntl, number_token_loss

KINDS = ("was", "del", "smmd", "dist2")
NTL_WEIGHT = 0.3
TOLERANCE = 1e-4  # float32: relative error of the value and of the gradient
RESULTS = Path(__file__).resolve().parent / "results"


def fused(x: Inputs, vocab: NumberVocab, kind: str) -> torch.Tensor:
    impl = "triton" if x["logits"].device.type == "cuda" else "auto"
    out = cross_entropy_with_ntl(
        x["logits"], x["labels"], vocab, ntl_weight=NTL_WEIGHT, kind=kind, impl=impl
    )
    return out.loss


def reference(x: Inputs, vocab: NumberVocab, kind: str) -> torch.Tensor:
    ntl = number_token_loss(x["logits"], x["labels"], vocab, kind=kind)  # type: ignore[arg-type]
    return cross_entropy(x["logits"], x["labels"]) + NTL_WEIGHT * ntl


def ce_plus_ntloss(x: Inputs) -> torch.Tensor:
    logits, labels = x["logits"][None], x["labels"][None]  # ntloss reads sequences
    return cross_entropy(logits, labels) + NTL_WEIGHT * ntloss(logits, labels, reweigh=False)


def implementations(name: str, vocab: NumberVocab, device: torch.device) -> list[Implementation]:
    """F.cross_entropy, each kind (checked against its unfused reference) and the anchors that
    can run here."""
    found = [
        Implementation(
            "F.cross_entropy",
            lambda x: cross_entropy(x["logits"], x["labels"]),
            required=True,
            anchor=True,
        )
    ]
    for kind in KINDS:
        found.append(
            Implementation(
                f"reference {kind}",
                functools.partial(reference, vocab=vocab, kind=kind),
                timed=False,
            )
        )
        found.append(
            Implementation(
                kind, functools.partial(fused, vocab=vocab, kind=kind), f"reference {kind}"
            )
        )
    if device.type == "cuda" and liger_available():
        found.append(
            Implementation(
                "Liger CE (no NTL)",
                lambda x: liger_cross_entropy(x["logits"], x["labels"]),
                "F.cross_entropy",
                anchor=True,
            )
        )
    if name == DIGITS and ntloss_available():  # ntloss sees single digits only
        found.append(
            Implementation("CE + ntloss 0.3.2", ce_plus_ntloss, "reference was", anchor=True)
        )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, help="where the .jsonl and .md go (no suffix)")
    parser.add_argument("--quick", action="store_true", help="256 × 4,096, 2 rounds")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.vocab, args.rounds = 256, 4096, 2
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    generator = torch.Generator().manual_seed(0)
    if device.type == "cuda":  # drawn on the GPU: no host-side sampling of rows x V values
        on_device = torch.Generator(device).manual_seed(0)
        logits = torch.randn(args.rows, args.vocab, generator=on_device, device=device)
    else:
        logits = torch.randn(args.rows, args.vocab, generator=generator)
    logits.requires_grad_()
    is_number = torch.rand(args.rows, generator=generator) < 0.1
    rows: list[dict[str, Any]] = []
    lines = [
        f"`python benchmarks/bench_kinds.py --rows {args.rows} --vocab {args.vocab} --rounds "
        f"{args.rounds} --threads {args.threads} --device {args.device}`: forward + backward, "
        f"{args.rows} × {args.vocab:,} float32 logits, 10 % number labels, medians of "
        f"{args.rounds} interleaved rounds (p20-p80)",
        "",
        "| vocabulary | kind | median ms (p20-p80) | × NTL-WAS | × F.cross_entropy | "
        "× other anchors |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, vocab in vocabularies(args.vocab).items():
        numbers = vocab.ids[torch.randint(len(vocab), (args.rows,), generator=generator)]
        text = torch.randint(
            int(vocab.ids.max()) + 1, args.vocab, (args.rows,), generator=generator
        )
        labels = torch.where(is_number, numbers, text).to(device)
        found = implementations(name, vocab, device)
        measured = run(found, {"logits": logits, "labels": labels}, tolerance=TOLERANCE,
                       rounds=args.rounds)  # fmt: skip
        samples = measured.samples[args.threads]
        for implementation, timed in samples.items():
            p20, median, p80 = quantiles(timed.full)
            ratios = measured.ratios(args.threads, implementation)
            row = {
                **provenance(device, compiled=False),
                "vocabulary": name,
                "kind": implementation,
                "rows": args.rows,
                "vocab_size": args.vocab,
                "threads": args.threads,
                "median_ms": median,
                "p20_ms": p20,
                "p80_ms": p80,
                "ratio_to_was": median / samples["was"].median_ms(),
                "ratio_to_cross_entropy": ratios["F.cross_entropy"],
                "ratios_to_anchors": ratios,
                "check_relative_error": measured.errors[implementation],
                "samples_ms": [1e3 * t for t in timed.full],
            }
            rows.append(row)
            others = ", ".join(
                f"{anchor} {ratio:.2f}×"
                for anchor, ratio in ratios.items()
                if anchor != "F.cross_entropy"
            )
            lines.append(
                f"| {name} | {implementation} | {median:.1f} ({p20:.1f}-{p80:.1f}) | "
                f"{row['ratio_to_was']:.2f}× | {row['ratio_to_cross_entropy']:.2f}× | {others} |"
            )
    report = "\n".join(lines)
    print(report)
    stamp = rows[0]["date"][:16].replace(":", "")
    base = args.out or RESULTS / f"{stamp}-kinds-{device.type}"
    base.parent.mkdir(parents=True, exist_ok=True)
    base.with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    base.with_suffix(".md").write_text(report + "\n")


if __name__ == "__main__":
    main()
