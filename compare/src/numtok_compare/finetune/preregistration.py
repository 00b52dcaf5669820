"""Pre-registration: the hypothesis, the primary endpoints, the arms, λ, seeds and splits written
down before anything is trained, and the run held against them.

``numtok compare ... --preregister FILE --hypothesis TEXT --primary ARM`` writes FILE (JSON)
and stops: commit it, then run the same command again. The run then refuses to start unless

- its settings, its data (the files' digest where the data are files, and for every task, built-in
  and generated data included, the content digest of every example's prompt and answer), its
  model (the digest of its files) and its code (:func:`~numtok_compare.provenance.source_digest`
  of numtok's and the harness's source, which committing FILE does not change) are the ones FILE
  names, and
- FILE is committed in git as it is (so that git dates it before the run; those dates are the
  committer's clock, which the report states but cannot check),

or ``--deviation TEXT`` states why it runs anyway: the report then lists every difference and
prints TEXT. The primary endpoints are machine-readable (``primary_endpoints``): ARM − CE and,
where a regression head runs, ARM − head, each on the run's metric, readout and first test split,
and the one ``--margin`` is set for (``--margin-against``) also an equivalence test within ±M.
A registration written by an earlier version (one ``primary_endpoint``, no source digest) does not
match a run of this version: that run is not the analysis it registered.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

from numtok_compare.finetune.config import FinetuneConfig
from numtok_compare.objectives import NUMBER_LOSS_ARMS
from numtok_compare.provenance import code_version, git_provenance

__all__ = [
    "check_preregistration",
    "preregistration",
    "primary_endpoints",
    "write_preregistration",
]

_VERSION = 2
#: What a pre-registration records but does not hold the run to (of ``code``, its ``source``
#: digest is held: the commit changes when FILE is committed, the source does not).
_NOT_HELD = ("written", "code")
#: The analysis every primary endpoint is read with.
_ANALYSIS = (
    "the crossed seed x item analysis's 95 % interval (generalized, Satterthwaite df), a verdict "
    "when it excludes 0 and both arms beat the best constant on validation (one-sided 5 %, "
    "Bonferroni over the arm x readout candidates); with a margin, two one-sided tests at 5 % "
    "(the 90 % interval inside it); unparsed answers scored as the training median by every "
    "error metric"
)


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
        "primary_endpoints": primary_endpoints(config, primary_arm),
        "analysis": _ANALYSIS,
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


def primary_endpoints(config: FinetuneConfig, arm: str) -> list[dict[str, Any]]:
    """``arm`` − CE and, where the run has a regression head, ``arm`` − head: each with the run's
    ``metric``, ``arm``'s ``readout`` (the head's is "head"), the ``split`` and its
    ``equivalence_margin`` (the run's margin for the comparisons against
    :attr:`~numtok_compare.finetune.config.FinetuneConfig.equivalence_baseline`, else None)."""
    baselines = ["ce", *(["head"] if "head" in config.arms and arm != "head" else [])]
    return [
        {
            "arm": arm, "readout": config.readout, "baseline": baseline,
            "baseline_readout": "head" if baseline == "head" else config.readout,
            "metric": config.metric, "split": config.evaluation_splits[0],
            "equivalence_margin": (
                config.margin if baseline == config.equivalence_baseline else None
            ),
        }
        for baseline in baselines
    ]  # fmt: skip


def write_preregistration(path: Path, record: dict[str, Any]) -> None:
    """Write ``record`` to ``path``; an existing file is never overwritten."""
    if path.exists():
        raise ValueError(f"{path} exists: a pre-registration is written once, never replaced")
    record = {**record, "written": datetime.datetime.now(datetime.timezone.utc).isoformat()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")


def check_preregistration(
    path: Path, record: dict[str, Any], *, deviation: str | None = None
) -> tuple[dict[str, Any], list[str]]:
    """The stored pre-registration and what of it this run differs in (``record`` as
    :func:`preregistration` makes it): every held key, the code's source digest where the
    registration has one, and whether ``path`` is committed in git as it is. With differences
    and no ``deviation`` (the stated reason to run anyway), a ValueError listing them."""
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
    differences = [_difference(key, registered.get(key), record.get(key)) for key in differing]
    source = stored.get("code", {}).get("source")
    if source is not None and source != record.get("code", {}).get("source"):
        differences.append(
            f"code: registered with source {source}, this run's is "
            f"{record.get('code', {}).get('source')} (numtok's or the harness's code changed)"
        )
    if git_provenance(path)["commit"] is None:
        differences.append(
            f"{path.name} is not committed in git as it is (commit it before the run, so that "
            "git dates the registration first)"
        )
    if differences and not (deviation and deviation.strip()):
        raise ValueError(
            f"this run is not the one {path} pre-registered ({'; '.join(differences)}); to run "
            "it anyway, state why with --deviation TEXT (the report prints it)"
        )
    return stored, differences


def _difference(key: str, registered: Any, run: Any) -> str:
    """What differs under ``key``: within a dict, each differing entry."""
    if isinstance(registered, dict) and isinstance(run, dict):
        return "; ".join(
            _difference(f"{key}.{name}", registered.get(name), run.get(name))
            for name in sorted(set(registered) | set(run))
            if registered.get(name) != run.get(name)
        )
    return f"{key}: registered {json.dumps(registered)[:80]}, this run {json.dumps(run)[:80]}"
