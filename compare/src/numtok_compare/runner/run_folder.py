"""The layout of a run folder, shared by every task.

``config.json`` holds the settings (a folder refuses a run with other settings), ``started.json``
when its run first began;
``seed<N>/<arm>/`` holds one arm's checkpoints while it trains (``checkpoints/``, the
``transformers.Trainer``'s), then ``model.pt`` (the
parameters training changed, :func:`trainable_state`) and what each phase of the runner stored
(:mod:`numtok_compare.runner.phases`: ``validation.json``, ``test.json``; under ``torchrun``, each
process's share of them while they are scored, ``validation.part<rank>of<processes>.json``). Every
file is written atomically, so a killed process leaves the old file or the new one, never half of
one.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from numtok_compare.runner.scoring import Share, joined_shares

__all__ = [
    "CHECKPOINTS",
    "WEIGHTS",
    "arm_directory",
    "drop_checkpoints",
    "is_main_process",
    "load_trainable_state",
    "prepare_run_dir",
    "process_share",
    "save_atomically",
    "share_path",
    "stored_from_every_process",
    "trainable_state",
    "why_not_creatable",
]

CONFIG, STARTED, CHECKPOINTS, WEIGHTS = "config.json", "started.json", "checkpoints", "model.pt"
#: How often a process waiting for another's file looks for it, and says on stderr that it waits.
POLL_SECONDS, NOTICE_SECONDS = 0.5, 600.0


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
    (``RANK`` > 0): every process runs the comparison, trains each arm with the others and
    scores its share; the first stores the scores and reports them."""
    return int(os.environ.get("RANK", "0")) == 0


def process_share() -> Share:
    """This process's share of a split's items: the ``RANK``-th of ``WORLD_SIZE`` under
    ``torchrun`` or ``accelerate launch``, every item in a process launched alone."""
    return Share(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")))


def share_path(path: Path, share: Share) -> Path:
    """Where ``share``'s part of the results stored at ``path`` waits to be joined:
    ``validation.part1of2.json`` beside ``validation.json``."""
    return path.with_name(f"{path.stem}.part{share.index}of{share.count}{path.suffix}")


def _wait_for(paths: Sequence[Path]) -> None:
    """Return once every one of ``paths`` exists; until then, say on stderr every
    :data:`NOTICE_SECONDS` which are missing. The wait has no end of its own: another process's
    share may take hours, and torchrun ends every process of a launch when one fails."""
    began = noticed = time.monotonic()
    while missing := [path for path in paths if not path.exists()]:
        if time.monotonic() - noticed >= NOTICE_SECONDS:
            noticed = time.monotonic()
            print(f"numtok: process {process_share().index} has waited "
                  f"{(noticed - began) / 60:.0f} min for {', '.join(map(str, missing))}",
                  file=sys.stderr)  # fmt: skip
        time.sleep(POLL_SECONDS)


def stored_from_every_process(
    score: Callable[[Share], dict[str, Any]],
    finish: Callable[[dict[str, Any]], dict[str, Any]],
    path: Path,
) -> dict[str, Any]:
    """``finish(score(share))`` of every item, stored at ``path`` (JSON, atomically) and
    returned. A process launched alone scores every item. Under ``torchrun`` every process
    scores its share (:func:`process_share`), stores it at :func:`share_path` and says so on
    stderr, with the seconds it took; the main process waits for every share, joins them in
    order (:func:`joined_shares`: what one process would have scored), stores ``finish`` of
    them at ``path`` and deletes the shares; the others wait for ``path`` and read it. A wait
    says on stderr every :data:`NOTICE_SECONDS` what it is still waiting for."""
    share = process_share()
    if share.count == 1:
        stored = finish(score(share))
        save_atomically(stored, path)
        return stored
    shares = [share_path(path, Share(index, share.count)) for index in range(share.count)]
    began = time.perf_counter()
    save_atomically(score(share), shares[share.index])
    print(f"numtok: process {share.index} of {share.count} scored its share of {path} in "
          f"{time.perf_counter() - began:.1f} s", file=sys.stderr)  # fmt: skip
    if is_main_process():
        _wait_for(shares)
        stored = finish(joined_shares([json.loads(part.read_text()) for part in shares]))
        save_atomically(stored, path)
        for part in shares:
            part.unlink(missing_ok=True)  # its process may have deleted it, seeing ``path``
        return stored
    _wait_for([path])
    # The main process deleted this share, unless it joined an older copy (left by an interrupted
    # launch, of the same weights) before this one was written: nothing reads it now.
    shares[share.index].unlink(missing_ok=True)
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
