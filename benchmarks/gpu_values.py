"""The value checks of ``benchmarks/gpu.sh``: ``large`` (16,384 x 152,064 bfloat16 logits against
float64) and ``small`` (a few calls under compute-sanitizer); see ``gpu_checks.py``."""

from __future__ import annotations

import argparse
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_common import (
    LAUNCH_TOLERANCE,
    NTL_WEIGHT,
    number_batch,
    short,
    synchronize,
    write,
    write_so_far,
)


def large(args: argparse.Namespace) -> int:
    import torch
    import torch.nn.functional as F

    from numtok import number_token_loss
    from numtok.losses.fused import cross_entropy_with_ntl

    device = torch.device(args.device)
    tokens, vocab_size = (64, 40_000) if args.quick else (16_384, 152_064)
    upstream, chunk = 0.37, 1024 if not args.quick else 16
    started = time.perf_counter()
    generator = torch.Generator(device).manual_seed(0)
    logits = torch.randn(
        tokens, vocab_size, device=device, dtype=torch.bfloat16, generator=generator
    ).mul_(2)
    labels, vocab = number_batch(tokens, vocab_size, 0.05, device)
    settings = {"ntl_weight": NTL_WEIGHT, "reweigh": True}
    past = -(-(2**31) // vocab_size)  # the first row whose offset row * V passes 2^31
    results: dict[str, dict[str, Any]] = {}
    gradients: dict[str, Any] = {}
    for name, impl, inplace in [
        ("triton", "triton", False),
        ("triton in place", "triton", True),
        ("auto (F.cross_entropy + number head)", "auto", False),
    ]:
        leaf = logits.detach().clone() if inplace else logits.detach()
        leaf.requires_grad_()
        began = time.perf_counter()
        try:
            out = cross_entropy_with_ntl(
                leaf, labels, vocab, impl=impl, inplace_backward=inplace, **settings
            )
            out.loss.backward(torch.full_like(out.loss, upstream))
            synchronize(device)
        except Exception as error:
            results[name] = {"error": short(error, 1000)}
            traceback.print_exc()
            continue
        results[name] = {"value": float(out.loss.detach()), "seconds": time.perf_counter() - began}
        gradients[name] = leaf.grad
        del out, leaf
        ran = [
            {"variant": k, **{f: r[f] for f in ("value", "seconds", "error") if f in r}}
            for k, r in results.items()
        ]
        write_so_far(
            Path(args.out),
            ran,
            [
                f"{tokens:,} × {vocab_size:,} bfloat16 logits: "
                f"{', '.join(results)} ran; the float64 reference "
                "next."
            ],
        )
    # The float64 reference, 1,024 rows at a time: mean CE over the non-ignored labels plus 0.3 x
    # the mean NTL over the number-labelled ones (the denominators of the whole batch).
    targets = float((labels != -100).sum())
    numbers = float(torch.isin(labels, vocab.ids.to(device)).sum())
    reference = 0.0
    sums = {name: {"all": [0.0, 0.0], "past": [0.0, 0.0], "max": [0.0, 0.0]} for name in gradients}
    for start in range(0, tokens, chunk):
        rows = slice(start, min(start + chunk, tokens))
        z = logits[rows].double().requires_grad_()
        ce = F.cross_entropy(z, labels[rows], reduction="sum")
        ntl = number_token_loss(z, labels[rows], vocab, reweigh=True, reduction="sum")
        part = ce / targets + NTL_WEIGHT * ntl / numbers
        (expected,) = torch.autograd.grad(part * upstream, z)
        reference += float(part)
        for name, gradient in gradients.items():
            difference = gradient[rows].double() - expected
            for key, first in (("all", 0), ("past", past - start)):
                if first < rows.stop - start:
                    low = max(first, 0)
                    sums[name][key][0] += float(difference[low:].square().sum())
                    sums[name][key][1] += float(expected[low:].square().sum())
            sums[name]["max"][0] = max(sums[name]["max"][0], float(difference.abs().max()))
            sums[name]["max"][1] = max(sums[name]["max"][1], float(expected.abs().max()))
        del z, expected
    rows_out, ok = [], bool(gradients) and len(gradients) == len(results)
    lines = [
        f"{tokens:,} × {vocab_size:,} bfloat16 logits ({tokens * vocab_size:.3g} entries; rows "
        f"from {past:,} on start past 2^31), 1,110 number tokens, `reweigh=True`, 5 % ignored "
        f"labels, upstream gradient {upstream}, against the float64 reference "
        f"(`F.cross_entropy` + 0.3 `number_token_loss` of the float64 logits, {chunk} rows at a "
        f"time): value {reference:.6f}.",
        "",
        "| impl | value relative error | gradient relative error: all rows / rows past 2^31 "
        "| largest entry error / largest entry | s (forward + backward, compilation included) |",
        "|---|---|---|---|---|",
    ]
    for name, result in results.items():
        if "error" in result:
            lines.append(f"| {name} | **failed**: {result['error']} | | | |")
            rows_out.append({"variant": name, **result})
            ok = False
            continue
        value_error = abs(result["value"] - reference) / abs(reference)
        s = sums[name]
        errors = [
            (s[key][0] / s[key][1]) ** 0.5 if s[key][1] else float("nan") for key in ("all", "past")
        ]
        good = value_error <= 1e-4 and all(e <= 1e-2 for e in errors if e == e)
        ok &= good
        lines.append(
            f"| {name} | {value_error:.1e} | {errors[0]:.1e} / "
            f"{'(none)' if errors[1] != errors[1] else f'{errors[1]:.1e}'} | "
            f"{s['max'][0]:.1e} / {s['max'][1]:.1e} | {result['seconds']:.2f} |"
            + ("" if good else " **off**")
        )
        rows_out.append(
            {
                "variant": name,
                "tokens": tokens,
                "vocab_size": vocab_size,
                "value": result["value"],
                "reference": reference,
                "value_relative_error": value_error,
                "gradient_relative_error": errors[0],
                "gradient_relative_error_past_2_31": errors[1],
                "largest_entry_error": s["max"][0],
                "largest_entry": s["max"][1],
                "seconds": result["seconds"],
                "ok": good,
            }
        )
    lines += [
        "",
        "Bounds: value 1e-4, gradient 1e-2 (bfloat16 rounding); "
        f"**{'passed' if ok else 'FAILED'}** in {time.perf_counter() - started:.1f} s"
        + (
            f", peak {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB."
            if device.type == "cuda"
            else "."
        ),
    ]
    write(Path(args.out), rows_out, lines)
    return 0 if ok else 1


def small(args: argparse.Namespace) -> int:
    """Four small calls of the Triton paths, for ``compute-sanitizer``, which instruments every
    launch (PyTorch's too) and so multiplies each call's time: rows on chip (4,096 columns,
    bfloat16) with reweigh and an upstream gradient of 0.5; rows in blocks (40,000, float32),
    reweigh, in place; SMMD over the 1,110 number tokens (its pair tiles); the logits-free loss
    in chunks of 8 rows with DIST2 (place weights, row offsets). Each loss against
    ``impl="torch"`` on the same tensors, each row written as its call finishes. Exits 1 when a
    call raises or differs; the sanitizer's own verdict is its exit status
    (``--error-exitcode``)."""
    import torch

    from numtok.losses.fused import cross_entropy_with_ntl
    from numtok.losses.linear import linear_cross_entropy_with_ntl

    device = torch.device(args.device)
    generator = torch.Generator(device).manual_seed(0)
    base = None if args.out is None else Path(args.out)
    rows: list[dict[str, Any]] = []
    tokens = 8 if args.quick else 24
    table = ["| call | dtype | relative difference to torch | s |", "|---|---|---|---|"]

    def section(verdict: str) -> list[str]:
        return [
            f"{verdict}{len(rows)} small calls of the Triton paths on {device} ({tokens} rows), "
            'forward and backward, each loss against `impl="torch"`.',
            "",
            *table,
        ]

    def run(
        name: str, function: Callable[..., Any], inputs: tuple[Any, ...], upstream: float = 1.0,
        **settings: Any,
    ) -> None:  # fmt: skip
        """``function(*inputs, **settings)`` with impl="triton", forward and backward, and its
        loss against impl="torch" (in place: on a copy of the logits, not in place for torch)."""
        first = inputs[0]
        row: dict[str, Any] = {"call": name, "dtype": str(first.dtype).removeprefix("torch.")}
        inplace = settings.get("inplace_backward", False)
        began = time.perf_counter()
        try:
            out = function(
                first.clone() if inplace else first, *inputs[1:], impl="triton", **settings
            )
            out.loss.backward(torch.full_like(out.loss, upstream))
            synchronize(device)
            with torch.no_grad():
                plain = {**settings, "inplace_backward": False} if inplace else settings
                expected = function(*inputs, impl="torch", **plain).loss.double()
            value = out.loss.detach().double()
            difference = float((value - expected).abs().max() / expected.abs().max())
            row |= {"relative_difference_to_torch": difference}
            row["ok"] = difference <= LAUNCH_TOLERANCE[row["dtype"]]
        except Exception as error:
            row |= {"ok": False, "error": short(error, 600)}
            traceback.print_exc()
        row["seconds"] = round(time.perf_counter() - began, 2)
        rows.append(row)
        cell = (
            f"**failed**: {row['error']}"
            if "error" in row
            else f"{row['relative_difference_to_torch']:.1e}" + ("" if row["ok"] else " **off**")
        )
        table.append(f"| {name} | {row['dtype']} | {cell} | {row['seconds']} |")
        write_so_far(base, rows, section(""))

    def logits_of(vocab_size: int, dtype: Any) -> tuple[Any, Any, Any]:
        labels, vocab = number_batch(tokens, vocab_size, 0.2, device)
        logits = torch.randn(tokens, vocab_size, device=device, dtype=dtype, generator=generator)
        return logits.requires_grad_(), labels, vocab

    logits, labels, vocab = logits_of(4096, torch.bfloat16)
    run(
        "cross_entropy_with_ntl V=4096 (on chip) reweigh, upstream 0.5",
        cross_entropy_with_ntl,
        (logits, labels, vocab),
        0.5,
        reweigh=True,
    )
    run(
        "cross_entropy_with_ntl V=4096 kind=smmd (1,110 number tokens)",
        cross_entropy_with_ntl,
        (logits.detach().clone().requires_grad_(), labels, vocab),
        kind="smmd",
    )
    logits, labels, vocab = logits_of(40_000, torch.float32)
    run(
        "cross_entropy_with_ntl V=40000 (in blocks) reweigh, inplace_backward, upstream 0.5",
        cross_entropy_with_ntl,
        (logits, labels, vocab),
        0.5,
        reweigh=True,
        inplace_backward=True,
    )
    hidden = torch.randn(tokens, 64, device=device, generator=generator).requires_grad_()
    weight = torch.randn(40_000, 64, device=device, generator=generator).requires_grad_()
    run(
        "linear_cross_entropy_with_ntl V=40000 H=64 chunk_size=8 kind=dist2",
        linear_cross_entropy_with_ntl,
        (hidden, weight, labels, vocab),
        chunk_size=8,
        kind="dist2",
    )
    ok = all(row["ok"] for row in rows)
    lines = section("**passed**: " if ok else "**FAILED**: ")
    if base is not None:
        write(base, rows, lines)
    else:
        print("\n".join(lines))
    return 0 if ok else 1
