"""The settings of one fine-tuning comparison on a pretrained causal LM (``numtok compare`` and
the ``smollm2-*`` presets), checked before any work starts."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, ClassVar, TypeVar

from numtok._common.validation import check_number
from numtok.experiments.config import check_device, check_non_negative_int, check_positive_int
from numtok.experiments.item_metrics import ITEM_METRICS
from numtok.experiments.objectives import NUMBER_LOSS_ARMS
from numtok.readout.distribution import MAX_DIGITS

__all__ = [
    "ADAPTATIONS",
    "ARITHMETIC_TEST_SPLITS",
    "FINETUNE_ARMS",
    "FINETUNE_TASKS",
    "READOUTS",
    "FinetuneConfig",
]

#: The tasks: arithmetic questions (:mod:`numtok.experiments.tasks.arithmetic`), the rJokes
#: scores (:mod:`numtok.experiments.tasks.rjokes`) and a user's JSON Lines
#: (:mod:`numtok.experiments.tasks.jsonl`).
FINETUNE_TASKS = ("arithmetic", "rjokes", "jsonl")
#: ``base``: the model before fine-tuning (no training); ``ce``: cross-entropy on the answer;
#: ``was``, ``mse``, ``number``: CE + λ·NTL-WAS, NTL-MSE, the number-level NTL; ``del``,
#: ``smmd``, ``dist2``, ``ntil``: CE + λ·that loss; ``gls``: cross-entropy with Gaussian-smoothed
#: number targets instead of CE (σ = 1, no λ); ``head``: a regression head on the last prompt
#: token's hidden state, MSE on the standardised answer.
FINETUNE_ARMS = ("base", "ce", *NUMBER_LOSS_ARMS, "gls", "head")
#: Full fine-tuning, or LoRA adapters on the attention's q and v projections.
ADAPTATIONS = ("full", "lora")
#: How an answer is read: the generated text (``greedy``); the mean, median or mode of the
#: model's distribution over the numbers 0 to ``max_value`` (``expected``, ``median``, ``mode``);
#: the regression head's output (``head``).
READOUTS = ("greedy", "expected", "median", "mode", "head")
#: The arithmetic test splits (:mod:`numtok.experiments.tasks.arithmetic`).
ARITHMETIC_TEST_SPLITS = ("test", "test_harder", "test_fresh_4_digit")
_Config = TypeVar("_Config", bound="FinetuneConfig")


@dataclass(frozen=True)
class FinetuneConfig:
    """Everything that determines a fine-tuning comparison's results (output folders and
    progress bars do not). For each seed every arm starts from the same pretrained weights (and,
    for LoRA, the same adapters) and sees the same batches; the arms differ only in the loss.

    ``model`` names the model: ``"smollm2"`` (SmolLM2-135M-Instruct as :func:`numtok.
    experiments.pretrained.ensure_smollm2` builds it) or a local folder; ``data`` (task
    ``jsonl``) the JSON Lines file or folder. The run folder records a digest of both and
    refuses to resume with another model or other data.

    λ: ``weight_grid`` empty, each number-loss arm trains at its ``arm_weights`` entry, else
    ``ntl_weight``; otherwise at every λ of the grid, and the rule of
    :mod:`~numtok.experiments.finetune.choose` picks one per arm on the validation split, by
    ``metric`` of ``readout``. ``metric`` and ``readout`` on the first of ``test_splits`` are
    also the primary endpoint, and ``metric`` is what the learnability gate checks.
    """

    ARMS: ClassVar[tuple[str, ...]] = FINETUNE_ARMS

    task: str = "arithmetic"
    model: str = "smollm2"
    data: str = ""
    arms: tuple[str, ...] = ("base", "ce", "was", "mse", "del", "gls")
    ntl_weight: float = 0.3
    #: ``((arm, λ), ...)``: the arms whose λ is not ``ntl_weight``.
    arm_weights: tuple[tuple[str, float], ...] = ()
    weight_grid: tuple[float, ...] = ()
    seeds: tuple[int, ...] = (0, 1, 2)
    adaptation: str = "full"
    lora_rank: int = 16
    steps: int = 100
    batch_size: int = 16
    learning_rate: float = 1e-4
    #: The regression head's own learning rate (None: ``learning_rate``).
    head_learning_rate: float | None = None
    warmup_steps: int = 10
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    #: Sizes of the built-in tasks' splits (a ``jsonl`` task uses every example it has).
    train_examples: int = 4000
    validation_examples: int = 300
    test_examples: int = 300
    harder_examples: int = 300
    #: The splits scored once at the end (empty: ``test``, and for arithmetic ``test_harder``).
    test_splits: tuple[str, ...] = ()
    metric: str = "log_mae"
    readout: str = "greedy"
    #: rJokes: a joke is cut to its first ``max_prompt_tokens`` tokens.
    max_prompt_tokens: int = 64
    #: The ``expected``, ``median`` and ``mode`` readouts read the numbers 0 to ``max_value``
    #: spelled in up to ``max_digits`` digits (None: no distribution readouts).
    max_value: int | None = None
    max_digits: int = 2
    eval_batch_size: int = 32
    max_new_tokens: int = 8
    device: str = "cpu"
    threads: int = 2

    def __post_init__(self) -> None:
        self.validate()

    @property
    def evaluation_splits(self) -> tuple[str, ...]:
        """The splits scored once at the end."""
        if self.test_splits:
            return self.test_splits
        return ("test", "test_harder") if self.task == "arithmetic" else ("test",)

    @property
    def readouts(self) -> tuple[str, ...]:
        """The readouts of a token arm."""
        if self.max_value is None:
            return ("greedy",)
        return ("greedy", "expected", "median", "mode")

    def weights_of(self, arm: str) -> tuple[float, ...]:
        """The λ an arm trains at: the grid for a number-loss arm when choosing, else one."""
        if arm not in NUMBER_LOSS_ARMS:
            return (0.0,)
        return self.weight_grid or (self.weight_of(arm),)

    def validate(self) -> None:
        if self.task not in FINETUNE_TASKS:
            raise ValueError(f"task must be one of {list(FINETUNE_TASKS)}, got {self.task!r}")
        if (self.task == "jsonl") != bool(self.data):
            raise ValueError(
                f"data names the JSON Lines of task 'jsonl' and only of it; got task "
                f"{self.task!r} with data {self.data!r}"
            )
        if self.adaptation not in ADAPTATIONS:
            raise ValueError(
                f"adaptation must be one of {list(ADAPTATIONS)}, got {self.adaptation!r}"
            )
        for name in (
            "lora_rank", "steps", "batch_size", "train_examples", "validation_examples",
            "test_examples", "harder_examples", "max_prompt_tokens", "max_digits",
            "eval_batch_size", "max_new_tokens", "threads",
        ):  # fmt: skip
            check_positive_int(name, getattr(self, name))
        check_non_negative_int("warmup_steps", self.warmup_steps)
        check_number("learning_rate", self.learning_rate, minimum=0.0, inclusive=False)
        if self.head_learning_rate is not None:
            check_number(
                "head_learning_rate", self.head_learning_rate, minimum=0.0, inclusive=False
            )
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
        for entry in self.arm_weights:
            if not (isinstance(entry, tuple) and len(entry) == 2 and entry[0] in NUMBER_LOSS_ARMS):
                raise ValueError(
                    f"arm_weights must be (arm, λ) pairs with arms from {list(NUMBER_LOSS_ARMS)}, "
                    f"got {entry!r}"
                )
            check_number(f"the λ of {entry[0]}", entry[1], minimum=0.0, inclusive=True)
        if self.weight_grid and self.arm_weights:
            raise ValueError(
                "weight_grid chooses every number-loss arm's λ on validation; arm_weights fixes "
                f"them: give one of the two, got both ({list(self.weight_grid)} and "
                f"{[list(e) for e in self.arm_weights]})"
            )
        if len(set(self.weight_grid)) != len(self.weight_grid):
            raise ValueError(f"weight_grid must hold distinct λ, got {list(self.weight_grid)}")
        for weight in self.weight_grid:
            check_number("each λ of weight_grid", weight, minimum=0.0, inclusive=False)
        self._validate_evaluation()
        check_device(self.device)

    def _validate_evaluation(self) -> None:
        allowed = ARITHMETIC_TEST_SPLITS if self.task == "arithmetic" else ("test",)
        if not set(self.test_splits) <= set(allowed) or len(set(self.test_splits)) != len(
            self.test_splits
        ):
            raise ValueError(
                f"test_splits of task {self.task!r} must be distinct splits from "
                f"{list(allowed)}, got {list(self.test_splits)}"
            )
        if self.metric not in ITEM_METRICS:
            raise ValueError(f"metric must be one of {list(ITEM_METRICS)}, got {self.metric!r}")
        arms_readouts = set(self.readouts) | ({"head"} if "head" in self.arms else set())
        if self.readout not in arms_readouts:
            raise ValueError(
                f"readout must be one of the readouts this run has, {sorted(arms_readouts)} "
                f"(expected, median and mode need max_value), got {self.readout!r}"
            )
        if self.max_value is not None:
            check_non_negative_int("max_value", self.max_value)
            if self.max_value >= 10**self.max_digits or self.max_digits > MAX_DIGITS:
                raise ValueError(
                    f"max_value must have at most max_digits digits (at most {MAX_DIGITS}), got "
                    f"max_value {self.max_value} with max_digits {self.max_digits}"
                )

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
        for key in ("arms", "seeds", "weight_grid", "test_splits"):
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
