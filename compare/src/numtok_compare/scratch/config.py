"""The settings of a comparison trained from scratch (:class:`TrainingConfig`: the shared ones
and the transformer's size) and of its two tasks, arithmetic (:class:`ExperimentConfig`) and
rJokes (:class:`RJokesConfig`), checked before any work starts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from numtok.readout import check_max_digits
from numtok_compare.checks import check_number
from numtok_compare.config import RunConfig, check_non_negative_int, check_positive_int
from numtok_compare.objectives import ARMS as ARITHMETIC_ARMS
from numtok_compare.tasks.mathematics import check_evaluate_on, check_task, evaluation_splits
from numtok_compare.tasks.mathematics_compat import load_mathematics_dataset
from numtok_compare.tasks.rjokes import find_data_dir

__all__ = [
    "EVALUATION_SPLITS",
    "RJOKES_ARMS",
    "ExperimentConfig",
    "RJokesConfig",
    "TrainingConfig",
]

#: The arms: cross-entropy, CE + λ·NTL-WAS, CE + λ·NTL-MSE, a scalar regression head on the same
#: trunk, Gaussian-label-smoothed CE, and CE + λ·(the number-level loss, DEL, SMMD or DIST2).
RJOKES_ARMS = ("ce", "was", "mse", "head", "gls", "number", "del", "smmd", "dist2")
#: ``validation`` (held out of the training file) while choosing settings; ``test`` once.
EVALUATION_SPLITS = ("validation", "test")


@dataclass(frozen=True)
class TrainingConfig(RunConfig):
    """A comparison of small Llamas trained from scratch: the shared settings and the model's
    size (:func:`~numtok_compare.scratch.arm.llama_config`)."""

    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4

    def validate(self) -> None:
        super().validate()
        for name in ("d_model", "n_layers", "n_heads"):
            check_positive_int(name, getattr(self, name))
        if self.d_model % (2 * self.n_heads):
            raise ValueError(
                f"d_model must be a multiple of 2 * n_heads (RoPE rotates channel pairs per "
                f"head): d_model={self.d_model}, n_heads={self.n_heads}"
            )


@dataclass(frozen=True)
class ExperimentConfig(TrainingConfig):
    """The arithmetic comparison on DeepMind's Mathematics data; everything that determines a
    run's results (``workers`` and output folders do not). The defaults are the ``demo`` preset.

    Arms (:mod:`numtok_compare.objectives`): ``CE``, ``CE + ntl_weight · NTL`` or
    Gaussian-label-smoothed CE.
    """

    ARMS: ClassVar[tuple[str, ...]] = ARITHMETIC_ARMS

    task: str = "arithmetic__add_or_sub"
    train_questions: int = 32_000
    eval_questions: int = 300
    #: ``"test"``: the held-out test splits; ``"validation"``: the validation split, for choosing
    #: settings (:mod:`numtok_compare.tasks.mathematics`).
    evaluate_on: str = "test"

    def validate(self) -> None:
        check_task(self.task)
        super().validate()
        check_positive_int("train_questions", self.train_questions)
        check_positive_int("eval_questions", self.eval_questions)
        check_evaluate_on(self.evaluate_on)

    def size_fields(self) -> dict[str, tuple[str, ...]]:
        return {"train_examples": ("train_questions",), "eval_examples": ("eval_questions",)}

    def check_prerequisites(self, data_dir: Path | None) -> None:
        load_mathematics_dataset()  # the generator and what it imports

    @property
    def splits(self) -> tuple[str, ...]:
        """The splits this run scores, in report order."""
        return evaluation_splits(check_task(self.task), self.evaluate_on)


@dataclass(frozen=True)
class RJokesConfig(TrainingConfig):
    """Everything that determines an rJokes run's results (the data folder, ``workers`` and
    output folders do not). The defaults are the ``rjokes`` preset.

    A joke is cut to its first ``max_prompt_tokens`` tokens (a word-level vocabulary of the
    ``vocabulary_words`` most frequent words of the training jokes, plus the ten digits); the
    model answers with the score's digits. ``eval_jokes`` jokes of the ``evaluate_on`` split are
    scored (0: all of them); number readouts enumerate answers of up to ``max_digits`` digits,
    extending only prefixes at least ``min_probability`` likely (0: all; the probability this
    leaves out is reported as ``pruned``).
    """

    ARMS: ClassVar[tuple[str, ...]] = RJOKES_ARMS

    task: str = "rjokes"
    arms: tuple[str, ...] = ("ce", "was", "mse", "head")
    # λ = 3 gave the lowest greedy RMSE of both NTL arms on the validation split among 0.3, 1
    # and 3 (500 steps, 3 seeds; docs/rjokes.md).
    ntl_weight: float = 3.0
    steps: int = 500
    warmup_steps: int = 50
    max_prompt_tokens: int = 48
    vocabulary_words: int = 12_000
    validation_jokes: int = 4_000
    evaluate_on: str = "test"
    eval_jokes: int = 1_000
    max_digits: int = 2
    min_probability: float = 1e-6

    def size_fields(self) -> dict[str, tuple[str, ...]]:
        return {"eval_examples": ("eval_jokes",)}  # every training joke is trained on

    @property
    def reads_rjokes(self) -> bool:
        return True

    def check_prerequisites(self, data_dir: Path | None) -> None:
        find_data_dir(data_dir)

    def validate(self) -> None:
        if self.task != "rjokes":
            raise ValueError(f"task must be 'rjokes' for an RJokesConfig, got {self.task!r}")
        super().validate()
        for name in ("max_prompt_tokens", "vocabulary_words", "validation_jokes"):
            check_positive_int(name, getattr(self, name))
        check_non_negative_int("eval_jokes", self.eval_jokes)
        if self.evaluate_on not in EVALUATION_SPLITS:
            raise ValueError(
                f"evaluate_on must be one of {list(EVALUATION_SPLITS)}, got {self.evaluate_on!r}"
            )
        check_max_digits(self.max_digits)
        check_number("min_probability", self.min_probability, minimum=0.0, inclusive=True)
        if self.min_probability >= 1:
            raise ValueError(f"min_probability must be below 1, got {self.min_probability}")
