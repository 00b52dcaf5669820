"""The checks of ``benchmarks/gpu.sh`` that are not timings: each writes ``BASE.jsonl`` (its rows)
and ``BASE.md`` (its section of the report), rewritten after every case, and exits 1 when
something it checks fails.

    python benchmarks/gpu_checks.py setup --wheels DIR --site DIR --out BASE  # wheels, versions
    python benchmarks/gpu_checks.py launch --device cuda --out BASE  # (a) every launch, for real
    python benchmarks/gpu_checks.py large --device cuda --out BASE   # (b) 16,384 x 152,064 bf16
    python benchmarks/gpu_checks.py small --device cuda              # (b) under compute-sanitizer
    python benchmarks/gpu_checks.py sync --device cuda --out BASE    # (c) a step's synchronisations
    python benchmarks/gpu_checks.py report --work DIR --out BASE     # gpu.sh's report so far
    python benchmarks/gpu_checks.py estimate --work DIR              # the dry run's estimates

``setup`` installs the wheels of ``--wheels`` whose distribution is not installed at that version
(``pip install --no-index --no-deps --target SITE``: the GPU machine has no package index; SITE is
on gpu.sh's PYTHONPATH), records the versions, the GPU, what imports (and how long the imports
take) and ``pip show`` of what the TRL step imports.

``launch`` runs the calls whose launches ``tests/test_fused_triton.py``'s JIT-faithful compile test
records (``_public_calls``: every kind and dtype, the reductions, one position, strided logits,
32,768 and 131,072 columns, SMMD with 1,110 number tokens, chunks of one row, torch.compile's
custom ops) with their tensors moved to the device, so that Triton's JIT compiles every variant
for this GPU and launches it (a synchronisation after each launch pins a fault to it); each call's
loss is compared with ``impl="torch"`` on the same tensors; a call that fails is recorded and the
torch backend's result stands in for it, so the calls after it still run.

``large`` and ``small``: :mod:`gpu_values`; ``sync``: :mod:`gpu_sync`; ``report`` and
``estimate``: :mod:`gpu_report` (with :mod:`gpu_budget`).

``--quick`` (and ``--device cpu``, where the Triton kernels run in Triton's interpreter): small
shapes, for gpu.sh's dry run.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import re
import subprocess
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_common import (
    LAUNCH_TOLERANCE,
    TESTS,
    short,
    synchronize,
    write,
    write_so_far,
)
from gpu_variants import describe, variant


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
    ("pyarrow", "pyarrow"),
    ("fsspec", "fsspec"),
]
#: The distributions the TRL step imports (bench_trl_step.py: trl, datasets and what datasets
#: imports), whose versions and locations ``pip show`` records: a CUDA image's own pyarrow or
#: fsspec may not be the one datasets was built against.
TRL_STACK = ["trl", "datasets", "pyarrow", "fsspec", "dill", "multiprocess", "xxhash", "pandas"]


def pip_show(distributions: list[str]) -> dict[str, dict[str, str] | None]:
    """``pip show``'s Name/Version/Location/Requires of each distribution (None: not installed),
    as the GPU machine's pip sees them, ``PYTHONPATH`` (the wheels' folder) included."""
    command = [sys.executable, "-m", "pip", "show", "--disable-pip-version-check", *distributions]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=60)
    shown: dict[str, dict[str, str] | None] = dict.fromkeys(distributions)
    for block in done.stdout.split("\n---\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "Name" in fields:
            name = re.sub(r"[-_.]+", "-", fields["Name"]).lower()
            shown[name] = {k: fields.get(k, "") for k in ("Version", "Location", "Requires")}
    return shown


def setup(args: argparse.Namespace) -> int:
    wheels = install_wheels(Path(args.wheels), Path(args.site))
    began = time.perf_counter()
    import torch
    import triton
    from bench_common import numtok_source

    import numtok

    core_seconds = time.perf_counter() - began

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
    imports, import_seconds = {}, {}
    for distribution, module in OPTIONAL:
        version = installed_version(distribution)
        began = time.perf_counter()
        try:
            importlib.import_module(module)
            imports[distribution] = version or "imported"
        except Exception as error:  # a package missing or broken here: its variants are skipped
            imports[distribution] = f"not importable ({short(error, 160)})"
        import_seconds[distribution] = round(time.perf_counter() - began, 2)
    row["packages"] = imports
    # What a step's process spends on imports before its first case (gpu_budget.py's start).
    row["import_seconds"] = round(core_seconds + import_seconds["transformers"], 2)
    row["pip_show"] = shown = pip_show(TRL_STACK)
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
        "",
        f"Imports: torch, triton and numtok {core_seconds:.1f} s, transformers "
        f"{import_seconds['transformers']:.1f} s.",
        "",
        "`pip show` of what the TRL step imports: "
        + "; ".join(
            f"{name} " + (f"{s['Version']} in `{s['Location']}`" if s else "**not installed**")
            for name, s in shown.items()
        )
        + ".",
    ]
    write(Path(args.out), [row], lines)
    return 1 if wheels["failed"] else 0


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
                    row: dict[str, Any] = {"kernel": name, "variant": variant(args, kwargs)}
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
    base = Path(args.out)
    sys.path.insert(0, str(TESTS))
    import test_fused_triton as suite
    from numtok.ops.kernels import triton_rows

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
                write_so_far(
                    base,
                    [{"record": "call", **c} for c in calls],
                    [f"{len(calls)} calls so far; the last one **failed**."],
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
            write_so_far(
                base,
                [{"record": "call", **c} for c in calls],
                [f"{len(calls)} calls so far, {len(recorded.rows)} launches."],
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
    write(Path(args.out), rows, lines)
    return 0 if ok else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    checks = ["setup", "launch", "large", "small", "sync", "report", "estimate"]
    parser.add_argument("check", choices=checks)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", help="BASE: writes BASE.jsonl and BASE.md")
    parser.add_argument("--quick", action="store_true", help="small shapes (gpu.sh's dry run)")
    parser.add_argument("--wheels", default="benchmarks/wheels", help="setup: the wheels' folder")
    parser.add_argument("--site", help="setup: where the wheels are installed (on PYTHONPATH)")
    parser.add_argument(
        "--work", help="report, estimate: gpu.sh's work folder (steps.jsonl, each step's files)"
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
    if args.check not in ("small", "estimate") and args.out is None:
        parser.error(f"{args.check} needs --out")
    if args.check == "setup" and args.site is None:
        parser.error("setup needs --site")
    if args.check in ("report", "estimate") and args.work is None:
        parser.error(f"{args.check} needs --work")
    here = {"setup": setup, "launch": launch}
    modules = {"large": "gpu_values", "small": "gpu_values", "sync": "gpu_sync"}
    modules |= {"report": "gpu_report", "estimate": "gpu_report"}
    check = here.get(args.check) or getattr(
        importlib.import_module(modules[args.check]), args.check
    )
    sys.exit(check(args))


if __name__ == "__main__":
    main()
