"""What each number loss costs in the fused pass: ``cross_entropy_with_ntl`` forward + backward
with ``kind`` = was, del, smmd, dist2, against ``F.cross_entropy`` alone on the same logits, on a
digit vocabulary (10 number tokens) and on Llama-3's 1–3-digit chunks (1,110 number tokens).

Logits (N, V) float32, 10 % of the labels number tokens; every case is timed in each of
``--rounds`` interleaved rounds and the median reported, with each kind's time as a multiple of
NTL-WAS's (the kinds differ only in the per-row terms of the K number logits) and of
``F.cross_entropy``'s.

Usage: ``python benchmarks/bench_kinds.py [--rows 4096] [--vocab 32768] [--rounds 5]
[--threads 2] [--device cpu] [--out PATH] [--quick]``; prints a Markdown table and writes
``PATH.{jsonl,md}`` (default ``benchmarks/results/<date>-kinds-<device>``). On CUDA the fused
path of every kind is the Triton row kernel (``impl="triton"``, opt-in) and the logits are drawn
on the device. ``--quick``: 256 × 4,096, 2 rounds (a dry run of ``benchmarks/gpu.sh``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from bench_common import provenance

from numtok import NumberVocab, cross_entropy_with_ntl

KINDS = ("was", "del", "smmd", "dist2")
RESULTS = Path(__file__).resolve().parent / "results"


def vocabularies(vocab_size: int) -> dict[str, NumberVocab]:
    """The number tokens at ids 100…: the ten digits, or every 1-, 2- and 3-digit string."""
    chunks: dict[int, str] = {}
    for width in (1, 2, 3):
        for value in range(10**width):
            chunks[100 + len(chunks)] = f"{value:0{width}d}"
    digits = {100 + d: str(d) for d in range(10)}
    return {
        "digits (10)": NumberVocab.from_values(digits, vocab_size=vocab_size),
        "1-3-digit chunks (1,110)": NumberVocab.from_values(chunks, vocab_size=vocab_size),
    }


def step_seconds(
    logits: torch.Tensor, labels: torch.Tensor, vocab: NumberVocab, kind: str | None
) -> float:
    """One forward + backward from a fresh leaf; ``kind=None`` is F.cross_entropy alone."""
    leaf = logits.detach().requires_grad_()
    if leaf.device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    if kind is None:
        loss = F.cross_entropy(leaf, labels)
    else:
        impl = "triton" if leaf.device.type == "cuda" else "auto"
        out = cross_entropy_with_ntl(leaf, labels, vocab, ntl_weight=0.3, kind=kind, impl=impl)
        loss = out.loss
    loss.backward()
    if leaf.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


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
    is_number = torch.rand(args.rows, generator=generator) < 0.1
    rows: list[dict[str, Any]] = []
    lines = [
        f"`python benchmarks/bench_kinds.py --rows {args.rows} --vocab {args.vocab} --rounds "
        f"{args.rounds} --threads {args.threads} --device {args.device}`: forward + backward, "
        f"{args.rows} × {args.vocab:,} float32 logits, 10 % number labels, medians of "
        f"{args.rounds} interleaved rounds",
        "",
        "| vocabulary | kind | median ms | × NTL-WAS | × F.cross_entropy |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, vocab in vocabularies(args.vocab).items():
        numbers = vocab.ids[torch.randint(len(vocab), (args.rows,), generator=generator)]
        text = torch.randint(
            int(vocab.ids.max()) + 1, args.vocab, (args.rows,), generator=generator
        )
        labels = torch.where(is_number, numbers, text).to(device)
        cases: list[str | None] = [None, *KINDS]
        for kind in cases:  # warm-up
            step_seconds(logits, labels, vocab, kind)
        samples: dict[str | None, list[float]] = {kind: [] for kind in cases}
        for _ in range(args.rounds):
            for kind in cases:
                samples[kind].append(step_seconds(logits, labels, vocab, kind))
        medians = {kind: statistics.median(times) for kind, times in samples.items()}
        for kind in cases:
            row = {
                **provenance(device, compiled=False),
                "vocabulary": name,
                "kind": kind or "F.cross_entropy",
                "rows": args.rows,
                "vocab_size": args.vocab,
                "threads": args.threads,
                "median_ms": 1e3 * medians[kind],
                "ratio_to_was": medians[kind] / medians["was"],
                "ratio_to_cross_entropy": medians[kind] / medians[None],
                "samples_ms": [1e3 * t for t in samples[kind]],
            }
            rows.append(row)
            lines.append(
                f"| {name} | {row['kind']} | {row['median_ms']:.1f} | "
                f"{row['ratio_to_was']:.2f}× | {row['ratio_to_cross_entropy']:.2f}× |"
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
