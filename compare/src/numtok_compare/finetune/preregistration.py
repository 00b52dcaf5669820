"""Pre-registration: the hypothesis, the primary endpoint, the arms, λ, seeds and splits written
down before anything is trained, and the run held against them.

``numtok compare ... --preregister FILE --hypothesis TEXT --primary ARM`` writes FILE (JSON)
and stops: commit it, then run the same command again. The run then refuses to start unless its
settings, its data (the files' digest and the examples' content digest, generated data included)
and its model are the ones FILE names, and its report opens with the primary endpoint: ``ARM −
CE`` on the run's metric and readout, on its first test split, with its interval and verdict. A
registration written before the crossed analysis (its ``tests`` names the two intervals of the
old rule) does not match a run of this version: that run is not the analysis it registered. The
report also says whether FILE is committed in git, and when (a file committed after the run
began does not pre-register it). FILE records the analysis code it was written with (numtok's
version and git commit, :func:`code_version`); the run is not held to it, since committing FILE
makes a new commit, but anyone can check out that code to redo the analysis.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

from numtok_compare.finetune.config import FinetuneConfig
from numtok_compare.objectives import NUMBER_LOSS_ARMS
from numtok_compare.provenance import code_version

__all__ = [
    "check_preregistration",
    "preregistration",
    "write_preregistration",
]

_VERSION = 1
#: What a pre-registration records but does not hold the run to.
_NOT_HELD = ("written", "code")


def preregistration(
    config: FinetuneConfig,
    *,
    hypothesis: str,
    primary_arm: str,
    data: dict[str, Any],
    model_digest: str,
) -> dict[str, Any]:
    """The record :func:`write_preregistration` writes: ``data`` holds the splits' sizes and the
    data's digest."""
    if not hypothesis.strip():
        raise ValueError("hypothesis must state what the run tests, got an empty text")
    if primary_arm not in config.arms or primary_arm == "ce":
        raise ValueError(
            f"primary arm must be one of the run's arms other than 'ce' (it is compared with "
            f"CE), got {primary_arm!r} for arms {list(config.arms)}"
        )
    return {
        "version": _VERSION,
        "hypothesis": hypothesis.strip(),
        "primary_endpoint": {
            "difference": f"{primary_arm} - ce",
            "metric": config.metric,
            "readout": config.readout,
            "split": config.evaluation_splits[0],
            "tests": "the crossed seed x item analysis's 95 % interval (generalized, "
            "Satterthwaite df), a verdict when it excludes 0 and both arms beat the best constant "
            "on validation (one-sided 5 %, Bonferroni over the arm x readout candidates); "
            "unparsed answers scored as the training median by every error metric",
        },
        "arms": list(config.arms),
        "weights": {
            arm: list(config.weights_of(arm)) for arm in config.arms if arm in NUMBER_LOSS_ARMS
        },
        "seeds": list(config.seeds),
        "splits": data,
        "model_digest": model_digest,
        "settings": config.to_dict(),
        "code": code_version(),
    }


def write_preregistration(path: Path, record: dict[str, Any]) -> None:
    """Write ``record`` to ``path``; an existing file is never overwritten."""
    if path.exists():
        raise ValueError(f"{path} exists: a pre-registration is written once, never replaced")
    record = {**record, "written": datetime.datetime.now(datetime.timezone.utc).isoformat()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")


def check_preregistration(path: Path, record: dict[str, Any]) -> dict[str, Any]:
    """The stored pre-registration, if it names this run (``record`` as :func:`preregistration`
    makes it); otherwise a ValueError listing what differs."""
    stored: dict[str, Any] = json.loads(path.read_text())
    # A setting this run has and the registration lacks was added to numtok after it was
    # written: the registered run had it at its default.
    defaults = FinetuneConfig().to_dict()
    added = {k: defaults[k] for k in record.get("settings", {}) if k in defaults}
    registered = {**stored, "settings": {**added, **stored.get("settings", {})}}
    differing = [
        key for key in sorted(set(stored) | set(record))
        if key not in _NOT_HELD and registered.get(key) != record.get(key)
    ]  # fmt: skip
    if differing:
        details = "; ".join(
            _difference(key, registered.get(key), record.get(key)) for key in differing
        )
        raise ValueError(f"this run is not the one {path} pre-registered ({details})")
    return stored


def _difference(key: str, registered: Any, run: Any) -> str:
    """What differs under ``key``: within a dict, each differing entry."""
    if isinstance(registered, dict) and isinstance(run, dict):
        return "; ".join(
            _difference(f"{key}.{name}", registered.get(name), run.get(name))
            for name in sorted(set(registered) | set(run))
            if registered.get(name) != run.get(name)
        )
    return f"{key}: registered {json.dumps(registered)[:80]}, this run {json.dumps(run)[:80]}"
