"""Run a whole rJokes comparison: every (seed, arm) in worker processes, the step timing, and
the report. Rerunning the same settings into the same folder resumes: finished arms are read
back, interrupted ones continue from their checkpoints."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from numtok.experiments.parallel import Job, open_executor, progress_bar, report_progress
from numtok.experiments.rjokes.config import RJokesConfig
from numtok.experiments.rjokes.report import constant_predictions, write_report
from numtok.experiments.rjokes.train import RJokesTask, build_tokenizer, evaluation_jokes
from numtok.experiments.run_folder import prepare_run_dir
from numtok.experiments.scratch import step_times, train_arm
from numtok.experiments.tasks.rjokes import find_data_dir, load_rjokes

__all__ = ["run_rjokes"]

_TIMING = "timing.json"
_TIMING_ROUNDS = 20


def _arm_job(
    config_dict: dict[str, Any], seed: int, arm: str, run_dir: str, data_dir: str
) -> dict[str, Any]:
    config = RJokesConfig.from_dict(config_dict)
    data = load_rjokes(data_dir, validation_jokes=config.validation_jokes)
    return train_arm(RJokesTask(config, data), seed, arm, Path(run_dir), report_progress)


def _timing_job(config_dict: dict[str, Any], data_dir: str, run_dir: str) -> dict[str, Any]:
    """One training step of every arm, interleaved, on the first seed's weights and batches;
    stored in the run folder, so a resumed run does not measure again."""
    path = Path(run_dir) / _TIMING
    if path.exists():
        stored: dict[str, Any] = json.loads(path.read_text())
        return stored
    config = RJokesConfig.from_dict(config_dict)
    data = load_rjokes(data_dir, validation_jokes=config.validation_jokes)
    timing = step_times(RJokesTask(config, data), rounds=_TIMING_ROUNDS)
    path.write_text(json.dumps(timing, indent=1))
    return timing


def run_rjokes(
    config: RJokesConfig,
    run_dir: Path,
    *,
    data_dir: Path | str | None = None,
    workers: int = 1,
    show_progress: bool = True,
    command: str | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run (or resume) the rJokes comparison described by ``config`` in ``run_dir``.

    Writes ``run_dir/results.json``, ``report.md`` and ``report.png`` and returns the results.

    Args:
        data_dir: the rJokes ``data/`` folder (default:
            :func:`~numtok.experiments.tasks.rjokes.default_data_dir`).
        workers: processes that train arms at the same time; each uses ``config.threads``
            threads. Results do not depend on it.
        command: the command line, recorded in the report.
        log: where status lines go (default: stderr).
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    started = time.perf_counter()
    say = log or (lambda text: print(text, file=sys.stderr))
    directory = find_data_dir(data_dir)
    data = load_rjokes(directory, validation_jokes=config.validation_jokes)
    run_dir = Path(run_dir)
    prepare_run_dir(config, run_dir)
    say(
        f"numtok: rJokes, arms {', '.join(config.arms)}, seeds {list(config.seeds)}, "
        f"{config.steps} steps, evaluated on {config.evaluate_on}; run folder {run_dir}"
    )
    # Longest jobs first: the head arms (no vocabulary-sized output, no readout) and the step
    # timing (interleaved, so its ratios hold beside another worker) fill the end of the run
    # instead of leaving a core idle.
    order = sorted(config.arms, key=lambda arm: arm == "head")
    jobs: list[Job] = [
        (_arm_job, (config.to_dict(), seed, arm, str(run_dir), str(directory)))
        for arm in order
        for seed in config.seeds
    ]
    work = len(jobs) * (config.steps + len(evaluation_jokes(config, data)))
    jobs.append((_timing_job, (config.to_dict(), str(directory), str(run_dir))))
    with (
        open_executor(workers) as executor,
        progress_bar(show_progress, work, "training steps + scored jokes", "it") as bar,
    ):
        *runs, timing = executor.run(jobs, bar)

    evaluated = evaluation_jokes(config, data)
    return write_report(
        config,
        runs,
        timing,
        run_dir,
        data={
            "files": data.files,
            "digest": data.digest,
            "train": len(data.train),
            "validation": len(data.validation),
            "test": len(data.test),
            "evaluated": len(evaluated),
        },
        constants=constant_predictions(
            [score for _, score in data.train], [score for _, score in evaluated]
        ),
        vocabulary_size=len(build_tokenizer(config, data)),
        command=command,
        wall_seconds=time.perf_counter() - started,
        workers=workers,
    )
