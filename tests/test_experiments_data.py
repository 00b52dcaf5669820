"""The Mathematics data: compatibility fixes, determinism, caching, held-out splits."""

from __future__ import annotations

import collections
import random
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mathematics_dataset", reason="needs the harness: pip install ./compare[demo]")

from numtok_compare.scratch.config import ExperimentConfig
from numtok_compare.tasks.mathematics import (
    TASKS,
    _draw,
    cache_path,
    check_evaluate_on,
    check_task,
    generate,
    load_data,
)
from numtok_compare.tasks.mathematics_compat import load_mathematics_dataset

Problem = collections.namedtuple("Problem", ["question", "answer"])

TASK = "arithmetic__add_or_sub"


def test_compat_fixes_make_the_generator_usable() -> None:
    load_mathematics_dataset()
    import sympy.solvers.diophantine  # noqa: F401
    from mathematics_dataset.sample import polynomials

    random.seed(0)
    np.random.seed(0)
    coefficients = polynomials.sample_coefficients([2, 1], entropy=6)  # uses ndarray.itemset
    expanded = polynomials.expand_coefficients(coefficients, entropy=6)  # np.object + itemset
    assert expanded.shape == coefficients.shape
    for index in np.ndindex(coefficients.shape):
        assert sum(expanded[index]) == coefficients[index]
    x, y = polynomials.diophantine_solve_linear_2d(c=7, a=3, b=5, t=0)  # moved sympy function
    assert 3 * x + 5 * y == 7


def test_compat_leaves_numpy_itself_alone() -> None:
    load_mathematics_dataset()
    assert not hasattr(np.zeros(1), "itemset")
    assert "object" not in vars(np)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_generates_numeric_answers(name: str) -> None:
    spec = TASKS[name]
    data = generate(spec, seed=0, train_questions=6, eval_questions=4)
    assert len(data.train) == 6
    assert list(data.evaluation) == ["validation", *spec.splits]
    for examples in [data.train, *data.evaluation.values()]:
        for question, answer in examples:
            assert question and re.fullmatch(r"-?\d+(\.\d+)?", answer), (question, answer)


def test_generation_is_deterministic_and_restores_global_random_state() -> None:
    random.seed(123)
    np.random.seed(123)
    expected_python, expected_numpy = random.random(), np.random.random()
    random.seed(123)
    np.random.seed(123)
    first = generate(TASKS[TASK], seed=3, train_questions=30, eval_questions=10)
    assert (random.random(), np.random.random()) == (expected_python, expected_numpy)
    second = generate(TASKS[TASK], seed=3, train_questions=30, eval_questions=10)
    assert first == second
    other_seed = generate(TASKS[TASK], seed=4, train_questions=30, eval_questions=10)
    assert other_seed.train != first.train


def test_evaluation_splits_do_not_depend_on_the_training_size() -> None:
    small = generate(TASKS[TASK], seed=1, train_questions=10, eval_questions=8)
    large = generate(TASKS[TASK], seed=1, train_questions=50, eval_questions=8)
    assert small.evaluation == large.evaluation


def test_held_out_questions_are_never_trained_on() -> None:
    data = generate(
        TASKS["arithmetic__nearest_integer_root"], 0, train_questions=900, eval_questions=100
    )
    held_out = {q for examples in data.evaluation.values() for q, _ in examples}
    assert not held_out & {q for q, _ in data.train}


def test_excluded_and_unusable_questions_are_redrawn() -> None:
    pool = [("1 + 1", 2), ("1 + 2", 3), ("2 + 2", 4), ("5 / 2", "5/2"), ("x" * 161, 1)]

    def sample() -> Problem:
        return Problem(*random.choice(pool))

    drawn = _draw(sample, 40, seed=0, exclude={"1 + 2"}, progress=None)
    assert len(drawn) == 40
    assert {q for q, _ in drawn} == {"1 + 1", "2 + 2"}  # no excluded, fraction or overlong one


def test_train_mix_has_three_difficulties(tmp_path: Path) -> None:
    data = generate(TASKS[TASK], seed=0, train_questions=300, eval_questions=1)
    lengths = [len(a.replace("-", "").replace(".", "")) for _, a in data.train]
    easy, hard = lengths[:100], lengths[200:]
    assert np.mean(hard) > np.mean(easy) + 2  # harder levels carry more digits


def test_cache_is_written_once_and_read_back(tmp_path: Path) -> None:
    counted: list[int] = []
    fresh = load_data(
        TASK, 2, train_questions=40, eval_questions=5, cache_dir=tmp_path, progress=counted.append
    )
    assert sum(counted) == 40 + 5 * 5  # validation and the four test splits
    path = cache_path(tmp_path, TASK, 2, 40, 5)
    assert path.exists()
    stamp = path.stat().st_mtime_ns
    cached = load_data(TASK, 2, train_questions=40, eval_questions=5, cache_dir=tmp_path)
    assert cached == fresh
    assert path.stat().st_mtime_ns == stamp


def test_unknown_task_lists_the_available_ones() -> None:
    with pytest.raises(ValueError, match="unknown task 'arithmetic__add'") as error:
        check_task("arithmetic__add")
    for name in TASKS:
        assert name in str(error.value)


def test_validation_split_is_its_own_held_out_draw_at_the_training_difficulties() -> None:
    data = generate(TASKS[TASK], seed=5, train_questions=300, eval_questions=30)
    questions = [q for q, _ in data.evaluation["validation"]]
    assert len(questions) == 30
    assert not set(questions) & {q for q, _ in data.train}  # never trained on
    test_questions = {q for split in TASKS[TASK].splits for q, _ in data.evaluation[split]}
    assert len(set(questions) & test_questions) < 10  # streams of its own
    # thirds easy/medium/hard: the last third carries more digits than the first
    lengths = [len(a.replace("-", "").replace(".", "")) for _, a in data.evaluation["validation"]]
    assert np.mean(lengths[20:]) > np.mean(lengths[:10])


def test_evaluate_on_is_checked_and_fingerprinted() -> None:
    with pytest.raises(ValueError, match="evaluate_on must be one of \\['test', 'validation'\\]"):
        check_evaluate_on("dev")
    with pytest.raises(ValueError, match="got 'dev'"):
        ExperimentConfig(evaluate_on="dev")
    default = ExperimentConfig()
    assert default.to_dict()["evaluate_on"] == "test"
    assert default.splits == ("validation", *TASKS[TASK].splits)  # the gate reads validation
    validation = ExperimentConfig(evaluate_on="validation")
    assert validation.splits == ("validation",)
    assert ExperimentConfig.from_dict(validation.to_dict()) == validation
    assert validation.fingerprint() != default.fingerprint()
    assert default.fingerprint() == ExperimentConfig.from_dict(default.to_dict()).fingerprint()
