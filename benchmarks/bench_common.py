"""What the benchmarks share: /proc readings, provenance, quantiles, and the rows and tables of
bench_loss.py (one JSON row per case, thread count, variant and mode, from runner.py's
measurements, and the Markdown summary printed at the end and stored beside the rows)."""

from __future__ import annotations

import datetime
import os
import platform
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import numtok


def quantiles(samples: list[float]) -> tuple[float, float, float]:
    """(p20, median, p80) in milliseconds."""
    if len(samples) == 1:
        return (1e3 * samples[0],) * 3
    p20, _, _, p80 = statistics.quantiles(samples, n=5, method="inclusive")
    return 1e3 * p20, 1e3 * statistics.median(samples), 1e3 * p80


def proc_status(field: str) -> int:
    """A field of /proc/self/status (VmRSS, VmHWM, ...) in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def reset_peak_memory() -> int:
    """Reset VmHWM (the process's peak resident memory) to the current VmRSS, by writing "5" to
    /proc/self/clear_refs; return that VmRSS in bytes, the base of the next peak."""
    resident = proc_status("VmRSS")
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")
    return resident


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def numtok_source() -> str:
    """Where the numtok that runs was imported from, without a path of the machine: this
    checkout's ``src/numtok``, another copy of the tree, or an installed package."""
    source = Path(numtok.__file__).resolve().parent
    checkout = Path(__file__).resolve().parent.parent / "src" / "numtok"
    if source == checkout:
        return "src/numtok of this checkout"
    if source.parent.name == "src":
        return "src/numtok of another copy of the tree"
    return "an installed package (site-packages)"


def provenance(device: torch.device, compiled: bool) -> dict[str, Any]:
    """Date, versions and the machine, for every row."""
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            cpu = next(
                line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")
            )
    except (OSError, StopIteration):
        pass
    load_average = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "numtok": numtok.__version__,
        "python": platform.python_version(),
        "cpu": cpu,
        "cpu_count": usable_cores(),
        "load_average_at_start": load_average,
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "compiled": compiled,
    }


def summary_table(rows: list[dict[str, Any]], label_of: Callable[[dict[str, Any]], str]) -> str:
    """Markdown: one line per case, thread count and variant (full mode, with the forward and
    backward medians beside it)."""
    lines = [
        "| case | threads | variant | full ms (p20-p80) | × base | CPU × base | fwd ms | bwd ms "
        "| peak × logits | GB/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    by_key: dict[tuple[str, int, str], dict[str, dict[str, Any]]] = {}
    for row in rows:
        label = label_of(row)
        by_key.setdefault((label, row["threads"], row["variant"]), {})[row["mode"]] = row
    for (label, threads, variant), modes in by_key.items():
        full = modes["full"]
        memory = full.get("peak_extra_x_logits", "")
        bandwidth = full.get("effective_gbps", "")
        variant += " [compiled]" if full.get("compiled") else ""
        lines.append(
            f"| {label} | {threads} | {variant} | {_ms(full['median_ms'])} "
            f"({_ms(full['p20_ms'])}-{_ms(full['p80_ms'])}) | {full['time_ratio']:.2f} | "
            f"{full['cpu_time_ratio']:.2f} | {_ms(modes['forward']['median_ms'])} | "
            f"{_ms(modes['backward']['median_ms'])} | {memory} | {bandwidth} |"
        )
    copies = {
        f"{row['gpu']}: {row['device_copy_gbps']} GB/s"
        for row in rows
        if row.get("device_copy_gbps") is not None
    }
    if copies:
        lines.append("")
        lines.append(
            "GB/s: one read and one write of the logits (2·N·V·bytes) over the full step's "
            "median; the device's own copy of a tensor that size (`copy_`, read + write) "
            f"reaches {', '.join(sorted(copies))}."
        )
    return "\n".join(lines)


def _ms(milliseconds: float) -> str:
    """Three significant digits at most, no exponent: 1234, 123, 12.3, 1.23, 0.123."""
    digits = max(0, 3 - len(str(int(milliseconds)))) if milliseconds >= 1 else 3
    return f"{milliseconds:.{digits}f}"
