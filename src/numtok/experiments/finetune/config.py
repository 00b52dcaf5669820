"""The settings of one fine-tuning comparison on a pretrained causal LM, checked before any work
starts."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, ClassVar, TypeVar

from numtok._validation import check_number
from numtok.experiments.config import check_device, check_non_negative_int, check_positive_int

__all__ = ["ADAPTATIONS", "FINETUNE_ARMS", "FINETUNE_TASKS", "FinetuneConfig"]

#: The tasks: arithmetic questions (:mod:`numtok.experiments.finetune.arithmetic`) and the
#: rJokes scores (:mod:`numtok.experiments.rjokes.data`).
FINETUNE_TASKS = ("arithmetic", "rjokes")
#: ``base``: the model before fine-tuning (no training); ``ce``: cross-entropy on the answer;
#: ``was``, ``mse``, ``del``: CE + λ·NTL-WAS, NTL-MSE, DEL; ``gls``: cross-entropy with
#: Gaussian-smoothed number targets instead of CE (σ = 1, no λ); ``head``: a regression head on
#: the last prompt token's hidden state, MSE on the standardised score (rJokes only).
FINETUNE_ARMS = ("base", "ce", "was", "mse", "del", "gls", "head")
#: Full fine-tuning, or LoRA adapters on the attention's q and v projections.
ADAPTATIONS = ("full", "lora")
_Config = TypeVar("_Config", bound="FinetuneConfig")


@dataclass(frozen=True)
class FinetuneConfig:
    """Everything that determines a fine-tuning run's results (output folders and workers do
    not). For each seed every arm starts from the same pretrained weights (and, for LoRA, the
    same adapters) and sees the same batches; the arms differ only in the loss.

    ``model`` names the model: ``"smollm2"`` (SmolLM2-135M-Instruct as :func:`numtok.
    experiments.pretrained.ensure_smollm2` builds it) or a local folder (the run folder records
    a digest of the folder's files and refuses to resume with another model).
    """

    ARMS: ClassVar[tuple[str, ...]] = FINETUNE_ARMS

    task: str = "arithmetic"
    model: str = "smollm2"
    arms: tuple[str, ...] = ("base", "ce", "was", "mse", "del", "gls")
    ntl_weight: float = 0.3
    #: ``((arm, λ), ...)``: the arms whose λ is not ``ntl_weight`` (each chosen on validation).
    arm_weights: tuple[tuple[str, float], ...] = ()
    seeds: tuple[int, ...] = (0, 1, 2)
    adaptation: str = "full"
    lora_rank: int = 16
    steps: int = 100
    batch_size: int = 16
    learning_rate: float = 1e-4
    warmup_steps: int = 10
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    train_examples: int = 4000
    validation_examples: int = 300
    test_examples: int = 300
    harder_examples: int = 300
    evaluate_on: str = "test"
    #: rJokes: a joke is cut to its first ``max_prompt_tokens`` tokens; the number readouts
    #: enumerate the scale's scores (0 to 11) spelled in up to ``max_digits`` digits.
    max_prompt_tokens: int = 64
    max_digits: int = 2
    eval_batch_size: int = 32
    max_new_tokens: int = 8
    device: str = "cpu"
    threads: int = 2

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.task not in FINETUNE_TASKS:
            raise ValueError(f"task must be one of {list(FINETUNE_TASKS)}, got {self.task!r}")
        if self.adaptation not in ADAPTATIONS:
            raise ValueError(
                f"adaptation must be one of {list(ADAPTATIONS)}, got {self.adaptation!r}"
            )
        if self.evaluate_on not in ("validation", "test"):
            raise ValueError(
                f"evaluate_on must be 'validation' or 'test', got {self.evaluate_on!r}"
            )
        for name in (
            "lora_rank", "steps", "batch_size", "train_examples", "validation_examples",
            "test_examples", "harder_examples", "max_prompt_tokens", "max_digits",
            "eval_batch_size", "max_new_tokens", "threads",
        ):  # fmt: skip
            check_positive_int(name, getattr(self, name))
        check_non_negative_int("warmup_steps", self.warmup_steps)
        check_number("learning_rate", self.learning_rate, minimum=0.0, inclusive=False)
        check_number("ntl_weight", self.ntl_weight, minimum=0.0, inclusive=True)
        check_number("weight_decay", self.weight_decay, minimum=0.0, inclusive=True)
        check_number("grad_clip", self.grad_clip, minimum=0.0, inclusive=False)
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be distinct and at least one, got {list(self.seeds)}")
        for seed in self.seeds:
            check_non_negative_int("each seed", seed)
        unknown = [arm for arm in self.arms if arm not in self.ARMS]
        if unknown or "ce" not in self.arms or len(set(self.arms)) != len(self.arms):
            raise ValueError(
                f"arms must be distinct, include 'ce' (every arm is compared with it seed by "
                f"seed) and come from {list(self.ARMS)}, got {list(self.arms)}"
            )
        if "head" in self.arms and self.task != "rjokes":
            raise ValueError("the 'head' arm (a regression head) is for task='rjokes' only")
        for entry in self.arm_weights:
            if not (isinstance(entry, tuple) and len(entry) == 2 and entry[0] in self.ARMS):
                raise ValueError(
                    f"arm_weights must be (arm, λ) pairs with arms from {list(self.ARMS)}, "
                    f"got {entry!r}"
                )
            check_number(f"the λ of {entry[0]}", entry[1], minimum=0.0, inclusive=True)
        check_device(self.device)

    def weight_of(self, arm: str) -> float:
        """λ of ``arm``: its entry in ``arm_weights``, else ``ntl_weight``."""
        return dict(self.arm_weights).get(arm, self.ntl_weight)

    def to_dict(self) -> dict[str, Any]:
        """The settings as JSON holds them (tuples as lists, ``arm_weights``' pairs included),
        so that a run folder's stored settings compare equal to the same config's."""
        settings = asdict(self)
        settings["arm_weights"] = [list(entry) for entry in self.arm_weights]
        return {key: list(value) if isinstance(value, tuple) else value
                for key, value in settings.items()}  # fmt: skip

    @classmethod
    def from_dict(cls: type[_Config], settings: dict[str, Any]) -> _Config:
        known = {f.name for f in fields(cls)}
        values = {key: value for key, value in settings.items() if key in known}
        for key in ("arms", "seeds"):
            if key in values:
                values[key] = tuple(values[key])
        if "arm_weights" in values:
            values["arm_weights"] = tuple((arm, float(w)) for arm, w in values["arm_weights"])
        return cls(**values)

    def with_overrides(self: _Config, **changes: Any) -> _Config:
        """These settings with some changed (and checked again)."""
        return replace(self, **changes)

    def fingerprint(self) -> str:
        """A short hash of the settings, for a run folder's name."""
        text = json.dumps(self.to_dict(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]
