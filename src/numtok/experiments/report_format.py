"""What every run's report shares: the fields results.json begins with (a description of the
machine among them), JSON without NaN, and tables as aligned text or Markdown."""

from __future__ import annotations

import datetime
import math
import os
import platform
from typing import Any

import torch

import numtok
from numtok.experiments.config import TrainingConfig
from numtok.experiments.model import Transformer

__all__ = ["hardware", "json_safe", "run_header", "signed"]


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


def run_header(
    config: TrainingConfig,
    vocabulary_size: int,
    *,
    command: str | None,
    wall_seconds: float,
    workers: int,
) -> dict[str, Any]:
    """The fields every results.json begins with: numtok's version, the date (UTC), the command,
    the hardware, the run's wall time and worker count, the settings and the model's size."""
    return {
        "numtok_version": numtok.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "hardware": hardware(config.device, config.threads),
        "wall_seconds": wall_seconds,
        "workers": workers,
        "config": config.to_dict(),
        "model_parameters": Transformer(config.model_config(vocabulary_size)).num_parameters(),
    }


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
