"""The user's own training settings: ``numtok compare --training-args FILE``, a JSON or YAML mapping
of ``transformers.TrainingArguments`` fields that every arm's Trainer takes (schedule, warm-up,
gradient accumulation, bf16, ``deepspeed``, ``fsdp``, ``report_to``, ...).

The fields that are settings of the comparison (:data:`SETTING_FIELDS`: ``max_steps`` is ``steps``,
``per_device_train_batch_size`` is ``batch_size``, ...) set those settings, and the flags
``--steps``, ``--batch-size`` and ``--learning-rate`` override them; the fields the harness sets
for every arm itself (:data:`HARNESS_FIELDS`: where the arm's checkpoints go, its seed, how long it
trains) are refused; every other field is passed through as written (``RunConfig.training_args``,
every comparison's, from scratch or fine-tuning), so the run folder's ``config.json`` records it
and a resumed run with other training settings is refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["HARNESS_FIELDS", "SETTING_FIELDS", "check_training_args", "read_training_args"]

#: ``TrainingArguments`` field -> the comparison's setting it is.
SETTING_FIELDS = {
    "max_steps": "steps",
    "per_device_train_batch_size": "batch_size",
    "learning_rate": "learning_rate",
    "warmup_steps": "warmup_steps",
    "weight_decay": "weight_decay",
    "max_grad_norm": "grad_clip",
    "logging_steps": "log_every",
    "save_steps": "checkpoint_every",
}
#: The fields the harness sets for every arm, and why.
HARNESS_FIELDS = {
    "output_dir": "each arm checkpoints into its own folder of the run folder (--out)",
    "seed": "each arm takes its seed from --seeds",
    "data_seed": "the batches of every arm of a seed come from that seed (--seeds)",
    "num_train_epochs": "every arm trains max_steps steps (--steps)",
    "resume_from_checkpoint": "a rerun of the same command resumes from the run folder",
}


def check_training_args(passed: Mapping[str, Any], name: str) -> None:
    """A ValueError naming ``name`` when ``passed`` is not a mapping of ``TrainingArguments``
    fields the harness passes through (none of :data:`SETTING_FIELDS` or
    :data:`HARNESS_FIELDS`), or holds a value ``TrainingArguments`` refuses."""
    from transformers import HfArgumentParser, TrainingArguments

    if not isinstance(passed, Mapping) or not all(isinstance(k, str) for k in passed):
        raise ValueError(
            f"{name} must map TrainingArguments field names to values, got {type(passed).__name__}"
        )
    owned = sorted(set(passed) & set(HARNESS_FIELDS))
    if owned:
        raise ValueError(
            f"{name} sets {', '.join(owned)}, which numtok compare sets itself: "
            + "; ".join(f"{field}: {HARNESS_FIELDS[field]}" for field in owned)
        )
    settings = sorted(set(passed) & set(SETTING_FIELDS))
    if settings:
        raise ValueError(
            f"{name} holds {', '.join(settings)}, which are the comparison's settings "
            f"({', '.join(SETTING_FIELDS[field] for field in settings)})"
        )
    try:
        parser = HfArgumentParser(TrainingArguments)  # type: ignore[arg-type]
        parser.parse_dict({**passed, "output_dir": "."})
    except (ValueError, TypeError) as error:
        raise ValueError(f"{name}: TrainingArguments refuses them: {error}") from None


def _parsed(text: str, is_json: bool, where: str) -> Any:
    if is_json:
        try:
            return json.loads(text)
        except ValueError as error:
            raise ValueError(f"{where}: not JSON ({error})") from None
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ValueError(f"{where}: not YAML ({error})") from None


def read_training_args(path: Path) -> dict[str, Any]:
    """The settings of the file at ``path`` (``.json``, ``.yaml`` or ``.yml``), as a comparison's
    config takes them: the settings it sets (:data:`SETTING_FIELDS`, by setting name) and
    ``training_args``, the fields passed through to every arm's ``TrainingArguments``; a
    ValueError naming ``--training-args`` and the file for anything else."""
    where = f"--training-args {path}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise ValueError(f"{where}: cannot read the file ({error.strerror or error})") from None
    suffix = Path(path).suffix.lower()
    if suffix not in (".json", ".yaml", ".yml"):
        raise ValueError(f"{where}: give a .json, .yaml or .yml file, got {suffix or 'none'}")
    data = _parsed(text, suffix == ".json", where)
    if not isinstance(data, dict):
        raise ValueError(
            f"{where}: the file must hold a mapping of TrainingArguments fields, got "
            f"{type(data).__name__}"
        )
    settings = {SETTING_FIELDS[k]: v for k, v in data.items() if k in SETTING_FIELDS}
    passed = {k: v for k, v in data.items() if k not in SETTING_FIELDS}
    check_training_args(passed, where)
    return {**settings, "training_args": passed}
