"""What every run's report shares: a description of the machine, JSON without NaN, and signed
numbers as the tables print them."""

from __future__ import annotations

import math
import os
import platform
from typing import Any

import torch

__all__ = ["hardware", "json_safe", "needed", "signed"]


def hardware(device: str, threads: int) -> dict[str, Any]:
    """The platform, CPU count, Python and torch versions, and the device a run used."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": device,
        "threads_per_worker": threads,
    }
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def json_safe(value: Any) -> Any:
    """NaN and infinities become null, tuples and numpy arrays lists, numpy scalars Python
    numbers: results.json stays standard JSON (``json.dumps(allow_nan=False)`` accepts it)."""
    if hasattr(value, "tolist"):  # a numpy array or scalar
        value = value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def signed(value: float | None, digits: int = 3) -> str:
    """``+0.016`` (``digits`` decimals, always a sign); ``n/a`` for None or a non-finite value. A
    value that rounds to zero is ``+0.000``, never ``-0.000``."""
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{round(value, digits) or 0.0:+.{digits}f}"


def needed(count: int | None) -> str:
    """A planning figure (seeds or items needed): ``1,234``, or "not reachable" for None."""
    return "not reachable" if count is None else f"{count:,}"
