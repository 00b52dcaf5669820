"""The arithmetic comparison as :func:`~numtok.experiments.scratch.run_scratch` runs it
(:class:`ArithmeticRun`): DeepMind's Mathematics questions generated for every seed and cached,
then every (seed, arm), the step timing, and the report. Rerunning the same settings into the
same folder resumes: finished arms are read back, interrupted ones continue from their
checkpoints."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from numtok.experiments.config import ExperimentConfig
from numtok.experiments.parallel import Executor, Job, progress_bar, report_progress
from numtok.experiments.scratch import run_scratch
from numtok.experiments.scratch_report import write_report
from numtok.experiments.tasks.mathematics import (
    TASKS,
    Example,
    MathData,
    generate_evaluation,
    generate_training,
    held_out_questions,
    load_data,
    read_cache,
    total_questions,
    training_shares,
    write_cache,
)
from numtok.experiments.tasks.mathematics_compat import load_mathematics_dataset
from numtok.experiments.train import ArithmeticTask

__all__ = ["ArithmeticRun", "default_cache_dir", "run_experiment"]


def default_cache_dir() -> Path:
    """``$NUMTOK_CACHE``, else ``$XDG_CACHE_HOME/numtok``, else ``~/.cache/numtok``."""
    if os.environ.get("NUMTOK_CACHE"):
        return Path(os.environ["NUMTOK_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "numtok"


def _evaluation_job(config_dict: dict[str, Any], seed: int) -> dict[str, list[Example]]:
    config = ExperimentConfig.from_dict(config_dict)
    return generate_evaluation(
        TASKS[config.task],
        seed,
        config.eval_questions,
        report_progress,
        evaluate_on=config.evaluate_on,
    )


def _training_job(
    config_dict: dict[str, Any], seed: int, level: int, count: int, held_out: set[str]
) -> list[Example]:
    config = ExperimentConfig.from_dict(config_dict)
    return generate_training(TASKS[config.task], seed, level, count, held_out, report_progress)


def _generate_data(
    config: ExperimentConfig, executor: Executor, cache: Path, show_progress: bool
) -> None:
    """Generate and cache the data of every seed not cached yet: first the held-out splits (one
    job per seed), then the training set (one job per seed and difficulty level)."""
    spec = TASKS[config.task]
    sizes = {"train_questions": config.train_questions, "eval_questions": config.eval_questions}
    on = config.evaluate_on
    missing = [
        s
        for s in config.seeds
        if read_cache(config.task, s, cache_dir=cache, evaluate_on=on, **sizes) is None
    ]
    if not missing:
        return
    config_dict = config.to_dict()
    with progress_bar(
        show_progress,
        len(missing) * total_questions(spec, evaluate_on=on, **sizes),
        "questions",
        "q",
    ) as bar:
        evaluations = executor.run([(_evaluation_job, (config_dict, s)) for s in missing], bar)
        shares = list(enumerate(training_shares(config.train_questions)))
        jobs: list[Job] = [
            (_training_job, (config_dict, seed, level, count, held_out_questions(evaluation)))
            for seed, evaluation in zip(missing, evaluations, strict=True)
            for level, count in shares
        ]
        levels = iter(executor.run(jobs, bar))
    for seed, evaluation in zip(missing, evaluations, strict=True):
        train = [example for _ in shares for example in next(levels)]
        write_cache(MathData(config.task, seed, train, evaluation), cache_dir=cache)


@dataclass(frozen=True)
class ArithmeticRun:
    """The arithmetic comparison of ``config``, its questions cached in ``cache_dir``."""

    config: ExperimentConfig
    cache_dir: str
    timing_rounds: int = 30
    #: Timed alone after the arms: nothing else runs on the machine meanwhile.
    timing_beside_arms: bool = False

    def describe(self) -> str:
        return self.config.task

    def prepare(self, executor: Executor, show_progress: bool) -> None:
        _generate_data(self.config, executor, Path(self.cache_dir), show_progress)

    def jobs(self) -> list[tuple[int, str]]:
        return [(seed, arm) for seed in self.config.seeds for arm in self.config.arms]

    def scored_items(self) -> int:
        return 0

    def task(self, seed: int) -> ArithmeticTask:
        config = self.config
        data = load_data(
            config.task,
            seed,
            train_questions=config.train_questions,
            eval_questions=config.eval_questions,
            cache_dir=Path(self.cache_dir),
            evaluate_on=config.evaluate_on,
        )
        return ArithmeticTask(config, data)

    def report(
        self,
        runs: list[dict[str, Any]],
        timing: dict[str, Any],
        run_dir: Path,
        *,
        command: str | None,
        wall_seconds: float,
        workers: int,
    ) -> dict[str, Any]:
        return write_report(
            self.config, runs, timing, run_dir,
            command=command, wall_seconds=wall_seconds, workers=workers,
        )  # fmt: skip


def run_experiment(
    config: ExperimentConfig,
    run_dir: Path,
    *,
    workers: int = 1,
    cache_dir: Path | None = None,
    show_progress: bool = True,
    command: str | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run (or resume) the comparison described by ``config`` in ``run_dir``
    (:func:`~numtok.experiments.scratch.run_scratch`): writes ``results.json``, ``report.md`` and
    ``curves.png`` and returns the results. ``cache_dir``: where generated questions are kept
    (default :func:`default_cache_dir`)."""
    load_mathematics_dataset()  # a missing dependency fails here, before any work
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return run_scratch(
        ArithmeticRun(config, str(cache)), run_dir,
        workers=workers, show_progress=show_progress, command=command, log=log,
    )  # fmt: skip
