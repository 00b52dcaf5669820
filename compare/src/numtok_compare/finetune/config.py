"""The settings of one fine-tuning comparison on a pretrained causal LM (``numtok compare`` and
the ``smollm2-*`` presets), checked before any work starts."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from numtok.readout import FAST_TOLERANCE, MAX_DIGITS, check_samples, check_tolerance
from numtok_compare.checks import check_number
from numtok_compare.config import RunConfig, check_non_negative_int, check_positive_int
from numtok_compare.design import equivalence_baseline
from numtok_compare.extras import require_extra
from numtok_compare.finetune.data import FINETUNE_TASKS
from numtok_compare.item_metrics import ENDPOINT_METRICS
from numtok_compare.objectives import NUMBER_LOSS_ARMS
from numtok_compare.tasks.rjokes import find_data_dir

__all__ = ["ADAPTATIONS", "FINETUNE_ARMS", "FinetuneConfig"]

#: ``base``: the model before fine-tuning (no training); ``ce``: cross-entropy on the answer;
#: ``was``, ``mse``, ``number``: CE + λ·NTL-WAS, NTL-MSE, the number-level NTL; ``del``,
#: ``smmd``, ``dist2``, ``ntil``: CE + λ·that loss; ``gls``: cross-entropy with Gaussian-smoothed
#: number targets instead of CE (σ = 1, no λ); ``head``: a regression head on the last prompt
#: token's hidden state, MSE on the standardised answer.
FINETUNE_ARMS = ("base", "ce", *NUMBER_LOSS_ARMS, "gls", "head")
#: Full fine-tuning, or LoRA adapters on the attention's q and v projections.
ADAPTATIONS = ("full", "lora")


@dataclass(frozen=True)
class FinetuneConfig(RunConfig):
    """Everything that determines a fine-tuning comparison's results (output folders and
    progress bars do not). For each seed every arm starts from the same pretrained weights (and,
    for LoRA, the same adapters) and sees the same batches; the arms differ only in the loss.

    ``model`` names the model: ``"smollm2"`` (SmolLM2-135M-Instruct as :func:`numtok.
    experiments.pretrained.ensure_smollm2` builds it) or a local folder; ``data`` (task
    ``jsonl``) the JSON Lines file or folder. The run folder records a digest of both and
    refuses to resume with another model or other data.

    λ: ``weight_grid`` empty, each number-loss arm trains at its ``arm_weights`` entry, else
    ``ntl_weight``; otherwise at every λ of the grid, and the rule of
    :mod:`~numtok_compare.finetune.choose` picks one per arm on the validation split, by
    ``metric`` of ``readout``. ``metric`` and ``readout`` on the first of ``test_splits`` are
    also the primary endpoint, and ``metric`` is what the learnability gate checks.
    """

    ARMS: ClassVar[tuple[str, ...]] = FINETUNE_ARMS

    arms: tuple[str, ...] = ("base", "ce", "was", "mse", "del", "gls")
    steps: int = 100
    batch_size: int = 16
    learning_rate: float = 1e-4
    warmup_steps: int = 10
    weight_decay: float = 0.0
    eval_batch_size: int = 32
    log_every: int = 10
    checkpoint_every: int = 50
    threads: int = 2
    task: str = "arithmetic"
    model: str = "smollm2"
    data: str = ""
    weight_grid: tuple[float, ...] = ()
    adaptation: str = "full"
    lora_rank: int = 16
    #: The regression head's own learning rate (None: ``learning_rate``).
    head_learning_rate: float | None = None
    #: Sizes of the built-in tasks' splits (a ``jsonl`` task uses every example it has).
    train_examples: int = 4000
    validation_examples: int = 300
    test_examples: int = 300
    harder_examples: int = 300
    #: The splits scored once at the end (empty: ``test``, and for arithmetic ``test_harder``).
    test_splits: tuple[str, ...] = ()
    metric: str = "log_mae"
    #: How an answer is read: the generated text (``greedy``); the mean, median or mode of the
    #: model's distribution over the numbers 0 to ``max_value`` (``expected``, ``median``,
    #: ``mode``); the regression head's output (``head``).
    readout: str = "greedy"
    #: rJokes: a joke is cut to its first ``max_prompt_tokens`` tokens.
    max_prompt_tokens: int = 64
    #: The ``expected``, ``median`` and ``mode`` readouts read the numbers 0 to ``max_value``
    #: spelled in up to ``max_digits`` digits (None: no distribution readouts).
    max_value: int | None = None
    max_digits: int = 2
    #: The unexplored mass the distribution readouts may leave per example, as a share of its
    #: number mass (:func:`numtok.readout.distribution.number_distribution`; 0: exact): the mean
    #: moves by at most about this share of the range 0..``max_value``.
    readout_tolerance: float = FAST_TOLERANCE
    #: Draw this many numbers per example instead of enumerating them
    #: (:func:`numtok.predict_numbers`' ``samples``; None: enumerate): the ``expected`` readout
    #: is then unbiased with a standard error, at a cost that does not grow with the answers'
    #: spread (``readout_tolerance`` does not apply).
    readout_samples: int | None = None
    #: The test splits' draws per item chosen on validation (:mod:`~numtok_compare.finetune.
    #: draws`: what the comparisons of the expected readout need, within what the training's time
    #: affords; at least ``readout_samples``); unset: ``readout_samples`` on every split.
    choose_test_samples: bool = False
    max_new_tokens: int = 8
    #: Equivalence within ±``margin`` of the tested metric (MSE for RMSE) for the primary
    #: comparisons against ``margin_baseline`` (two one-sided tests at 5 %; None: none).
    #: Pre-registrable: it is a setting.
    margin: float | None = None
    #: The arm the margin's comparisons are against: "ce" or "head" (None: the regression head
    #: where the run has one, the paper's "matches a regression head", else CE).
    margin_baseline: str | None = None

    LATER_SETTINGS: ClassVar[tuple[str, ...]] = (
        *RunConfig.LATER_SETTINGS, "margin_baseline", "choose_test_samples",
    )  # fmt: skip

    @property
    def equivalence_baseline(self) -> str | None:
        """The arm whose comparisons the margin tests for equivalence (None: no margin;
        :func:`~numtok_compare.design.equivalence_baseline`)."""
        return equivalence_baseline(self.margin, self.margin_baseline, self.arms)

    @property
    def evaluation_splits(self) -> tuple[str, ...]:
        """The splits scored once at the end."""
        return self.test_splits or FINETUNE_TASKS[self.task].default_test_splits

    @property
    def reads_rjokes(self) -> bool:
        return FINETUNE_TASKS[self.task].reads_rjokes

    def check_prerequisites(self, data_dir: Path | None) -> None:
        """The task's data files and the modules the run needs: transformers, the task's extra
        and, for LoRA, peft (a ValueError or ModuleNotFoundError naming what to install)."""
        if self.reads_rjokes:
            find_data_dir(data_dir)
        require_extra("pretrained", "the fine-tuning presets")
        extra = FINETUNE_TASKS[self.task].extra
        if extra is not None:
            require_extra(extra, f"the {self.task} task")
        if self.adaptation == "lora" and importlib.util.find_spec("peft") is None:
            raise ModuleNotFoundError(
                "the LoRA fine-tuning presets need peft: pip install peft", name="peft"
            )

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

    def weights_text(self) -> str:
        if self.weight_grid:
            return f"λ chosen on validation from {', '.join(f'{w:g}' for w in self.weight_grid)}"
        return super().weights_text()

    def trained_arms(self) -> int:
        """Every (seed, arm, λ) but the ``base`` arm, which is not trained."""
        return len(self.seeds) * sum(len(self.weights_of(a)) for a in self.arms if a != "base")

    def size_fields(self) -> dict[str, tuple[str, ...]]:
        if FINETUNE_TASKS[self.task].user_files:  # used as they are
            return {}
        evaluated = ("validation_examples", "test_examples", "harder_examples")
        return {"train_examples": ("train_examples",), "eval_examples": evaluated}

    def validate(self) -> None:
        if self.task not in FINETUNE_TASKS:
            raise ValueError(f"task must be one of {list(FINETUNE_TASKS)}, got {self.task!r}")
        if FINETUNE_TASKS[self.task].user_files != bool(self.data):
            raise ValueError(
                f"data names the JSON Lines of task 'jsonl' and only of it; got task "
                f"{self.task!r} with data {self.data!r}"
            )
        if self.adaptation not in ADAPTATIONS:
            raise ValueError(
                f"adaptation must be one of {list(ADAPTATIONS)}, got {self.adaptation!r}"
            )
        super().validate()
        for name in (
            "lora_rank", "train_examples", "validation_examples", "test_examples",
            "harder_examples", "max_prompt_tokens", "max_digits", "max_new_tokens",
        ):  # fmt: skip
            check_positive_int(name, getattr(self, name))
        check_tolerance(self.readout_tolerance, name="readout_tolerance")
        if self.readout_samples is not None:
            check_samples(self.readout_samples, name="readout_samples")
        if not isinstance(self.choose_test_samples, bool):
            raise TypeError(f"choose_test_samples must be a bool, got {self.choose_test_samples!r}")
        if self.readout_samples is None and self.choose_test_samples:
            raise ValueError(
                "choose_test_samples chooses the test splits' draws from the validation's: it "
                "needs readout_samples (the draws per item on validation), got None"
            )
        for name in ("head_learning_rate", "margin"):
            if getattr(self, name) is not None:
                check_number(name, getattr(self, name), minimum=0.0, inclusive=False)
        if self.margin_baseline not in (None, "ce", "head") or (
            self.margin_baseline == "head" and "head" not in self.arms
        ):
            raise ValueError(
                "margin_baseline must be 'ce', or 'head' where the arms include the regression "
                f"head (arms {list(self.arms)}), got {self.margin_baseline!r}"
            )
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

    def _validate_evaluation(self) -> None:
        allowed = FINETUNE_TASKS[self.task].test_splits
        if not set(self.test_splits) <= set(allowed) or len(set(self.test_splits)) != len(
            self.test_splits
        ):
            raise ValueError(
                f"test_splits of task {self.task!r} must be distinct splits from "
                f"{list(allowed)}, got {list(self.test_splits)}"
            )
        if self.metric not in ENDPOINT_METRICS:
            raise ValueError(
                f"metric must be one of {list(ENDPOINT_METRICS)} (a mean of per-item scores, or "
                f"RMSE, tested as MSE), got {self.metric!r}"
            )
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
