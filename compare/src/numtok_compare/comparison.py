"""The one driver of every comparison, trained from scratch or fine-tuned: :func:`run_comparison`
prepares what its jobs read, runs the three phases of :mod:`numtok_compare.runner.phases`
(validation, the choice of λ, the test splits once) with a progress bar over the training steps
and scored items left, and writes the report from the stored answers
(:func:`~numtok_compare.report.analyse_and_write`).

What differs between comparisons is their :class:`Comparison`: the from-scratch tasks
(:class:`numtok_compare.scratch.comparison.ScratchComparison`: arithmetic, rJokes) and
fine-tuning (:class:`numtok_compare.finetune.comparison.FinetuneComparison`). Rerunning the same
settings into the same folder resumes it.
"""

from __future__ import annotations

import datetime
import sys
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

import numtok
from numtok_compare.report import analyse_and_write
from numtok_compare.report_format import hardware, json_safe
from numtok_compare.runner.parallel import Executor, RayCluster, open_executor, progress_bar
from numtok_compare.runner.phases import (
    Job,
    ModelSource,
    Phases,
    Work,
    phase_rows,
    remaining_work,
    run_phases,
)
from numtok_compare.runner.run_folder import prepare_run_dir

__all__ = ["Comparison", "run_comparison", "work_left"]


class Comparison(ModelSource, Protocol):
    """A whole comparison as :func:`run_comparison` runs it. It is sent to the worker processes,
    which build each seed's :class:`~numtok_compare.runner.phases.Models` from it
    (:meth:`models`): across processes it holds settings and paths, not data."""

    def jobs(self) -> list[Job]:
        """Every (seed, arm, λ) the validation phase trains, in the order the workers take them."""
        ...

    def directory(self, run_dir: Path, job: Job) -> Path:
        """The job's folder in ``run_dir`` (its checkpoints, weights and stored answers)."""
        ...

    def steps(self, job: Job) -> int:
        """The job's training steps (0: an arm scored as it is)."""
        ...

    def scored_items(self) -> dict[str, int]:
        """The items of each split scoring one arm there reports to the progress bar."""
        ...

    @property
    def test_splits(self) -> tuple[str, ...]:
        """The splits scored once after the choice (none: stop there, the test splits unseen)."""
        ...

    def prepare(self, run_dir: Path, executor: Executor, show_progress: bool) -> None:
        """Make what every job reads (generate and cache the data, say), and check that the
        folder's earlier arms were trained on the same model and data."""
        ...

    def choose(self, validation: Mapping[Job, dict[str, Any]]) -> dict[str, Any]:
        """``{"chosen": {arm: λ}, "means": ...}`` from the validation answers alone."""
        ...

    def tested(self, choice: Mapping[str, Any]) -> ModelSource:
        """What the test phase scores with, given the ``choice`` (this comparison, or one whose
        scoring the choice set: the draws per item, say)."""
        ...

    def rows(self, phases: Phases) -> dict[str, Any]:
        """What the report reads of the finished run besides the stored answers: its ``design``,
        ``data``, ``training_constants`` and ``references[split]`` (each scored split's true
        answers: one list, or one list per seed when each seed drew its own items)."""
        ...


def _job_directories(comparison: Comparison, run_dir: Path) -> dict[Job, Path]:
    """Every job of ``comparison``, in its order, with its folder in ``run_dir``."""
    return {job: comparison.directory(run_dir, job) for job in comparison.jobs()}


def work_left(comparison: Comparison, run_dir: Path) -> Work:
    """Every training step and scored item of ``comparison`` not yet stored in ``run_dir``."""
    directories = _job_directories(comparison, run_dir)
    return remaining_work(
        list(directories), directories, steps=comparison.steps,
        items=comparison.scored_items(), test_splits=comparison.test_splits,
    )  # fmt: skip


def _refuse_older_layout(run_dir: Path) -> None:
    """A folder whose arms an older numtok stored is not resumed: before the runner's phases
    (``result.json`` beside the answers; its arms would all be trained again), or trained by
    numtok's own loop and transformer before the Trainer (``timing.json``, its interleaved step
    timing; its stored answers are not this engine's)."""
    older = next(run_dir.glob("seed*/*/result.json"), None) or next(
        run_dir.glob("timing.json"), None
    )
    if older is not None:
        raise ValueError(
            f"the run folder {run_dir} was written by an older numtok ({older}): run into a new "
            "--out"
        )


def _executor(
    workers: int, cluster: RayCluster | None, run_dir: Path
) -> AbstractContextManager[Executor]:
    """The local executor of ``workers`` processes, or Ray's on ``cluster`` (which checks that
    every node sees ``run_dir``)."""
    if cluster is None:
        return open_executor(workers)
    from numtok_compare.runner.ray_executor import open_ray_executor

    return open_ray_executor(cluster, run_dir)


def run_comparison(
    comparison: Comparison,
    run_dir: Path,
    *,
    workers: int = 1,
    cluster: RayCluster | None = None,
    show_progress: bool = False,
    command: str | None = None,
    log: Callable[[str], None] | None = None,
    preregistered: tuple[Path, dict[str, Any]] | None = None,
    registration_check: Mapping[str, Any] | None = None,
    target_effect: float | None = None,
) -> dict[str, Any]:
    """Run (or resume) ``comparison`` in ``run_dir`` and write its report; returns the results
    (as ``results.json`` holds them). ``workers``: processes training jobs at once (1: this
    process); ``cluster``: run the jobs as Ray tasks there instead
    (:mod:`~numtok_compare.runner.ray_executor`); ``show_progress``: a bar on stderr over the
    training steps and scored items left, else a ``log`` line (default: stderr) per finished
    job; ``command``: the command line, recorded in the report; ``preregistered``: the
    registration file the run matched and its record, and ``registration_check`` what the run's
    check against it found (recorded in the rows); ``target_effect``: the report plans a next
    run for it."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    began = time.perf_counter()
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    say = log or (lambda text: print(text, file=sys.stderr))
    config = comparison.config
    run_dir = Path(run_dir)
    _refuse_older_layout(run_dir)
    started = prepare_run_dir(config, run_dir)
    say(f"numtok: arms {', '.join(config.arms)}, seeds {list(config.seeds)}, {config.steps} "
        f"steps; run folder {run_dir}")  # fmt: skip
    directories = _job_directories(comparison, run_dir)
    jobs = list(directories)
    test_splits = comparison.test_splits
    with _executor(workers, cluster, run_dir) as executor:
        comparison.prepare(run_dir, executor, show_progress)
        work = remaining_work(
            jobs, directories, steps=comparison.steps, items=comparison.scored_items(),
            test_splits=test_splits,
        )  # fmt: skip
        with progress_bar(
            show_progress, work.steps + work.items, "training steps + scored items", "it"
        ) as bar:
            phases = run_phases(
                comparison, jobs, directories, choose=comparison.choose,
                test_source=comparison.tested, test_splits=test_splits, executor=executor,
                bar=bar, log=(lambda _: None) if show_progress else say,
            )  # fmt: skip
    described = comparison.rows(phases)
    splits = list(described["references"])
    rows = {
        "numtok_version": numtok.__version__,
        "date": date,
        "command": command,
        "hardware": hardware(config.device, config.threads),
        "wall_seconds": time.perf_counter() - began,
        "workers": workers,
        **({} if cluster is None else {"executor": {"ray": cluster.address or "local"}}),
        "config": config.to_dict(),
        "preregistration": None if preregistered is None else str(preregistered[0]),
        "registration_check": None if registration_check is None else dict(registration_check),
        "started": started,
        **phase_rows(phases, config.seeds, splits),
        **described,
    }
    return analyse_and_write(
        run_dir, json_safe(rows), preregistered=preregistered, target_effect=target_effect
    )
