"""benchmarks/gpu.sh's ``large`` and ``sanitizer`` steps, GPU acceptance tests (``gpu`` marker):
the values and gradients of the Triton paths on the device, every error ``‖a − b‖ / ‖b‖`` in
float64 (``benchmarks/runner.py``'s :class:`~runner.Residual`).

* :func:`test_large_logits_against_float64` (``large``): ``cross_entropy_with_ntl`` (Triton,
  Triton in place, ``"auto"``) at 16,384 × 152,064 bfloat16 logits (row offsets past 2^31),
  against the float64 reference computed 1,024 rows at a time: the value, the gradient over all
  rows and over the rows past 2^31.
* :func:`test_small_triton_calls_against_torch` (``sanitizer``, which gpu.sh runs under
  ``compute-sanitizer --tool memcheck`` where the machine has it): four small calls, each loss
  against ``impl="torch"``.

Each writes its rows and report section after every call (``gpu_section``: into gpu.sh's report
where it runs); with ``NUMTOK_GPU_QUICK=1`` (gpu.sh's dry run) the shapes are small.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from gpu_common import LAUNCH_TOLERANCE, NTL_WEIGHT, number_batch, short, synchronize
from runner import Residual, relative_error

from _gpu import Section
from numtok import number_token_loss
from numtok.losses.fused import cross_entropy_with_ntl
from numtok.losses.linear import linear_cross_entropy_with_ntl

pytestmark = pytest.mark.gpu

#: The large case's bounds: the value's relative error, the gradient's (bfloat16 rounding).
VALUE_BOUND, GRADIENT_BOUND = 1e-4, 1e-2


def test_large_logits_against_float64(
    gpu_device: torch.device, gpu_quick: bool, gpu_section: Section
) -> None:
    device = gpu_device
    tokens, vocab_size = (64, 40_000) if gpu_quick else (16_384, 152_064)
    upstream, chunk = 0.37, 16 if gpu_quick else 1024
    started = time.perf_counter()
    generator = torch.Generator(device).manual_seed(0)
    logits = torch.randn(
        tokens, vocab_size, device=device, dtype=torch.bfloat16, generator=generator
    ).mul_(2)
    labels, vocab = number_batch(tokens, vocab_size, 0.05, device)
    past = -(-(2**31) // vocab_size)  # the first row whose offset row * V passes 2^31
    results: dict[str, dict[str, Any]] = {}
    gradients: dict[str, torch.Tensor] = {}
    for name, impl, inplace in [
        ("triton", "triton", False),
        ("triton in place", "triton", True),
        ("auto (F.cross_entropy + number head)", "auto", False),
    ]:
        leaf = (logits.detach().clone() if inplace else logits.detach()).requires_grad_()
        began = time.perf_counter()
        try:
            out = cross_entropy_with_ntl(
                leaf, labels, vocab, impl=impl, inplace_backward=inplace, ntl_weight=NTL_WEIGHT,
                reweigh=True,
            )  # fmt: skip
            out.loss.backward(torch.full_like(out.loss, upstream))
            synchronize(device)
        except Exception as error:
            results[name] = {"error": short(error, 1000)}
            traceback.print_exc()
            continue
        results[name] = {"value": float(out.loss.detach()), "seconds": time.perf_counter() - began}
        assert leaf.grad is not None
        gradients[name] = leaf.grad
        del out, leaf
        ran = [
            {"variant": k, **{f: r[f] for f in ("value", "seconds", "error") if f in r}}
            for k, r in results.items()
        ]
        gpu_section(
            ran,
            [
                f"{tokens:,} × {vocab_size:,} bfloat16 logits: {', '.join(results)} ran; the "
                "float64 reference next."
            ],
            finished=False,
        )
    # The float64 reference, `chunk` rows at a time: mean CE over the non-ignored labels plus 0.3 x
    # the mean NTL over the number-labelled ones (the denominators of the whole batch).
    targets = float((labels != -100).sum())
    numbers = float(torch.isin(labels, vocab.ids.to(device)).sum())
    reference = 0.0
    every_row = {name: Residual() for name in gradients}
    past_2_31 = {name: Residual() for name in gradients} if past < tokens else {}
    largest = {name: [0.0, 0.0] for name in gradients}  # the largest entry error, entry
    for start in range(0, tokens, chunk):
        rows = slice(start, min(start + chunk, tokens))
        z = logits[rows].double().requires_grad_()
        ce = F.cross_entropy(z, labels[rows], reduction="sum")
        ntl = number_token_loss(z, labels[rows], vocab, reweigh=True, reduction="sum")
        part = ce / targets + NTL_WEIGHT * ntl / numbers
        (expected,) = torch.autograd.grad(part * upstream, z)
        reference += float(part)
        for name, gradient in gradients.items():
            every_row[name].add(gradient[rows], expected)
            if name in past_2_31 and past < rows.stop:
                low = max(past - start, 0)
                past_2_31[name].add(gradient[rows][low:], expected[low:])
            worst = float((gradient[rows].double() - expected).abs().max())
            entry = float(expected.abs().max())
            largest[name] = [max(largest[name][0], worst), max(largest[name][1], entry)]
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
        value_error = relative_error(
            torch.tensor(result["value"], dtype=torch.float64),
            torch.tensor(reference, dtype=torch.float64),
        )
        gradient_error = every_row[name].relative
        beyond = past_2_31[name].relative if name in past_2_31 else None
        good = value_error <= VALUE_BOUND and all(
            e <= GRADIENT_BOUND for e in (gradient_error, beyond) if e is not None
        )
        ok &= good
        lines.append(
            f"| {name} | {value_error:.1e} | {gradient_error:.1e} / "
            f"{'(none)' if beyond is None else f'{beyond:.1e}'} | "
            f"{largest[name][0]:.1e} / {largest[name][1]:.1e} | {result['seconds']:.2f} |"
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
                "gradient_relative_error": gradient_error,
                "gradient_relative_error_past_2_31": beyond,
                "largest_entry_error": largest[name][0],
                "largest_entry": largest[name][1],
                "seconds": result["seconds"],
                "ok": good,
            }
        )
    peak = (
        f", peak {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB"
        if device.type == "cuda"
        else ""
    )
    lines += [
        "",
        f"Bounds: value {VALUE_BOUND:g}, gradient {GRADIENT_BOUND:g} (bfloat16 rounding); "
        f"**{'passed' if ok else 'FAILED'}** in {time.perf_counter() - started:.1f} s{peak}.",
    ]
    gpu_section(rows_out, lines, finished=True)
    assert ok, "\n".join(lines)


def test_small_triton_calls_against_torch(
    gpu_device: torch.device, gpu_quick: bool, gpu_section: Section
) -> None:
    """Four small calls of the Triton paths, for ``compute-sanitizer``, which instruments every
    launch (PyTorch's too) and so multiplies each call's time: rows on chip (4,096 columns,
    bfloat16) with reweigh and an upstream gradient of 0.5; rows in blocks (40,000, float32),
    reweigh, in place; SMMD over the 1,110 number tokens (its pair tiles); the logits-free loss
    in chunks of 8 rows with DIST2 (place weights, row offsets). Each loss against
    ``impl="torch"`` on the same tensors, within its dtype's ``LAUNCH_TOLERANCE``; the
    sanitizer's own verdict is its exit status (``--error-exitcode``)."""
    device = gpu_device
    generator = torch.Generator(device).manual_seed(0)
    rows: list[dict[str, Any]] = []
    tokens = 8 if gpu_quick else 24
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
                expected = function(*inputs, impl="torch", **plain).loss
            difference = relative_error(out.loss.detach(), expected)
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
        gpu_section(rows, section(""), finished=False)

    def logits_of(vocab_size: int, dtype: torch.dtype) -> tuple[torch.Tensor, Any, Any]:
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
    gpu_section(rows, lines, finished=True)
    assert ok, "\n".join(lines)
