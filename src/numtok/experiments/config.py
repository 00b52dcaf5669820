"""The settings of one comparison run, checked before any work starts."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, ClassVar, TypeVar

import torch

from numtok._common.validation import check_int, check_number
from numtok.experiments.model import ModelConfig
from numtok.experiments.objectives import ARMS as ARITHMETIC_ARMS
from numtok.experiments.objectives import NUMBER_LOSS_ARMS
from numtok.experiments.tasks.mathematics import check_evaluate_on, check_task, evaluation_splits

__all__ = [
    "ExperimentConfig",
    "TrainingConfig",
    "check_device",
    "check_non_negative_int",
    "check_positive_int",
]


_Config = TypeVar("_Config", bound="TrainingConfig")


@dataclass(frozen=True)
class TrainingConfig:
    """The settings every comparison shares: seeds, arms, λ, the optimiser and its schedule, the
    model, logging and the device. A task's config adds its data and evaluation settings.

    For each seed, every arm starts from the same initial weights and sees the same batches; the
    arms differ only in the loss.
    """

    #: The arms a task offers, in report order; set by each task's config.
    ARMS: ClassVar[tuple[str, ...]] = ()

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
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    eval_batch_size: int = 250
    log_every: int = 25
    checkpoint_every: int = 100
    device: str = "cpu"
    threads: int = 1

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise a ValueError/TypeError that says which setting to change and how."""
        for name in (
            "steps",
            "batch_size",
            "d_model",
            "n_layers",
            "n_heads",
            "eval_batch_size",
            "log_every",
            "checkpoint_every",
            "threads",
        ):
            check_positive_int(name, getattr(self, name))
        check_non_negative_int("warmup_steps", self.warmup_steps)
        check_number("learning_rate", self.learning_rate, minimum=0.0, inclusive=False)
        check_number("ntl_weight", self.ntl_weight, minimum=0.0, inclusive=True)
        for entry in self.arm_weights:
            if not (isinstance(entry, tuple) and len(entry) == 2 and entry[0] in self.ARMS):
                raise ValueError(
                    f"arm_weights must be (arm, λ) pairs with arms from {list(self.ARMS)}, got "
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
        ModelConfig(
            vocab_size=1, d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads
        )
        check_device(self.device)

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

    def model_config(self, vocab_size: int) -> ModelConfig:
        return ModelConfig(
            vocab_size=vocab_size,
            d_model=self.d_model,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["seeds"], data["arms"] = list(self.seeds), list(self.arms)
        # Left out when empty, so that the settings of runs from before it keep their fingerprint.
        data["arm_weights"] = [list(entry) for entry in self.arm_weights]
        if not self.arm_weights:
            del data["arm_weights"]
        return data

    @classmethod
    def from_dict(cls: type[_Config], data: dict[str, Any]) -> _Config:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown settings {unknown}; the settings are {sorted(known)}")
        values = dict(data)
        for name in ("seeds", "arms"):
            if name in values:
                values[name] = tuple(values[name])
        if "arm_weights" in values:
            values["arm_weights"] = tuple(tuple(entry) for entry in values["arm_weights"])
        return cls(**values)

    def with_overrides(self: _Config, **overrides: Any) -> _Config:
        """A copy with the given settings changed (``None`` values are ignored)."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    def fingerprint(self) -> str:
        """A short hash of the settings: equal settings, equal fingerprint."""
        text = json.dumps(self.to_dict(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:8]


@dataclass(frozen=True)
class ExperimentConfig(TrainingConfig):
    """The arithmetic comparison on DeepMind's Mathematics data; everything that determines a
    run's results (``workers`` and output folders do not). The defaults are the ``demo`` preset.

    Arms (:mod:`numtok.experiments.objectives`): ``CE``, ``CE + ntl_weight · NTL`` or
    Gaussian-label-smoothed CE.
    """

    ARMS: ClassVar[tuple[str, ...]] = ARITHMETIC_ARMS

    task: str = "arithmetic__add_or_sub"
    train_questions: int = 32_000
    eval_questions: int = 300
    #: ``"test"``: the held-out test splits; ``"validation"``: the validation split, for choosing
    #: settings (:mod:`numtok.experiments.tasks.mathematics`).
    evaluate_on: str = "test"

    def validate(self) -> None:
        check_task(self.task)
        super().validate()
        check_positive_int("train_questions", self.train_questions)
        check_positive_int("eval_questions", self.eval_questions)
        check_evaluate_on(self.evaluate_on)

    @property
    def splits(self) -> tuple[str, ...]:
        """The splits this run scores, in report order."""
        return evaluation_splits(check_task(self.task), self.evaluate_on)

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        # Left out for the test splits, so that runs from before it keep their fingerprint.
        if self.evaluate_on == "test":
            del data["evaluate_on"]
        return data


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
