"""The settings of one comparison run, checked before any work starts."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch

from numtok_compare.checks import check_int, check_number
from numtok_compare.objectives import NUMBER_LOSS_ARMS
from numtok_compare.training_args import check_training_args

__all__ = [
    "FLAGS",
    "RunConfig",
    "check_device",
    "check_non_negative_int",
    "check_positive_int",
]


_Config = TypeVar("_Config", bound="RunConfig")

#: The settings the command line sets, one flag each whatever the comparison: setting -> flag.
FLAGS = {
    "task": "--task", "model": "--model", "arms": "--arms", "seeds": "--seeds",
    "ntl_weight": "--ntl-weight", "arm_weights": "--arm-weights",
    "weight_grid": "--choose-on-validation", "steps": "--steps", "batch_size": "--batch-size",
    "learning_rate": "--learning-rate", "head_learning_rate": "--head-learning-rate",
    "adaptation": "--adaptation", "lora_rank": "--lora-rank", "metric": "--metric",
    "readout": "--readout", "margin": "--margin", "margin_baseline": "--margin-against",
    "max_new_tokens": "--max-new-tokens", "readout_tolerance": "--readout-tolerance",
    "device": "--device", "threads": "--threads",
}  # fmt: skip


@dataclass(frozen=True)
class RunConfig:
    """The settings every comparison shares, from scratch or fine-tuning: seeds, arms, λ, the
    optimiser and its schedule, logging, checkpoints and the device. A task's config adds its
    model, data and evaluation settings; one ``to_dict``/``from_dict`` pair and one fingerprint
    serve them all.

    For each seed, every arm starts from the same initial weights and sees the same batches; the
    arms differ only in the loss.
    """

    #: The arms a task offers, in report order; set by each task's config.
    ARMS: ClassVar[tuple[str, ...]] = ()
    #: Settings added after runs were stored: left out of :meth:`to_dict` while unset (empty,
    #: None or False), so that a run without them keeps the settings and fingerprint it had before.
    LATER_SETTINGS: ClassVar[tuple[str, ...]] = ("training_args",)

    seeds: tuple[int, ...] = (0, 1, 2)
    arms: tuple[str, ...] = ("ce", "was", "mse")
    ntl_weight: float = 0.3
    #: ``((arm, λ), ...)``: the arms whose λ is not ``ntl_weight`` (each chosen on validation).
    arm_weights: tuple[tuple[str, float], ...] = ()
    steps: int = 800
    batch_size: int = 64
    learning_rate: float = 1e-3
    warmup_steps: int = 100
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    eval_batch_size: int = 250
    #: The training log holds the mean losses of every ``log_every`` steps.
    log_every: int = 25
    #: An interrupted arm resumes from its last checkpoint, saved every ``checkpoint_every`` steps.
    checkpoint_every: int = 100
    device: str = "cpu"
    threads: int = 1
    #: ``TrainingArguments`` fields every arm's Trainer takes as well (``--training-args``,
    #: :mod:`~numtok_compare.training_args`); empty: the harness's own settings alone.
    training_args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise a ValueError/TypeError that says which setting to change and how."""
        for name in (
            "steps", "batch_size", "eval_batch_size", "log_every", "checkpoint_every", "threads",
        ):  # fmt: skip
            check_positive_int(name, getattr(self, name))
        check_non_negative_int("warmup_steps", self.warmup_steps)
        check_number("learning_rate", self.learning_rate, minimum=0.0, inclusive=False)
        check_number("ntl_weight", self.ntl_weight, minimum=0.0, inclusive=True)
        weighted = [arm for arm in self.ARMS if arm in NUMBER_LOSS_ARMS]
        for entry in self.arm_weights:
            if not (isinstance(entry, tuple) and len(entry) == 2 and entry[0] in weighted):
                raise ValueError(
                    f"arm_weights must be (arm, λ) pairs with arms from {weighted}, got "
                    f"{entry!r} (e.g. --arm-weights was=3,del=1)"
                )
            check_number(f"the λ of {entry[0]}", entry[1], minimum=0.0, inclusive=True)
        if len({arm for arm, _ in self.arm_weights}) != len(self.arm_weights):
            raise ValueError(f"arm_weights names an arm twice: {list(self.arm_weights)}")
        check_number("weight_decay", self.weight_decay, minimum=0.0, inclusive=True)
        check_number("grad_clip", self.grad_clip, minimum=0.0, inclusive=False)
        if not self.seeds:
            raise ValueError("seeds must name at least one seed, got none (e.g. --seeds 3)")
        for seed in self.seeds:
            check_non_negative_int("each seed", seed)
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be distinct, got {list(self.seeds)}")
        unknown = [arm for arm in self.arms if arm not in self.ARMS]
        if unknown or not self.arms:
            raise ValueError(
                f"arms must be chosen from {list(self.ARMS)}, got {list(self.arms)}"
                + (f" (unknown: {unknown})" if unknown else "")
            )
        if len(set(self.arms)) != len(self.arms):
            raise ValueError(f"arms must be distinct, got {list(self.arms)}")
        if "ce" not in self.arms:
            raise ValueError(
                f"arms must include 'ce': every other arm is compared with CE seed by seed, "
                f"got {list(self.arms)}"
            )
        check_device(self.device)
        if self.training_args:
            check_training_args(self.training_args, "training_args")

    @property
    def reads_rjokes(self) -> bool:
        """Whether the run reads the rJokes files (:mod:`numtok_compare.tasks.rjokes`)."""
        return False

    def check_prerequisites(self, data_dir: Path | None) -> None:
        """What the run needs besides its settings (its data files, a generator, an extra),
        checked before any work: a ValueError or ModuleNotFoundError saying what is missing
        (``data_dir``: the rJokes folder given on the command line)."""

    def weight_of(self, arm: str) -> float:
        """λ of ``arm``: its entry in ``arm_weights``, else ``ntl_weight``."""
        return dict(self.arm_weights).get(arm, self.ntl_weight)

    def weights_text(self) -> str:
        """``λ = 3`` or ``λ: CE+NTL-WAS 3, CE+DEL 1`` for the arms with a number loss."""
        if not self.arm_weights:
            return f"λ = {self.ntl_weight:g}"
        return "λ: " + ", ".join(
            f"{arm} {self.weight_of(arm):g}" for arm in self.arms if arm in NUMBER_LOSS_ARMS
        )

    def trained_arms(self) -> int:
        """How many arms the run trains: every (seed, arm)."""
        return len(self.seeds) * len(self.arms)

    def plan(self) -> str:
        """One line of what the run will train, printed before it starts (and all that
        ``--dry-run`` does once the settings are checked); with one seed, a warning that the run
        cannot give a verdict."""
        total = self.trained_arms() * self.steps
        plan = (
            f"plan: arms {', '.join(self.arms)} × seeds {list(self.seeds)}, {self.weights_text()}: "
            f"{self.trained_arms()} arms to train × {self.steps} steps of {self.batch_size} "
            f"examples = {total:,} training steps on {self.device}, threads {self.threads}"
        )
        if len(self.seeds) == 1:
            plan += (
                "; one seed gives no interval and so no verdict on any arm (the seed-to-seed "
                "spread is unknown): use 3 or more to compare"
            )
        return plan

    def to_dict(self) -> dict[str, Any]:
        """The settings as JSON holds them (tuples as lists, ``arm_weights``' pairs as lists),
        so that a run folder's stored settings compare equal to the same config's; the
        :data:`LATER_SETTINGS` only when set, so that a run without them keeps the settings (and
        fingerprint) it had before the setting existed."""
        data = asdict(self)
        data["arm_weights"] = [list(entry) for entry in self.arm_weights]
        for name in self.LATER_SETTINGS:
            if data[name] in ({}, [], (), None, False):
                del data[name]
        return {key: list(value) if isinstance(value, tuple) else value
                for key, value in data.items()}  # fmt: skip

    @classmethod
    def from_dict(cls: type[_Config], data: dict[str, Any]) -> _Config:
        """The config :meth:`to_dict` wrote; a setting this config does not have is a
        ValueError (settings written by another version are not guessed at)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown settings {unknown}; the settings are {sorted(known)}")
        tuples = {f.name for f in fields(cls) if str(f.type).startswith("tuple")}
        values: dict[str, Any] = {
            key: tuple(value) if key in tuples else value for key, value in data.items()
        }
        if "arm_weights" in values:
            values["arm_weights"] = tuple((arm, float(w)) for arm, w in values["arm_weights"])
        return cls(**values)

    def with_overrides(self: _Config, **overrides: Any) -> _Config:
        """A copy with the given settings changed and checked again (``None`` values are
        ignored)."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    def size_fields(self) -> dict[str, tuple[str, ...]]:
        """The settings ``--train-examples`` and ``--eval-examples`` set, one spelling for every
        task: ``{"train_examples": fields, "eval_examples": fields}``, how many training examples
        a run draws and how many it scores per evaluation split (each task names its own
        fields; a task without such a size leaves its key out)."""
        return {}

    def with_sizes(
        self: _Config, *, train_examples: int | None = None, eval_examples: int | None = None
    ) -> _Config:
        """A copy with the fields of :meth:`size_fields` set (``None``: left as they are); a
        ValueError naming the flag where this task has no such size."""
        fields = self.size_fields()
        overrides: dict[str, int] = {}
        for name, value in (("train_examples", train_examples), ("eval_examples", eval_examples)):
            if value is None:
                continue
            if name not in fields:
                offered = [f"--{n.replace('_', '-')}" for n in fields] or ["neither"]
                raise ValueError(
                    f"--{name.replace('_', '-')} does not apply to a comparison of task "
                    f"{getattr(self, 'task', '?')!r} (it takes {' and '.join(offered)})"
                )
            overrides |= dict.fromkeys(fields[name], value)
        return self.with_overrides(**overrides)

    def fingerprint(self) -> str:
        """A short hash of the settings (12 hex digits): equal settings, equal fingerprint."""
        text = json.dumps(self.to_dict(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def check_device(device: object) -> torch.device:
    """The torch device ``device`` names, if this machine has it; otherwise a ValueError."""
    if not isinstance(device, str):
        raise TypeError(f"device must be a string such as 'cpu' or 'cuda', got {device!r}")
    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise ValueError(
            f"unknown device {device!r}; use 'cpu', 'cuda', 'cuda:N' or 'mps'"
        ) from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"device {device!r} was asked for but torch.cuda.is_available() is False on this "
                f"machine (torch {torch.__version__}); use --device cpu"
            )
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {device!r} does not exist: this machine has "
                f"{torch.cuda.device_count()} CUDA device(s)"
            )
    elif parsed.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(f"device {device!r} is not available here; use --device cpu")
    elif parsed.type != "cpu":
        raise ValueError(f"unsupported device {device!r}; use 'cpu', 'cuda', 'cuda:N' or 'mps'")
    return parsed


def check_positive_int(name: str, value: object) -> None:
    if check_int(name, value) < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")


def check_non_negative_int(name: str, value: object) -> None:
    if check_int(name, value) < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
