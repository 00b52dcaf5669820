"""benchmarks/gpu.sh's ``launch`` step, a GPU acceptance test (``gpu`` marker): every kernel
variant compiles for this GPU and launches.

It runs the calls whose launches ``tests/test_fused_triton.py``'s JIT-faithful compile test
records (``_public_calls``: every kind and dtype, the reductions, one position, strided logits,
32,768 and 131,072 columns, SMMD with 1,110 number tokens, chunks of one row, torch.compile's
custom ops) with their tensors moved to the device, so that Triton's JIT compiles every variant
for this GPU and launches it (a synchronisation after each launch pins a fault to it); each
call's loss is compared with ``impl="torch"`` on the same tensors; a call that fails is recorded
and the torch backend's result stands in for it, so the calls after it still run. On CPU (gpu.sh's
dry run) the kernels run in Triton's interpreter.
"""

from __future__ import annotations

import time
import traceback
from collections import Counter
from collections.abc import Callable
from typing import Any

import gpu_common
import gpu_variants
import pytest
import torch
from gpu_common import LAUNCH_TOLERANCE, short, synchronize
from gpu_variants import describe

import test_fused_triton as suite
from _gpu import Section
from numtok.ops.kernels import triton_rows

pytestmark = pytest.mark.gpu


class _Launches:
    """Stands in for the kernels of ``triton_rows``: each launch is run, synchronised (so that a
    fault is pinned to it), timed and recorded with its specialisation."""

    def __init__(self, device: Any, helpers: Any, variants: Any) -> None:
        self.device, self.helpers, self.variants = device, helpers, variants
        self.rows: list[dict[str, Any]] = []

    def wrap(self, name: str, kernel: Any) -> Any:
        launches = self

        class Recorder:
            def __getattr__(self, attribute: str) -> Any:
                return getattr(kernel, attribute)

            def __getitem__(self, grid: Any) -> Callable[..., Any]:
                launch = kernel[grid]

                def run(*args: Any, **kwargs: Any) -> Any:
                    row: dict[str, Any] = {
                        "kernel": name,
                        "variant": launches.variants.variant(args, kwargs),
                    }
                    started = time.perf_counter()
                    try:
                        result = launch(*args, **kwargs)
                        launches.helpers.synchronize(launches.device)
                    except Exception as error:
                        row["error"] = launches.helpers.short(error, 1000)
                        raise
                    finally:
                        row["ms"] = round(1e3 * (time.perf_counter() - started), 2)
                        launches.rows.append(row)
                    return result

                return run

        return Recorder()


def _cached_binaries(kernel: Any) -> int | None:
    """The binaries in a JITFunction's cache (Triton 3.x ``device_caches``), if it has one."""
    try:
        return sum(len(entry[0]) for entry in kernel.device_caches.values())
    except Exception:
        return None


def test_every_kernel_variant_compiles_and_launches(
    gpu_device: torch.device, gpu_section: Section
) -> None:
    device = gpu_device

    recorded = _Launches(device, gpu_common, gpu_variants)
    kernels = {name: getattr(triton_rows, name) for name in suite._KERNELS}
    for name, kernel in kernels.items():
        setattr(triton_rows, name, recorded.wrap(name, kernel))
    calls: list[dict[str, Any]] = []

    def moved(value: Any) -> Any:
        return value.to(device) if isinstance(value, torch.Tensor) else value

    def checked(function: Callable[..., Any], name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            args = tuple([moved(a) for a in args])  # (no generator: torch.compile traces this)
            kwargs = {key: moved(value) for key, value in kwargs.items()}
            if torch.compiler.is_compiling():  # torch.compile's custom ops: traced, not checked
                return function(*args, **kwargs)
            first = args[0]
            row: dict[str, Any] = {
                "function": name,
                "dtype": str(first.dtype).removeprefix("torch."),
                "shape": list(first.shape),
                "settings": {
                    key: describe(value) if isinstance(value, torch.Tensor) else value
                    for key, value in kwargs.items()
                    if key != "impl"
                },
                "needs_grad": first.requires_grad,
            }
            before = len(recorded.rows)
            copies = tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args)
            try:
                with torch.no_grad():
                    reference = function(*copies, **{**kwargs, "impl": "torch"})
            except Exception as error:
                reference, row["reference_error"] = None, short(error)
            try:
                out = function(*args, **kwargs)
                synchronize(device)
            except Exception as error:
                row |= {"ok": False, "error": short(error, 1000)}
                row["launches"] = len(recorded.rows) - before
                calls.append(row)
                gpu_section(
                    [{"record": "call", **c} for c in calls],
                    [f"{len(calls)} calls so far; the last one **failed**."],
                    finished=False,
                )
                return function(*args, **{**kwargs, "impl": "torch"})
            row["launches"] = len(recorded.rows) - before
            if reference is not None:
                value, expected = out.loss.detach().double(), reference.loss.double()
                scale = float(expected.abs().max().clamp_min(1e-300))
                difference = float((value - expected).abs().max()) / scale
                row["relative_difference_to_torch"] = difference
                row["ok"] = difference <= LAUNCH_TOLERANCE[row["dtype"]]
            else:
                row["ok"] = True
            calls.append(row)
            gpu_section(
                [{"record": "call", **c} for c in calls],
                [f"{len(calls)} calls so far, {len(recorded.rows)} launches."],
                finished=False,
            )
            return out

        return call

    suite.cross_entropy_with_ntl = checked(suite.cross_entropy_with_ntl, "cross_entropy_with_ntl")
    suite.linear_cross_entropy_with_ntl = checked(
        suite.linear_cross_entropy_with_ntl, "linear_cross_entropy_with_ntl"
    )
    torch.manual_seed(0)
    started = time.perf_counter()
    aborted = None
    try:
        suite._public_calls()
        synchronize(device)
    except Exception as error:  # a fault past the calls' own handling (backward, compile)
        aborted = short(error, 1000)
        traceback.print_exc()
    seconds = time.perf_counter() - started

    launches = recorded.rows
    variants: dict[tuple[str, str], dict[str, Any]] = {}
    for row in launches:
        entry = variants.setdefault(
            (row["kernel"], row["variant"]),
            {"kernel": row["kernel"], "variant": row["variant"], "launches": 0, "errors": 0},
        )
        entry["launches"] += 1
        entry["errors"] += "error" in row
        entry.setdefault("first_launch_ms", row["ms"])  # the compilation, on a GPU
    failed_calls = [c for c in calls if not c["ok"]]
    failed_launches = [r for r in launches if "error" in r]
    binaries = {name: _cached_binaries(kernel) for name, kernel in kernels.items()}
    compile_seconds = sum(v["first_launch_ms"] for v in variants.values()) / 1e3
    slowest = max(variants.values(), key=lambda v: v["first_launch_ms"], default=None)
    worst = max(
        (c for c in calls if "relative_difference_to_torch" in c),
        key=lambda c: c["relative_difference_to_torch"] / LAUNCH_TOLERANCE[c["dtype"]],
        default=None,
    )
    per_kernel = Counter(v["kernel"] for v in variants.values())
    ok = not (failed_calls or failed_launches or aborted) and bool(launches)
    lines = [
        f"**{'passed' if ok else 'FAILED'}**: {len(calls)} calls of the public functions with "
        f'`impl="triton"` on {device} (`tests/test_fused_triton.py::_public_calls`, the calls '
        f"whose launches the JIT-faithful compile test records), {len(launches)} kernel "
        f"launches, {len(variants)} distinct variants (kernel × the JIT's specialisation of the "
        f"arguments: "
        + ", ".join(f"{k} {n}" for k, n in per_kernel.items())
        + "), "
        + (
            "binaries in Triton's cache: "
            + ", ".join(f"{k} {n}" for k, n in binaries.items() if n is not None)
            if any(n is not None for n in binaries.values())
            else "no JIT cache here (Triton's interpreter)"
        )
        + f"; {seconds:.1f} s in all, first launches (compilation and run) {compile_seconds:.1f} s"
        + (
            f", the slowest {slowest['first_launch_ms'] / 1e3:.2f} s ({slowest['kernel']})"
            if slowest
            else ""
        )
        + ".",
    ]
    if worst is not None:
        lines += [
            "",
            f'Loss against `impl="torch"` on the same tensors: every call within its dtype\'s '
            f"tolerance ({', '.join(f'{k} {v:g}' for k, v in LAUNCH_TOLERANCE.items())})"
            if not [c for c in calls if c.get("ok") is False and "error" not in c]
            else 'Loss against `impl="torch"`: **some calls differ** (below)',
        ]
        lines[-1] += (
            f"; the largest relative difference {worst['relative_difference_to_torch']:.1e} "
            f"({worst['function']}, {worst['dtype']}, {worst['shape']})."
        )
    if aborted:
        lines += ["", f"**The calls stopped** at: `{aborted}`"]
    if failed_calls:
        lines += ["", "| call | dtype | shape | settings | what failed |", "|---|---|---|---|---|"]
        for c in failed_calls:
            what = (
                c.get("error") or f"differs from torch by {c['relative_difference_to_torch']:.1e}"
            )
            lines.append(
                f"| {c['function']} | {c['dtype']} | {c['shape']} | {c['settings']} | {what} |"
            )
    if failed_launches:
        lines += ["", "Launches that raised:", ""]
        lines += [f"* `{r['kernel']}({r['variant']})`: {r['error']}" for r in failed_launches[:10]]
    rows = [{"record": "call", **c} for c in calls]
    rows += [{"record": "variant", **v} for v in variants.values()]
    rows.append(
        {
            "record": "summary",
            "ok": ok,
            "calls": len(calls),
            "failed_calls": len(failed_calls),
            "launches": len(launches),
            "variants": len(variants),
            "cached_binaries": binaries,
            "seconds": round(seconds, 2),
            "first_launch_seconds": round(compile_seconds, 2),
            "aborted": aborted,
        }
    )
    gpu_section(rows, lines, finished=True)
    assert ok, "\n".join(lines)
