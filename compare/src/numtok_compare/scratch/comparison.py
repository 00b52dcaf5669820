"""A comparison trained from scratch, whatever its task, on the runner of every comparison
(:func:`numtok_compare.runner.phases.run_phases`): :func:`run_scratch` runs every (seed, arm) in
worker processes, trained and scored on validation, then on the test splits (one λ per arm:
nothing to choose), and writes the report.

A task supplies, for one seed, its :class:`~numtok_compare.runner.phases.Models` (the arm built
for the seed, rebuilt once trained, scored on a split); for the whole run (:class:`ScratchRun`), its
data, its jobs and what the report says of it (:class:`RunDescription`: the design, the data, the
true answers), from which :func:`write_scratch_report` writes the stored answers' rows with the one
report writer of every comparison (:mod:`numtok_compare.report`). The arithmetic task is
:class:`numtok_compare.scratch.arithmetic.ArithmeticTask` and
:class:`numtok_compare.scratch.arithmetic.ArithmeticRun`; rJokes
:class:`numtok_compare.scratch.rjokes.RJokesTask` and
:class:`numtok_compare.scratch.rjokes.RJokesRun`.
"""

from __future__ import annotations

import datetime
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from transformers import LlamaForCausalLM

import numtok
from numtok_compare.design import Design
from numtok_compare.report import analyse_and_write
from numtok_compare.report_format import hardware, json_safe
from numtok_compare.runner.parallel import Executor, open_executor, progress_bar
from numtok_compare.runner.phases import (
    Job,
    Models,
    Phases,
    phase_rows,
    remaining_work,
    run_phases,
)
from numtok_compare.runner.run_folder import arm_directory, prepare_run_dir
from numtok_compare.scratch.arm import llama_config
from numtok_compare.scratch.config import TrainingConfig
from numtok_compare.stats import constant_answers

__all__ = [
    "RunDescription",
    "ScratchRun",
    "jobs_of",
    "run_header",
    "run_scratch",
    "step_costs",
    "write_scratch_report",
]


def run_header(
    config: TrainingConfig,
    tokenizer: Any,
    *,
    command: str | None,
    wall_seconds: float,
    workers: int,
) -> dict[str, Any]:
    """The fields every results.json begins with: numtok's version, the date (UTC), the command,
    the hardware, the run's wall time and worker count, the settings and the model's size."""
    return {
        "numtok_version": numtok.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "hardware": hardware(config.device, config.threads),
        "wall_seconds": wall_seconds,
        "workers": workers,
        "config": config.to_dict(),
        "model_parameters": LlamaForCausalLM(llama_config(config, tokenizer)).num_parameters(),
    }


def step_costs(phases: Phases) -> str:
    """Each arm's training step against CE's, the medians over its seeds of each run's median
    step time, in the report's words: ``"was 1.01× CE's, mse 0.98× CE's"``, or ``"CE alone"``
    (runs in parallel worker processes share the machine: the ratios are rough)."""
    seconds: dict[str, list[float]] = {}
    for job, stored in phases.validation.items():
        seconds.setdefault(job.arm, []).append(stored["seconds_per_step"])
    medians = {arm: statistics.median(values) for arm, values in seconds.items()}
    costs = [f"{arm} {median / medians['ce']:.2f}× CE's" for arm, median in medians.items()
             if arm != "ce" and "ce" in medians]  # fmt: skip
    return ", ".join(costs) or "CE alone"


def jobs_of(config: TrainingConfig, arms: tuple[str, ...] | None = None) -> list[Job]:
    """Every seed's arm at its λ, arm by arm in the order of ``arms`` (default: the config's),
    each arm's seeds together."""
    return [Job(seed, arm, config.weight_of(arm)) for arm in arms or config.arms
            for seed in config.seeds]  # fmt: skip


class ScratchRun(Protocol):
    """A whole comparison trained from scratch, as :func:`run_scratch` runs it. It is sent to
    the worker processes, which build each seed's :class:`~numtok_compare.runner.phases.Models`
    from it: it holds settings and paths, not data."""

    @property
    def config(self) -> TrainingConfig: ...

    def describe(self) -> str:
        """What the run compares, for its first status line."""
        ...

    def prepare(self, executor: Executor, show_progress: bool) -> None:
        """Make the data every job reads (for example, generate and cache it)."""
        ...

    def jobs(self) -> list[Job]:
        """Every (seed, arm, λ), in the order the workers take them."""
        ...

    def scored_items(self) -> dict[str, int]:
        """How many items scoring one arm on each split reports to the progress bar."""
        ...

    def models(self, seed: int) -> Models:
        """The models a worker trains and scores ``seed``'s arms with."""
        ...

    def tokenizer(self) -> Any:
        """The models' tokenizer (the report counts the parameters of a model over it)."""
        ...

    def description(self, phases: Phases, parameters: int) -> RunDescription:
        """What the report says of the finished run: ``phases``, every arm's stored results;
        ``parameters``, the model's."""
        ...


@dataclass
class RunDescription:
    """What a task says of its run for the report: ``design`` (what was trained, in the report's
    words, and what it compares), ``data`` (what the report records of the data),
    ``training_answers`` (whose mean, median and mode are the constant answers every arm must
    beat) and ``references`` (each scored split's true answers: one list when every seed answers
    the same items, one list per seed when each seed drew its own)."""

    design: Design
    data: dict[str, Any]
    training_answers: list[float]
    references: dict[str, Any]


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


def run_scratch(
    run: ScratchRun,
    run_dir: Path,
    *,
    workers: int = 1,
    show_progress: bool = True,
    command: str | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run (or resume) ``run`` in ``run_dir``: its data, every (seed, arm) in ``workers``
    processes (each with ``config.threads`` threads; results do not depend on it), the
    report. Finished phases are read back, interrupted trainings continue from their
    checkpoints. ``command``: the command line, recorded in the report; ``log``: where status
    lines go (default: stderr)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    started = time.perf_counter()
    say = log or (lambda text: print(text, file=sys.stderr))
    config = run.config
    run_dir = Path(run_dir)
    prepare_run_dir(config, run_dir)
    _refuse_older_layout(run_dir)
    say(
        f"numtok: {run.describe()}, arms {', '.join(config.arms)}, seeds {list(config.seeds)}, "
        f"{config.steps} steps; run folder {run_dir}"
    )
    jobs = run.jobs()
    directories = {job: arm_directory(run_dir, job.seed, job.arm) for job in jobs}
    items = run.scored_items()
    test_splits = [split for split in items if split != "validation"]
    with open_executor(workers) as executor:
        run.prepare(executor, show_progress)
        work = remaining_work(
            jobs, directories, steps=lambda _: config.steps, items=items, test_splits=test_splits
        )
        with progress_bar(
            show_progress, work.steps + work.items, "training steps + scored items", "it"
        ) as bar:
            phases = run_phases(
                run, jobs, directories,
                choose=lambda _: {"chosen": {arm: config.weight_of(arm) for arm in config.arms},
                                  "means": {}},
                test_splits=test_splits, executor=executor, bar=bar, log=lambda _: None,
            )  # fmt: skip
    header = run_header(
        config, run.tokenizer(), command=command,
        wall_seconds=time.perf_counter() - started, workers=workers,
    )  # fmt: skip
    description = run.description(phases, header["model_parameters"])
    return write_scratch_report(run_dir, phases, header, description)


def write_scratch_report(
    run_dir: Path,
    phases: Phases,
    header: dict[str, Any],
    description: RunDescription,
) -> dict[str, Any]:
    """The rows of a run trained from scratch — every seed's answer to every item of every
    split of ``description.references``, as the runner's ``phases`` stored them
    (:func:`~numtok_compare.runner.phases.phase_rows`) — written with their analysis by
    :func:`~numtok_compare.report.analyse_and_write`; ``header``: the run's
    (:func:`run_header`)."""
    design = description.design
    rows = {
        **header,
        "design": design.to_dict(),
        "data": description.data,
        "preregistration": None,
        "started": header["date"],
        "training_constants": constant_answers(description.training_answers),
        "references": description.references,
        **phase_rows(phases, design.seeds, list(description.references)),
    }
    return analyse_and_write(run_dir, json_safe(rows), preregistered=None)
