"""Run a whole comparison: data for every seed, every (seed, arm) in worker processes, the step
timing, and the report. Rerunning the same settings into the same folder resumes: finished arms
are read back, interrupted ones continue from their checkpoints."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from numtok.experiments.config import ExperimentConfig
from numtok.experiments.parallel import (
    Executor,
    Job,
    open_executor,
    progress_bar,
    report_progress,
)
from numtok.experiments.report import write_report
from numtok.experiments.run_folder import prepare_run_dir
from numtok.experiments.scratch import step_times, train_arm
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

__all__ = ["default_cache_dir", "run_experiment"]

_TIMING = "timing.json"
_TIMING_ROUNDS = 30


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


def _arm_job(
    config_dict: dict[str, Any], seed: int, arm: str, run_dir: str, cache_dir: str
) -> dict[str, Any]:
    config = ExperimentConfig.from_dict(config_dict)
    data = load_data(
        config.task,
        seed,
        train_questions=config.train_questions,
        eval_questions=config.eval_questions,
        cache_dir=Path(cache_dir),
        evaluate_on=config.evaluate_on,
    )
    return train_arm(ArithmeticTask(config, data), seed, arm, Path(run_dir), report_progress)


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
    """Run (or resume) the comparison described by ``config`` in ``run_dir``.

    Writes ``run_dir/results.json``, ``report.md`` and ``curves.png`` and returns the results.
    In this process (``workers == 1``) it sets torch's thread count to ``config.threads``.

    Args:
        workers: processes that run jobs at the same time; each uses ``config.threads`` threads.
            Results do not depend on it.
        cache_dir: where generated questions are kept (default :func:`default_cache_dir`).
        command: the command line, recorded in the report.
        log: where status lines go (default: stderr).
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    load_mathematics_dataset()  # a missing dependency fails here, before any work
    started = time.perf_counter()
    say = log or (lambda text: print(text, file=sys.stderr))
    run_dir = Path(run_dir)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    prepare_run_dir(config, run_dir)
    say(
        f"numtok: {config.task}, arms {', '.join(config.arms)}, seeds {list(config.seeds)}, "
        f"{config.steps} steps; run folder {run_dir}"
    )

    jobs = [(seed, arm) for seed in config.seeds for arm in config.arms]
    with open_executor(workers) as executor:
        _generate_data(config, executor, cache, show_progress)
        with progress_bar(show_progress, len(jobs) * config.steps, "training", "step") as bar:
            arm_jobs: list[Job] = [
                (_arm_job, (config.to_dict(), seed, arm, str(run_dir), str(cache)))
                for seed, arm in jobs
            ]
            results = executor.run(arm_jobs, bar)

    timing_path = run_dir / _TIMING
    if timing_path.exists():
        timing = json.loads(timing_path.read_text())
    else:
        say("numtok: timing one training step per arm (interleaved rounds)...")
        data = load_data(
            config.task,
            config.seeds[0],
            train_questions=config.train_questions,
            eval_questions=config.eval_questions,
            cache_dir=cache,
        )
        timing = step_times(ArithmeticTask(config, data), rounds=_TIMING_ROUNDS)
        timing_path.write_text(json.dumps(timing, indent=1))

    return write_report(
        config,
        results,
        timing,
        run_dir,
        command=command,
        wall_seconds=time.perf_counter() - started,
        workers=workers,
    )
