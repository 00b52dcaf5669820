"""The checks of ``benchmarks/gpu.sh`` that are not timings: each writes ``BASE.jsonl`` (its rows)
and ``BASE.md`` (its section of the report) and exits 1 when something it checks fails.

    python benchmarks/gpu_checks.py setup --wheels DIR --site DIR --out BASE  # wheels, versions
    python benchmarks/gpu_checks.py launch --device cuda --out BASE  # (a) every launch, for real
    python benchmarks/gpu_checks.py large --device cuda --out BASE   # (b) 16,384 x 152,064 bf16
    python benchmarks/gpu_checks.py small --device cuda              # (b) under compute-sanitizer
    python benchmarks/gpu_checks.py sync --device cuda --out BASE    # (c) a training step, no syncs
    python benchmarks/gpu_checks.py report --work DIR --out BASE     # gpu.sh's report so far

``setup`` installs the wheels of ``--wheels`` whose distribution is not installed at that version
(``pip install --no-index --no-deps --target SITE``: the GPU machine has no package index; SITE is
on gpu.sh's PYTHONPATH) and records the versions, the GPU and what imports.

``launch`` runs the calls whose launches ``tests/test_fused_triton.py``'s JIT-faithful compile test
records (``_public_calls``: every kind and dtype, the reductions, one position, strided logits,
32,768 and 131,072 columns, SMMD with 1,110 number tokens, chunks of one row, torch.compile's
custom ops) with their tensors moved to the device, so that Triton's JIT compiles every variant
for this GPU and launches it (a synchronisation after each launch pins a fault to it); each call's
loss is compared with ``impl="torch"`` on the same tensors; a call that fails is recorded and the
torch backend's result stands in for it, so the calls after it still run.

``large``: ``cross_entropy_with_ntl`` (``impl="triton"``, in place, and the default ``"auto"``) at
16,384 x 152,064 bfloat16 logits (2.49e9 entries: row offsets past 2^31), 1,110 number tokens,
``reweigh=True``, 5 % ignored labels, an upstream gradient of 0.37, against the float64
reference (``F.cross_entropy`` + 0.3 ``number_token_loss`` of the float64 logits, 1,024 rows at a
time): the value, and the gradient's relative error over all rows and over the rows past 2^31.

``sync``: a training step (forward, the loss, backward, gradient clipping, AdamW) of a small random
Llama per way of computing the loss, the step once under ``set_sync_debug_mode("warn")`` (every
synchronising call recorded with where it came from) and, for ``impl="triton"``, numtok's loss
and backward under ``set_sync_debug_mode("error")``.

``report``: from gpu.sh's work folder (``steps.jsonl``, a line per step; each step's ``.md``,
``.jsonl``, ``.out`` and ``.err``), ``BASE.md`` (the steps' table, the targets of
``gpu_targets.py``, each step's section), ``BASE.jsonl`` (every step's status and rows, each row
tagged with its step) and ``BASE-log.txt`` (the end of each step's output); gpu.sh runs it after
every step. It imports no torch.

``--quick`` (and ``--device cpu``, where the Triton kernels run in Triton's interpreter): small
shapes, for gpu.sh's dry run.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
NTL_WEIGHT = 0.3
FIRST_TEXT_ID = 1210  # ids 100..1209: the 1-3-digit number tokens of bench_kinds.vocabularies
#: The relative difference of the loss allowed between impl="triton" and impl="torch".
LAUNCH_TOLERANCE = {"float64": 1e-9, "float32": 1e-5, "bfloat16": 1e-3, "float16": 1e-3}


def write(base: Path, rows: list[dict[str, Any]], lines: list[str], echo: bool = True) -> None:
    base.parent.mkdir(parents=True, exist_ok=True)
    base.with_suffix(".jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    base.with_suffix(".md").write_text("\n".join(lines) + "\n")
    if echo:
        print("\n".join(lines))


def synchronize(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def short(error: BaseException, limit: int = 400) -> str:
    text = f"{type(error).__name__}: {error}".strip().replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ------------------------------------------------------------------ setup


def wheel_distribution(path: Path) -> tuple[str, str]:
    """(distribution, version) of a wheel's file name, the name normalised as PEP 503 does."""
    name, version = path.name.split("-")[:2]
    return re.sub(r"[-_.]+", "-", name).lower(), version


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def install_wheels(wheels: Path, site: Path) -> dict[str, list[str]]:
    """Install the wheels whose distribution is not installed at that version into ``site``."""
    found = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    chosen, present = [], []
    for path in found:
        distribution, version = wheel_distribution(path)
        if installed_version(distribution) == version:
            present.append(f"{distribution} {version}")
        else:
            chosen.append(path)
    result = {"installed": [], "present": present, "failed": []}
    if chosen:
        site.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps"]
        command += ["--no-compile", "--no-cache-dir", "--disable-pip-version-check"]
        command += ["--target", str(site), *map(str, chosen)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        names = [" ".join(wheel_distribution(path)) for path in chosen]
        if done.returncode == 0:
            result["installed"] = names
        else:
            result["failed"] = names
            print(done.stdout[-2000:], done.stderr[-2000:], file=sys.stderr)
        importlib.invalidate_caches()
    return result


#: What gpu.sh's steps import beyond torch and numtok: distribution, module to import.
OPTIONAL = [
    ("transformers", "transformers"),
    ("accelerate", "accelerate"),
    ("trl", "trl"),
    ("datasets", "datasets"),
    ("liger-kernel", "liger_kernel.transformers"),
    ("cut-cross-entropy", "cut_cross_entropy"),
    ("ntloss", "ntloss"),
    ("peft", "peft"),
    ("pytest-xdist", "xdist"),
    ("pytest-timeout", "pytest_timeout"),
    ("hypothesis", "hypothesis"),
]


def setup(args: argparse.Namespace) -> int:
    wheels = install_wheels(Path(args.wheels), Path(args.site))
    import torch
    import triton
    from bench_common import numtok_source

    import numtok

    device = torch.device(args.device)
    row: dict[str, Any] = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "numtok": numtok.__version__,
        "numtok_source": numtok_source(),
        "wheels": wheels,
        "device": str(device),
    }
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        row |= {
            "gpu": properties.name,
            "capability": f"sm_{properties.major}{properties.minor}",
            "multiprocessors": properties.multi_processor_count,
            "memory_gib": round(properties.total_memory / 2**30, 1),
        }
    imports = {}
    for distribution, module in OPTIONAL:
        version = installed_version(distribution)
        try:
            importlib.import_module(module)
            imports[distribution] = version or "imported"
        except Exception as error:  # a package missing or broken here: its variants are skipped
            imports[distribution] = f"not importable ({short(error, 160)})"
    row["packages"] = imports
    gpu = row.get("gpu", "no GPU (CPU dry run)")
    lines = [
        f"Python {row['python']} (`{row['executable']}`), torch {row['torch']} (CUDA "
        f"{row['cuda']}), Triton {row['triton']}, numtok {row['numtok']} from "
        f"`{row['numtok_source']}`; {gpu}"
        + (
            f", {row['capability']}, {row['multiprocessors']} SMs, {row['memory_gib']} GiB"
            if "gpu" in row
            else ""
        )
        + ".",
        "",
        "Packages: " + "; ".join(f"{name} {value}" for name, value in imports.items()) + ".",
        "",
        f"Wheels (`{args.wheels}`): installed {', '.join(wheels['installed']) or 'none'}; "
        f"already present {', '.join(wheels['present']) or 'none'}"
        + (f"; **failed to install** {', '.join(wheels['failed'])}" if wheels["failed"] else "")
        + ".",
    ]
    write(Path(args.out), [row], lines)
    return 1 if wheels["failed"] else 0


# ------------------------------------------------------------------ (a) every launch


def _describe(value: Any) -> Any:
    """A launch argument as the JIT's specialisation sees it: a tensor's dtype and whether its
    address is divisible by 16, an int's being 1, divisible by 16 or past int32."""
    import torch

    if isinstance(value, torch.Tensor):
        aligned = "/16" if value.data_ptr() % 16 == 0 else ""
        return str(value.dtype).removeprefix("torch.") + aligned
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        if value == 1:
            return "1"
        return ("i64" if abs(value) >= 2**31 else "i32") + ("/16" if value % 16 == 0 else "")
    if isinstance(value, float):
        return "f32"
    return getattr(value, "name", repr(value))  # tl dtypes, constexprs


class _Launches:
    """Stands in for the kernels of ``triton_rows``: each launch is run, synchronised (so that a
    fault is pinned to it), timed and recorded with its specialisation."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.rows: list[dict[str, Any]] = []

    def wrap(self, name: str, kernel: Any) -> Any:
        launches = self

        class Recorder:
            def __getattr__(self, attribute: str) -> Any:
                return getattr(kernel, attribute)

            def __getitem__(self, grid: Any) -> Callable[..., Any]:
                launch = kernel[grid]

                def run(*args: Any, **kwargs: Any) -> Any:
                    variant = ", ".join(
                        [_describe(a) for a in args]
                        + [f"{k}={_describe(v)}" for k, v in sorted(kwargs.items())]
                    )
                    row: dict[str, Any] = {"kernel": name, "variant": variant}
                    started = time.perf_counter()
                    try:
                        result = launch(*args, **kwargs)
                        synchronize(launches.device)
                    except Exception as error:
                        row["error"] = short(error, 1000)
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


def launch(args: argparse.Namespace) -> int:
    import torch

    device = torch.device(args.device)
    sys.path.insert(0, str(TESTS))
    import test_fused_triton as suite
    from numtok.kernels import triton_rows

    recorded = _Launches(device)
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
                    key: _describe(value) if isinstance(value, torch.Tensor) else value
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
    write(Path(args.out), rows, lines)
    return 0 if ok else 1


# ------------------------------------------------------------------ (b) the large case


def _number_batch(tokens: int, vocab_size: int, ignored: float, device: Any) -> tuple[Any, Any]:
    """(labels, vocab): 10 % of the labels among the 1,110 number tokens (ids 100..1209), a share
    ``ignored`` of them -100, the rest text ids."""
    import torch
    from bench_kinds import vocabularies

    vocab = vocabularies(vocab_size)["1-3-digit chunks (1,110)"]
    generator = torch.Generator().manual_seed(1)
    choice = torch.rand(tokens, generator=generator)
    numbers = vocab.ids[torch.randint(len(vocab), (tokens,), generator=generator)]
    text = torch.randint(FIRST_TEXT_ID, vocab_size, (tokens,), generator=generator)
    labels = torch.where(choice < 0.1, numbers, text)
    labels = torch.where(choice >= 1 - ignored, torch.full_like(labels, -100), labels)
    return labels.to(device), vocab


def large(args: argparse.Namespace) -> int:
    import torch
    import torch.nn.functional as F

    from numtok import number_token_loss
    from numtok.fused import cross_entropy_with_ntl

    device = torch.device(args.device)
    tokens, vocab_size = (64, 40_000) if args.quick else (16_384, 152_064)
    upstream, chunk = 0.37, 1024 if not args.quick else 16
    started = time.perf_counter()
    generator = torch.Generator(device).manual_seed(0)
    logits = torch.randn(
        tokens, vocab_size, device=device, dtype=torch.bfloat16, generator=generator
    ).mul_(2)
    labels, vocab = _number_batch(tokens, vocab_size, 0.05, device)
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
    """A few small calls of every Triton path, for ``compute-sanitizer``: rows on chip (4,096
    columns) and in blocks (40,000), reweigh, in place, an upstream gradient of 0.5, SMMD and
    DIST2 over the 1,110 number tokens, float32 and bfloat16, the logits-free loss in chunks;
    each loss against ``impl="torch"`` on the same tensors. Exits 1 when a call raises or
    differs; the sanitizer's own verdict is its exit status (``--error-exitcode``)."""
    import torch

    from numtok.fused import cross_entropy_with_ntl
    from numtok.linear import linear_cross_entropy_with_ntl

    device = torch.device(args.device)
    generator = torch.Generator(device).manual_seed(0)
    rows: list[dict[str, Any]] = []

    def run(
        name: str, function: Callable[..., Any], inputs: tuple[Any, ...], upstream: float = 1.0,
        **settings: Any,
    ) -> None:  # fmt: skip
        """``function(*inputs, **settings)`` with impl="triton", forward and backward, and its
        loss against impl="torch" (in place: on a copy of the logits, not in place for torch)."""
        first = inputs[0]
        row: dict[str, Any] = {"call": name, "dtype": str(first.dtype).removeprefix("torch.")}
        inplace = settings.get("inplace_backward", False)
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
        rows.append(row)

    tokens = 8 if args.quick else 24  # (quick: the dry run's interpreter, SMMD and DIST2 once)
    for vocab_size, dtype in [(4096, torch.bfloat16), (40_000, torch.float32)]:
        labels, vocab = _number_batch(tokens, vocab_size, 0.2, device)
        logits = torch.randn(tokens, vocab_size, device=device, dtype=dtype, generator=generator)
        for inplace in (False, True):
            leaf = logits.clone().requires_grad_()
            name = f"cross_entropy_with_ntl V={vocab_size} reweigh, upstream 0.5"
            name += ", inplace_backward" if inplace else ""
            run(
                name, cross_entropy_with_ntl, (leaf, labels, vocab), 0.5, reweigh=True,
                inplace_backward=inplace,
            )  # fmt: skip
        for kind in ("smmd", "dist2") if not (args.quick and vocab_size > 4096) else ():
            leaf = logits.clone().requires_grad_()
            name = f"cross_entropy_with_ntl V={vocab_size} kind={kind}"
            run(name, cross_entropy_with_ntl, (leaf, labels, vocab), kind=kind)
        hidden = torch.randn(tokens, 64, device=device, dtype=dtype, generator=generator)
        weight = torch.randn(vocab_size, 64, device=device, dtype=dtype, generator=generator)
        hidden.requires_grad_(), weight.requires_grad_()
        name = f"linear_cross_entropy_with_ntl V={vocab_size} H=64 chunk_size=8 kind=mse"
        run(
            name, linear_cross_entropy_with_ntl, (hidden, weight, labels, vocab), chunk_size=8,
            kind="mse",
        )  # fmt: skip
    ok = all(row["ok"] for row in rows)
    lines = [
        f"**{'passed' if ok else 'FAILED'}**: {len(rows)} small calls of the Triton paths on "
        f"{device} ({tokens} rows; 4,096 columns in bfloat16, on chip, and 40,000 in float32, in "
        "blocks; reweigh, in place, an upstream gradient of 0.5, SMMD and DIST2 over 1,110 "
        f"number tokens{' (at 4,096 columns only)' if args.quick else ''}, the logits-free loss "
        "in chunks of 8 rows), forward and backward, each "
        'loss against `impl="torch"`.',
        "",
        "| call | dtype | relative difference to torch |",
        "|---|---|---|",
    ]
    for row in rows:
        cell = (
            f"**failed**: {row['error']}"
            if "error" in row
            else f"{row['relative_difference_to_torch']:.1e}" + ("" if row["ok"] else " **off**")
        )
        lines.append(f"| {row['call']} | {row['dtype']} | {cell} |")
    if args.out is not None:
        write(Path(args.out), rows, lines)
    else:
        print("\n".join(lines))
    return 0 if ok else 1


# ------------------------------------------------------------------ (c) no host synchronisation


def _site(stack: traceback.StackSummary) -> tuple[str, bool]:
    """Where a synchronising call came from: the innermost frame outside torch, the warnings
    machinery and this file (else the innermost torch frame), and whether numtok is on the
    stack."""
    package = str(Path(importlib.import_module("numtok").__file__ or "").parent) + os.sep
    numtok = any(frame.filename.startswith(package) for frame in stack)
    frames = [
        frame
        for frame in reversed(stack)
        if not frame.filename.endswith(("warnings.py", "contextlib.py"))
    ]
    outside = [
        frame
        for frame in frames
        if f"{os.sep}torch{os.sep}" not in frame.filename and frame.filename != __file__
    ]
    if not (outside or frames):
        return "(unknown)", numtok
    frame = (outside or frames)[0]
    parts = Path(frame.filename).parts
    where = "/".join(parts[-2:]) if len(parts) > 1 else frame.filename
    return f"{where}:{frame.lineno} ({frame.name})", numtok


@contextlib.contextmanager
def sync_warnings(on_cuda: bool) -> Iterator[list[tuple[str, bool]]]:
    """Under ``set_sync_debug_mode("warn")``, the site of every synchronising call."""
    import torch

    sites: list[tuple[str, bool]] = []
    if not on_cuda:
        yield sites
        return
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        previous = warnings.showwarning

        def record(message: Any, *rest: Any, **kwargs: Any) -> None:
            if "synchroniz" in str(message):
                sites.append(_site(traceback.extract_stack()[:-1]))
            else:
                previous(message, *rest, **kwargs)

        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield sites
        finally:
            torch.cuda.set_sync_debug_mode("default")


def sync(args: argparse.Namespace) -> int:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from numtok import NumberVocab
    from numtok.fused import cross_entropy_with_ntl
    from numtok.hf import patch_model
    from numtok.linear import linear_cross_entropy_with_ntl

    device = torch.device(args.device)
    on_cuda = device.type == "cuda"
    # (quick: 64 positions, for the dry run's interpreter, which runs a program per row)
    vocab_size, batch, sequence = (4096, 2, 32) if args.quick else (32_768, 4, 512)
    vocab = NumberVocab.from_values({100 + d: str(d) for d in range(10)}, vocab_size=vocab_size)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    dtype = torch.bfloat16 if on_cuda else torch.float32

    def model_() -> Any:
        torch.manual_seed(0)
        with torch.device(device):
            return LlamaForCausalLM(config).to(dtype)

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(110, vocab_size, (batch, sequence), generator=generator)
    digits = 100 + torch.randint(10, ids.shape, generator=generator)
    ids = torch.where(torch.rand(ids.shape, generator=generator) < 0.1, digits, ids).to(device)
    count = torch.tensor(ids.numel() - ids.shape[0], device=device)  # shifted: one less a row

    def fused(model: Any, impl: str, **extra: Any) -> Any:
        logits = model(input_ids=ids).logits
        return cross_entropy_with_ntl(logits, ids, vocab, shift=True, impl=impl, **extra).loss

    def logits_free(model: Any, impl: str, **extra: Any) -> Any:
        hidden = model.model(input_ids=ids).last_hidden_state
        weight = model.lm_head.weight
        out = linear_cross_entropy_with_ntl(
            hidden, weight, ids, vocab, shift=True, impl=impl, **extra
        )
        return out.loss

    def loss_only(model: Any, route: str, num_items: Any) -> Callable[[], Any]:
        """numtok's loss and its backward alone, on leaves computed before (the strict check)."""
        with torch.no_grad():
            hidden = model.model(input_ids=ids).last_hidden_state
        hidden = hidden.detach().requires_grad_()
        weight = model.lm_head.weight.detach().clone().requires_grad_()
        if route == "logits":
            logits = (hidden @ weight.T).detach().requires_grad_()
            return lambda: cross_entropy_with_ntl(
                logits, ids, vocab, shift=True, impl="triton", num_items_in_batch=num_items
            ).loss.backward()
        return lambda: linear_cross_entropy_with_ntl(
            hidden, weight, ids, vocab, shift=True, impl="triton", num_items_in_batch=num_items
        ).loss.backward()

    model = model_()
    patched = patch_model(model_(), vocab, ntl_weight=NTL_WEIGHT)
    routes: dict[str, tuple[Any, Callable[[Any], Any], str | None]] = {
        'logits, impl="triton"': (model, lambda m: fused(m, "triton"), "logits"),
        'logits-free, impl="triton"': (model, lambda m: logits_free(m, "triton"), "logits-free"),
        'logits, impl="triton", num_items_in_batch': (
            model, lambda m: fused(m, "triton", num_items_in_batch=count), None
        ),
        'logits, impl="auto"': (model, lambda m: fused(m, "auto"), None),
        'logits-free, impl="auto"': (model, lambda m: logits_free(m, "auto"), None),
        "patch_model (defaults)": (patched, lambda m: m(input_ids=ids, labels=ids).loss, None),
    }  # fmt: skip
    optimizers = {id(m): torch.optim.AdamW(m.parameters(), lr=1e-4) for m in (model, patched)}

    def step(m: Any, loss_of: Callable[[Any], Any]) -> Any:
        loss = loss_of(m)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        optimizers[id(m)].step()
        optimizers[id(m)].zero_grad(set_to_none=True)
        return loss

    rows, ok = [], True
    lines = [
        f"A training step (forward, loss, backward, `clip_grad_norm_`, AdamW) of a random Llama "
        f"(2 layers, hidden 256, V = {vocab_size:,}, {dtype}, batch {batch} × {sequence}) on "
        f"{device}, after one warm-up step, under "
        '`torch.cuda.set_sync_debug_mode("warn")`: the '
        "synchronising calls and where they come from (one in backward is replayed where "
        "`backward()` was called, so it is not counted as numtok's: the strict check catches "
        'it); then numtok\'s loss and backward alone under `"error"` (Triton routes).',
        "",
        "| route | loss | syncs in the step | of them in numtok | where | numtok alone under "
        '"error" | s (two steps) |',
        "|---|---|---|---|---|---|---|",
    ]
    for name, (m, loss_of, strict) in routes.items():
        row: dict[str, Any] = {"route": name}
        began = time.perf_counter()
        try:
            step(m, loss_of)  # warm-up: constants built, kernels compiled
            synchronize(device)
            with sync_warnings(on_cuda) as sites:
                loss = step(m, loss_of)
            row["loss"] = float(loss.detach())
        except Exception as error:
            row["error"] = short(error, 600)
            traceback.print_exc()
            lines.append(f"| {name} | **failed**: {row['error']} | | | | | |")
            rows.append(row)
            ok = False
            write(Path(args.out), rows, [*lines, "", "(still running)"], echo=False)
            continue
        row["seconds"] = round(time.perf_counter() - began, 2)
        row["syncs"] = len(sites)
        row["numtok_syncs"] = sum(1 for _, in_numtok in sites if in_numtok)
        row["sites"] = dict(Counter(site for site, _ in sites))
        strict_cell = "–"
        if strict is not None and on_cuda:
            try:
                for num_items in (None, count):
                    run = loss_only(m, strict, num_items)
                    synchronize(device)
                    torch.cuda.set_sync_debug_mode("error")
                    try:
                        run()
                    finally:
                        torch.cuda.set_sync_debug_mode("default")
                row["strict"] = "passed"
                strict_cell = "passed (num_items_in_batch None and a tensor)"
            except Exception as error:
                row["strict"] = short(error, 600)
                site = _site(traceback.extract_tb(error.__traceback__))[0]
                strict_cell = f"**raised** at {site}: {row['strict']}"
                ok = False
        elif strict is not None:
            strict_cell = "(CUDA only)"
        if "triton" in name and row["numtok_syncs"]:
            ok = False
        where = "; ".join(f"{site} ×{n}" for site, n in row["sites"].items()) or "–"
        syncs = row["syncs"] if on_cuda else "(CUDA only)"
        lines.append(
            f"| {name} | {row['loss']:.4f} | {syncs} | {row['numtok_syncs']} | {where} | "
            f"{strict_cell} | {row['seconds']:.1f} |"
        )
        rows.append(row)
        print(f"sync: {name}: {row['seconds']:.1f} s", file=sys.stderr, flush=True)
        write(Path(args.out), rows, [*lines, "", "(still running)"], echo=False)
    lines += [
        "",
        f"**{'passed' if ok else 'FAILED'}** (no synchronisation from numtok on the Triton "
        "routes, in the step and alone; the other routes' synchronisations are listed, not "
        "judged).",
    ]
    write(Path(args.out), rows, lines)
    return 0 if ok else 1


# ------------------------------------------------------------------ the report


def _read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a line cut short by a time limit
            rows.append(json.loads(line))
    return rows


def _tail(path: Path, lines: int) -> list[str]:
    if not path.is_file():
        return []
    return path.read_text(errors="replace").splitlines()[-lines:]


#: The outcome of the pytest step, from its closing line.
PYTEST_COUNTS = re.compile(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed)")


def _pytest_row(lines: list[str]) -> dict[str, Any]:
    for line in reversed(lines):
        counts = PYTEST_COUNTS.findall(line)
        if counts and (" in " in line or line.startswith("=")):
            return {word.rstrip("s") if word == "errors" else word: int(n) for n, word in counts}
    return {}


def _section(work: Path, step: dict[str, Any]) -> list[str]:
    """A step's part of the report: its heading and status, what it wrote (``<step>.md``), and
    where it did not complete or its output is the result, the end of its log."""
    name, status = step["step"], step["status"]
    took = f"{step['seconds']} s of its {step['limit']} s" if status != "skipped" else ""
    lines = [f"## {step['title']}: {status}" + (f" ({took})" if took else ""), ""]
    if step.get("note"):
        lines += [step["note"], ""]
    lines += [f"`{step['command']}`", ""] if step.get("command") else []
    section = work / f"{name}.md"
    if section.is_file():
        lines += [section.read_text().rstrip(), ""]
    out, err = work / f"{name}.out", work / f"{name}.err"
    if name == "tests":
        lines += ["```", *_tail(out, 25), "```", ""]
    if name == "sanitizer":
        verdict = [line for line in _tail(out, 400) if line.startswith("=========")]
        if verdict:
            lines += ["compute-sanitizer:", "", "```", *verdict[-30:], "```", ""]
    if status not in ("completed", "skipped"):
        lines += [f"End of the {name} step's log:", "", "```", *_tail(err, 20), "```", ""]
    return lines


def report(args: argparse.Namespace) -> int:
    """The report of gpu.sh so far, from its work folder: ``BASE.md`` (a table of the steps, the
    targets, then each step's section), ``BASE.jsonl`` (every step's status and rows, each row
    with its step) and ``BASE-log.txt`` (the end of each step's output)."""
    from gpu_targets import linear_targets, logits_targets, trainer_targets

    work = Path(args.work)
    steps = _read_rows(work / "steps.jsonl")
    setup_row = next(iter(_read_rows(work / "setup.jsonl")), {})
    machine = setup_row.get("gpu") or (
        "CPU (a dry run)" if setup_row.get("device") == "cpu" else "(set-up not run)"
    )
    state = (
        "finished"
        if args.finished
        else "still running (the steps below the last one listed have not run yet)"
    )
    lines = [
        f"# numtok on {machine}: `benchmarks/gpu.sh`, "
        f"{time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}",
        "",
        f"{args.elapsed} s of its {args.budget}-second budget, {state}. Each step runs under its "
        "own time limit; a step stopped at its limit keeps what it wrote until then.",
        "",
        "| step | status | s | limit s |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {s['title']} | {s['status']} | {'–' if s.get('seconds') is None else s['seconds']} "
        f"| {s.get('limit', '')} |"
        for s in steps
    ]
    loss_rows = _read_rows(work / "loss.jsonl")
    trainer_rows = _read_rows(work / "trainer.jsonl")
    try:
        targets = logits_targets(loss_rows) + linear_targets(loss_rows)
        targets += trainer_targets(trainer_rows)
    except Exception as error:
        targets = [f"| (the targets could not be read: {short(error)}) | | | | |"]
    lines += ["", "## Targets (`benchmarks/gpu_targets.py`, the timing rows below)", ""]
    lines += (
        ["| target | case | measured | bound | holds |", "|---|---|---|---|---|", *targets]
        if targets
        else ["(no timing rows yet)"]
    )
    lines.append("")
    rows: list[dict[str, Any]] = []
    log: list[str] = []
    for step in steps:
        name = step["step"]
        try:
            lines += _section(work, step)
        except Exception as error:  # one step's odd files do not cost the rest of the report
            lines += [f"## {step.get('title', name)}: its section failed: {short(error)}", ""]
        rows.append({"record": "step", **step})
        step_rows = _read_rows(work / f"{name}.jsonl")
        if name == "tests":
            step_rows = [_pytest_row(_tail(work / "tests.out", 40))]
        rows += [{"step": name, **row} for row in step_rows if row]
        log += [f"===== {name}: {step['status']} =====", f"$ {step.get('command', '')}"]
        for stream in ("out", "err"):
            log += [f"----- std{stream} (the last {args.log_lines} lines) -----"]
            log += _tail(work / f"{name}.{stream}", args.log_lines)
        log.append("")
    base = Path(args.out)
    base.parent.mkdir(parents=True, exist_ok=True)
    base.with_suffix(".md").write_text("\n".join(lines).rstrip() + "\n")
    base.with_suffix(".jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    base.with_name(base.name + "-log.txt").write_text("\n".join(log) + "\n")
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("check", choices=["setup", "launch", "large", "small", "sync", "report"])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", help="BASE: writes BASE.jsonl and BASE.md")
    parser.add_argument("--quick", action="store_true", help="small shapes (gpu.sh's dry run)")
    parser.add_argument("--wheels", default="benchmarks/wheels", help="setup: the wheels' folder")
    parser.add_argument("--site", help="setup: where the wheels are installed (on PYTHONPATH)")
    parser.add_argument(
        "--work", help="report: gpu.sh's work folder (steps.jsonl, each step's files)"
    )
    parser.add_argument("--elapsed", type=int, default=0, help="report: seconds since gpu.sh began")
    parser.add_argument("--budget", type=int, default=480, help="report: gpu.sh's budget, seconds")
    parser.add_argument("--finished", action="store_true", help="report: gpu.sh has finished")
    parser.add_argument("--log-lines", type=int, default=200, help="report: per step and stream")
    args = parser.parse_args()
    if args.device == "cpu":  # the Triton kernels in Triton's interpreter, read at their import
        os.environ.setdefault("TRITON_INTERPRET", "1")
        # numpy's warnings where a kernel means log(0) = -inf (masked rows), as pyproject's
        warnings.filterwarnings("ignore", category=RuntimeWarning, module="triton.runtime")
    if args.check != "small" and args.out is None:
        parser.error(f"{args.check} needs --out")
    if args.check == "setup" and args.site is None:
        parser.error("setup needs --site")
    if args.check == "report" and args.work is None:
        parser.error("report needs --work")
    check = {"setup": setup, "launch": launch, "large": large, "small": small, "sync": sync}
    check["report"] = report
    sys.exit(check[args.check](args))


if __name__ == "__main__":
    main()
