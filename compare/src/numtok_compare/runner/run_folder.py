"""The layout of a run folder, shared by every task.

``config.json`` holds the settings (a folder refuses a run with other settings), ``started.json``
when its run first began;
``seed<N>/<arm>/`` holds one arm's checkpoints while it trains (``checkpoints/``, the
``transformers.Trainer``'s), then ``model.pt`` (the
parameters training changed, :func:`trainable_state`) and what each phase of the runner stored
(:mod:`numtok_compare.runner.phases`: ``validation.json``, ``test.json``). Every file is written
atomically, so a killed process leaves the old file or the new one, never half of one.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

__all__ = [
    "CHECKPOINTS",
    "WEIGHTS",
    "arm_directory",
    "drop_checkpoints",
    "is_main_process",
    "load_trainable_state",
    "prepare_run_dir",
    "save_atomically",
    "stored_by_the_main_process",
    "trainable_state",
    "why_not_creatable",
]

CONFIG, STARTED, CHECKPOINTS, WEIGHTS = "config.json", "started.json", "checkpoints", "model.pt"


class Settings(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


def why_not_creatable(path: Path) -> str | None:
    """Why the folder ``path`` cannot be made (it is a file; its nearest existing ancestor is a
    file, or a folder this process may not write into), or None when it is a folder already or
    can be made. Checked before any slow work, so that a bad ``--out`` fails in seconds."""
    path = Path(path)
    if path.is_dir():
        return None
    if path.exists():
        return "it is a file, not a folder"
    ancestor = path.absolute().parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{ancestor} is a file, not a folder"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"no permission to write in {ancestor}"
    return None


def prepare_run_dir(config: Settings, run_dir: Path) -> str:
    """Create ``run_dir`` and record the settings; a folder that holds a run with other settings
    is a ValueError (resuming it with these settings would mix two experiments), and so is a
    ``run_dir`` that cannot be made (:func:`why_not_creatable`). Returns when the folder's run
    first began (ISO 8601, UTC; recorded in ``started.json`` the first time)."""
    why = why_not_creatable(run_dir)
    try:
        if why is None:
            run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        why = error.strerror or str(error)
    if why is not None:
        raise ValueError(f"the run folder {run_dir} cannot be made: {why}; choose another --out")
    path = run_dir / CONFIG
    settings = config.to_dict()
    if not path.exists():
        save_atomically(settings, path)
    stored = json.loads(path.read_text())
    if stored != settings:
        changed = sorted(
            k for k in stored.keys() | settings.keys() if stored.get(k) != settings.get(k)
        )
        raise ValueError(
            f"the run folder {run_dir} holds a run with other settings (differing: "
            f"{', '.join(changed)}); choose another --out, or delete the folder to start over"
        )
    started = run_dir / STARTED
    if not started.exists():
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        save_atomically({"started": now}, started)
    when: str = json.loads(started.read_text())["started"]
    return when


def arm_directory(run_dir: Path, seed: int, arm: str) -> Path:
    return Path(run_dir) / f"seed{seed}" / arm


def save_atomically(obj: Any, path: Path) -> None:
    """Write to a temporary file, then rename (JSON for ``.json`` paths, ``torch.save``
    otherwise)."""
    temporary = path.with_name(f"{path.name}.tmp{os.getpid()}")
    if path.suffix == ".json":
        temporary.write_text(json.dumps(obj, indent=1))
    else:
        torch.save(obj, temporary)
    os.replace(temporary, path)


def is_main_process() -> bool:
    """False in every process of a ``torchrun`` or ``accelerate launch`` but the first
    (``RANK`` > 0): every process runs the comparison and trains each arm with the others; the
    first scores it and reports it."""
    return int(os.environ.get("RANK", "0")) == 0


def stored_by_the_main_process(
    compute: Callable[[], dict[str, Any]], path: Path, *, poll_seconds: float = 0.5
) -> dict[str, Any]:
    """``compute()`` in the main process, stored at ``path`` (JSON, atomically); every other
    process waits for that file and reads it, instead of computing it again (scoring every item
    on every process of a torchrun launch)."""
    if is_main_process():
        stored = compute()
        save_atomically(stored, path)
        return stored
    while not path.exists():
        time.sleep(poll_seconds)
    found: dict[str, Any] = json.loads(path.read_text())
    return found


def drop_checkpoints(directory: Path) -> None:
    """Delete an arm's checkpoints (once its results are stored, nothing resumes from them)."""
    shutil.rmtree(directory / CHECKPOINTS, ignore_errors=True)


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The parameters training changes (those that require a gradient), by name: all of a model
    trained from scratch; a LoRA run's adapters and head, not the frozen weights it reloads."""
    return {
        name: parameter.detach()
        for name, parameter in model.named_parameters()
        if parameter.requires_grad
    }


def load_trainable_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy :func:`trainable_state`'s tensors back into ``model``; a ValueError when they do not
    name exactly the parameters of ``model`` that require a gradient."""
    names = set(trainable_state(model))
    if set(state) != names:
        differing = sorted(set(state) ^ names)
        raise ValueError(
            f"the stored weights do not match the model's trainable parameters (differing: "
            f"{differing[:3]}{' ...' if len(differing) > 3 else ''})"
        )
    model.load_state_dict(state, strict=False)
