"""Questions and answers from DeepMind's Mathematics generator, deterministic and cached per seed.

For one task and seed there is a training set (equal thirds of the generator's train-easy,
train-medium and train-hard difficulty) and held-out evaluation splits:

* ``easy`` and ``medium_hard``: fresh questions at the training difficulties;
* ``interpolate``: the generator's interpolation test setting;
* ``extrapolate``: its extrapolation module (larger numbers or longer expressions), where the task
  has one.

Those are the test splits. Beside them there is one ``validation`` split: fresh questions at the
training difficulties (equal thirds), from streams of their own, so no test question decides a
setting. A run scores the validation split (the report's learnability gate reads it) and the test
splits, or with ``evaluate_on="validation"`` the validation split alone (for choosing settings);
either way every held-out question of the seed is generated and kept out of its training set, so
both kinds of run train on the same questions.

Every split is drawn from its own random stream, seeded from (task, seed, split), so a split does
not change when another split's size does. Evaluation questions are generated first and any
training question that equals one of them is redrawn: held-out questions are never trained on.
Questions whose answer is not a plain integer or decimal (``-231/8``) are redrawn too, since the
metrics compare numbers.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from numtok_compare.tasks.mathematics_compat import load_mathematics_dataset

__all__ = [
    "EVALUATE_ON",
    "TASKS",
    "MathData",
    "TaskSpec",
    "check_evaluate_on",
    "check_task",
    "evaluation_splits",
    "generate",
    "generate_evaluation",
    "generate_training",
    "held_out_questions",
    "load_data",
    "read_cache",
    "training_shares",
    "write_cache",
]

Example = tuple[str, str]
Progress = Callable[[int], None]

# Format of the cache files; bump when generation changes so that old caches are not reused.
_CACHE_VERSION = 2
# The generator's own limits (mathematics_dataset.generate_settings).
_MAX_QUESTION_LENGTH = 160
_MAX_ANSWER_LENGTH = 30
_NUMBER = re.compile(r"-?\d+(\.\d+)?")
_PROGRESS_EVERY = 500
#: What a run can be scored on: the test splits, or the validation split for choosing settings.
EVALUATE_ON = ("test", "validation")
VALIDATION = "validation"


@dataclass(frozen=True)
class TaskSpec:
    """A task of the Mathematics data: the generator module trained on and its test modules."""

    name: str
    module: str
    extrapolate_module: str | None
    description: str

    @property
    def splits(self) -> tuple[str, ...]:
        """The evaluation splits, in report order."""
        base = ("easy", "medium_hard", "interpolate")
        return (*base, "extrapolate") if self.extrapolate_module else base


#: Arithmetic modules whose answers are numbers. (``add_or_sub_in_base`` and ``simplify_surd``
#: answer with base-n digits and surds, so they are not offered.)
TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        TaskSpec(
            "arithmetic__add_or_sub",
            "add_or_sub",
            "add_or_sub_big",
            "a + b or a - b, integers and decimals",
        ),
        TaskSpec(
            "arithmetic__add_sub_multiple",
            "add_sub_multiple",
            "add_sub_multiple_longer",
            "sums of several integers with brackets (the paper's ablation task)",
        ),
        TaskSpec("arithmetic__mul", "mul", "mul_big", "a * b, integers and decimals"),
        TaskSpec("arithmetic__div", "div", "div_big", "a / b, questions with integer answers"),
        TaskSpec(
            "arithmetic__mul_div_multiple",
            "mul_div_multiple",
            "mul_div_multiple_longer",
            "products and quotients of several integers, integer answers",
        ),
        TaskSpec(
            "arithmetic__mixed",
            "mixed",
            "mixed_longer",
            "all four operations with brackets, integer answers",
        ),
        TaskSpec(
            "arithmetic__nearest_integer_root",
            "nearest_integer_root",
            None,
            "n-th root rounded to the nearest integer",
        ),
    )
}


def check_evaluate_on(evaluate_on: object) -> str:
    """``evaluate_on`` if it is one of :data:`EVALUATE_ON`; otherwise a ValueError."""
    if evaluate_on not in EVALUATE_ON:
        raise ValueError(
            f"evaluate_on must be one of {list(EVALUATE_ON)}, got {evaluate_on!r} (e.g. "
            "--validation-only to choose settings)"
        )
    return str(evaluate_on)


def evaluation_splits(spec: TaskSpec, evaluate_on: str = "test") -> tuple[str, ...]:
    """The splits a run scores: ``validation`` and, unless ``evaluate_on`` is "validation",
    ``spec.splits`` after it."""
    if check_evaluate_on(evaluate_on) == VALIDATION:
        return (VALIDATION,)
    return (VALIDATION, *spec.splits)


def check_task(name: object) -> TaskSpec:
    """The :class:`TaskSpec` called ``name``; otherwise a ValueError listing the tasks."""
    if isinstance(name, str) and name in TASKS:
        return TASKS[name]
    available = "\n".join(f"  {spec.name}: {spec.description}" for spec in TASKS.values())
    raise ValueError(f"unknown task {name!r}; the available tasks are:\n{available}")


@dataclass(frozen=True)
class MathData:
    """One seed's questions: ``train`` and ``evaluation[split]`` are lists of (question, answer)."""

    task: str
    seed: int
    train: list[Example]
    evaluation: dict[str, list[Example]]


def _split_seed(task: str, seed: int, split: str) -> int:
    digest = hashlib.sha256(f"numtok/{task}/{seed}/{split}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Seed the global ``random`` and ``numpy.random`` streams the generator draws from, and put
    the caller's state back afterwards."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    random.seed(seed)
    np.random.seed(seed)
    try:
        yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def _entropy_level(level: int, num_levels: int = 3) -> Callable[[tuple[float, float]], Any]:
    """The generator's difficulty levels: level ``i`` of ``n`` keeps the ``i``-th n-th of each
    module's training entropy range (``mathematics_dataset.generate._make_entropy_fn``)."""

    def restrict(entropy_range: tuple[float, float]) -> tuple[float, float]:
        low, high = entropy_range
        width = high - low
        return low + level / num_levels * width, low + (level + 1) / num_levels * width

    return restrict


def _draw(
    sample: Callable[[], Any],
    count: int,
    seed: int,
    exclude: set[str],
    progress: Progress | None,
) -> list[Example]:
    """``count`` questions from ``sample``, redrawing overlong ones, non-numeric answers and
    questions in ``exclude``."""
    examples: list[Example] = []
    with _seeded(seed):
        while len(examples) < count:
            problem = sample()
            question, answer = str(problem.question), str(problem.answer)
            if (
                len(question) > _MAX_QUESTION_LENGTH
                or len(answer) > _MAX_ANSWER_LENGTH
                or not _NUMBER.fullmatch(answer)
                or question in exclude
            ):
                continue
            examples.append((question, answer))
            if progress is not None and len(examples) % _PROGRESS_EVERY == 0:
                progress(_PROGRESS_EVERY)
    if progress is not None:
        progress(len(examples) % _PROGRESS_EVERY)
    return examples


def _shares(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` near-equal counts, the first ones larger."""
    return [total // parts + (i < total % parts) for i in range(parts)]


#: The generator's training difficulties (train-easy, train-medium, train-hard); the training
#: set holds equal thirds of them.
TRAIN_LEVELS = 3


def training_shares(train_questions: int) -> list[int]:
    """How many training questions each difficulty level contributes."""
    return _shares(train_questions, TRAIN_LEVELS)


def generate_evaluation(
    spec: TaskSpec,
    seed: int,
    eval_questions: int,
    progress: Progress | None = None,
) -> dict[str, list[Example]]:
    """The held-out splits of one seed (see the module docstring), ``eval_questions`` each: the
    validation split, then the test splits."""
    arithmetic = load_mathematics_dataset()
    modules = {
        "easy": arithmetic.train(_entropy_level(0))[spec.module],
        "medium": arithmetic.train(_entropy_level(1))[spec.module],
        "hard": arithmetic.train(_entropy_level(2))[spec.module],
        "interpolate": arithmetic.test()[spec.module],
    }
    if spec.extrapolate_module is not None:
        modules["extrapolate"] = arithmetic.test_extra()[spec.extrapolate_module]

    def draw(stream: str, count: int) -> list[Example]:
        return _draw(modules[stream], count, _split_seed(spec.name, seed, stream), set(), progress)

    levels = zip(("easy", "medium", "hard"), _shares(eval_questions, 3), strict=True)
    drawn = (
        _draw(
            modules[level],
            count,
            _split_seed(spec.name, seed, f"{VALIDATION}-{level}"),
            set(),
            progress,
        )
        for level, count in levels
    )
    evaluation = {VALIDATION: [example for examples in drawn for example in examples]}
    medium, hard = _shares(eval_questions, 2)
    evaluation["easy"] = draw("easy", eval_questions)
    evaluation["medium_hard"] = draw("medium", medium) + draw("hard", hard)
    for split in spec.splits[2:]:
        evaluation[split] = draw(split, eval_questions)
    return evaluation


def held_out_questions(evaluation: dict[str, list[Example]]) -> set[str]:
    return {question for examples in evaluation.values() for question, _ in examples}


def generate_training(
    spec: TaskSpec,
    seed: int,
    level: int,
    count: int,
    held_out: set[str],
    progress: Progress | None = None,
) -> list[Example]:
    """``count`` training questions of difficulty ``level`` (0-2), none of them in ``held_out``.

    Each level is its own random stream, so the levels of a seed can be generated in parallel.
    """
    arithmetic = load_mathematics_dataset()
    sample = arithmetic.train(_entropy_level(level))[spec.module]
    stream_seed = _split_seed(spec.name, seed, f"train{level}")
    return _draw(sample, count, stream_seed, held_out, progress)


def generate(
    spec: TaskSpec,
    seed: int,
    *,
    train_questions: int,
    eval_questions: int,
    progress: Progress | None = None,
) -> MathData:
    """Generate one seed's data (no cache); ``progress(n)`` is called as questions are made."""
    evaluation = generate_evaluation(spec, seed, eval_questions, progress)
    held_out = held_out_questions(evaluation)
    train = [
        example
        for level, count in enumerate(training_shares(train_questions))
        for example in generate_training(spec, seed, level, count, held_out, progress)
    ]
    return MathData(spec.name, seed, train, evaluation)


def cache_path(
    cache_dir: Path, task: str, seed: int, train_questions: int, eval_questions: int
) -> Path:
    name = f"seed{seed}-train{train_questions}-eval{eval_questions}-v{_CACHE_VERSION}.json"
    return Path(cache_dir) / "mathematics" / task / name


def read_cache(
    task: str,
    seed: int,
    *,
    train_questions: int,
    eval_questions: int,
    cache_dir: Path,
) -> MathData | None:
    """The cached data of one seed, or None when it was not generated yet."""
    path = cache_path(cache_dir, task, seed, train_questions, eval_questions)
    if not path.exists():
        return None
    stored = json.loads(path.read_text())
    train = [(q, a) for q, a in stored["train"]]
    evaluation = {s: [(q, a) for q, a in rows] for s, rows in stored["evaluation"].items()}
    return MathData(task, seed, train, evaluation)


def write_cache(data: MathData, *, cache_dir: Path) -> None:
    """Store one seed's data (atomically: a killed process leaves no half-written file)."""
    first_split = next(iter(data.evaluation.values()))
    path = cache_path(cache_dir, data.task, data.seed, len(data.train), len(first_split))
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f"{path.name}.tmp{os.getpid()}")
    temporary.write_text(json.dumps({"train": data.train, "evaluation": data.evaluation}))
    os.replace(temporary, path)


def load_data(
    task: str,
    seed: int,
    *,
    train_questions: int,
    eval_questions: int,
    cache_dir: Path,
    progress: Progress | None = None,
) -> MathData:
    """One seed's data, read from ``cache_dir`` or generated once and written there."""
    spec = check_task(task)
    sizes = {"train_questions": train_questions, "eval_questions": eval_questions}
    cached = read_cache(task, seed, cache_dir=cache_dir, **sizes)
    if cached is not None:
        if progress is not None:
            progress(total_questions(spec, **sizes))
        return cached
    data = generate(spec, seed, progress=progress, **sizes)
    write_cache(data, cache_dir=cache_dir)
    return data


def total_questions(spec: TaskSpec, train_questions: int, eval_questions: int) -> int:
    """How many questions :func:`load_data` reports through ``progress`` for one seed (every
    held-out split's, whichever a run scores)."""
    return train_questions + len(evaluation_splits(spec)) * eval_questions
