"""The checks of ``benchmarks/gpu.sh`` that are not timings: each writes ``BASE.jsonl`` (its rows)
and ``BASE.md`` (its section of the report), rewritten after every case, and exits 1 when
something it checks fails.

    python benchmarks/gpu_checks.py setup --wheels DIR --site DIR --out BASE  # wheels, versions
    python benchmarks/gpu_checks.py report --work DIR --out BASE     # gpu.sh's report so far
    python benchmarks/gpu_checks.py estimate --work DIR              # the dry run's estimates

``setup`` installs the wheels of ``--wheels`` whose distribution is not installed at that version
(``pip install --no-index --no-deps --target SITE``: the GPU machine has no package index; SITE is
on gpu.sh's PYTHONPATH), records the versions, the GPU, what imports (and how long the imports
take) and ``pip show`` of what the TRL step imports.

The GPU acceptance checks are tests with the ``gpu`` marker, which gpu.sh runs with pytest:
``launch`` is ``tests/test_gpu_launch.py``, ``large`` and ``sanitizer`` are
``tests/test_gpu_values.py``, ``sync`` is ``tests/test_gpu_sync.py``.

``report`` and ``estimate``: :mod:`gpu_report` (with :mod:`gpu_budget`).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gpu_report
from gpu_common import short, write


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("check", choices=["setup", "report", "estimate"])
    parser.add_argument("--device", default="cuda", help="setup: the device it records")
    parser.add_argument("--out", help="BASE: writes BASE.jsonl and BASE.md")
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
    if args.check != "estimate" and args.out is None:
        parser.error(f"{args.check} needs --out")
    if args.check == "setup" and args.site is None:
        parser.error("setup needs --site")
    if args.check in ("report", "estimate") and args.work is None:
        parser.error(f"{args.check} needs --work")
    check = setup if args.check == "setup" else getattr(gpu_report, args.check)
    sys.exit(check(args))


if __name__ == "__main__":
    main()
