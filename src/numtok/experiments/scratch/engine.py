"""A comparison trained from scratch, whatever its task: the run (:func:`run_scratch`: every
(seed, arm) in worker processes, the step timing, the report), the arm job (:func:`train_arm`:
train with the loop every comparison shares, score, store) and the arms' step timing.

A task supplies, for one arm (:class:`ScratchTask`), how to build it for a seed (its model
initialised from the seed, its optimiser, and its training step over the seed's batches) and how
to score a trained model (its answers, stored in the arm's ``predictions.json``); for the whole
run (:class:`ScratchRun`), its data, its jobs and what the report says of it
(:class:`RunDescription`: the design, the data, the true answers), from which
:func:`write_scratch_report` writes the stored answers' rows with the one report writer of every
comparison (:mod:`numtok.experiments.report`). The arithmetic task is
:class:`numtok.experiments.scratch.arithmetic.ArithmeticTask` and
:class:`numtok.experiments.scratch.arithmetic.ArithmeticRun`; rJokes
:class:`numtok.experiments.scratch.rjokes.RJokesTask` and
:class:`numtok.experiments.scratch.rjokes.RJokesRun`.
"""

from __future__ import annotations

import datetime
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

import numtok
from numtok.experiments.loop import (
    Progress,
    Step,
    learning_rate_at,
    median_step_seconds,
    train_with_checkpoints,
)
from numtok.experiments.parallel import (
    Executor,
    Job,
    open_executor,
    progress_bar,
    report_progress,
)
from numtok.experiments.report import Design, analyse_and_write
from numtok.experiments.report_format import hardware, json_safe
from numtok.experiments.run_folder import arm_directory, finish_arm, prepare_run_dir, read_result
from numtok.experiments.scratch.config import TrainingConfig
from numtok.experiments.scratch.model import Transformer
from numtok.experiments.scratch.timing import interleaved_step_times
from numtok.experiments.stats import constant_answers

__all__ = [
    "Arm",
    "RunDescription",
    "Scored",
    "ScratchRun",
    "ScratchTask",
    "run_header",
    "run_scratch",
    "step_costs",
    "step_times",
    "train_arm",
    "write_scratch_report",
]

_TIMING = "timing.json"


@dataclass
class Arm:
    """An arm ready to train: ``step(index, learning_rate) -> (loss, ce, ntl)`` runs one
    optimiser step of ``model`` on the seed's batch ``index``; ``has_ce``/``has_ntl`` say which
    terms it logs."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    step: Step
    has_ce: bool
    has_ntl: bool


@dataclass
class Scored:
    """A trained arm's scores: ``result`` the task's entries of ``result.json``, ``predictions``
    what ``predictions.json`` keeps: ``{"splits": {split: {readout: [answer or None per
    item]}}}`` and anything else the task keeps beside them."""

    result: dict[str, Any]
    predictions: Any


class ScratchTask(Protocol):
    """What a task trained from scratch supplies to :func:`train_arm` and :func:`step_times`."""

    @property
    def config(self) -> TrainingConfig: ...

    @property
    def scored_items(self) -> int:
        """How many items scoring an arm reports to the progress bar."""
        ...

    def build(self, seed: int, arm: str) -> Arm:
        """The arm on ``config.device``, its weights initialised from ``seed`` (the same for every
        arm of a seed)."""
        ...

    def score(self, arm: str, model: nn.Module, progress: Progress) -> Scored: ...


def _silent(_amount: int) -> None:
    return None


def train_arm(
    task: ScratchTask, seed: int, arm: str, run_dir: Path, progress: Progress | None = None
) -> dict[str, Any]:
    """Train and score one arm for one seed; returns (and writes) its result. A finished arm's
    ``result.json`` is read back; an interrupted one resumes from its checkpoint.

    Returns:
        ``{"seed", "arm", "history": [{"step", "loss", "ce", "ntl"}], **the task's scores,
        "median_step_seconds", "train_seconds", "eval_seconds"}``.
    """
    config = task.config
    directory = arm_directory(run_dir, seed, arm)
    stored = read_result(directory)
    if stored is not None:
        if progress is not None:
            progress(config.steps + task.scored_items)
        return stored
    if torch.device(config.device).type == "cpu":
        torch.set_num_threads(config.threads)
    built = task.build(seed, arm)
    log = train_with_checkpoints(
        built.model,
        built.optimizer,
        built.step,
        config,
        directory,
        has_ce=built.has_ce,
        has_ntl=built.has_ntl,
        progress=progress,
    )
    eval_started = time.perf_counter()
    scored = task.score(arm, built.model, progress or _silent)
    result = {
        "seed": seed,
        "arm": arm,
        "history": log.history,
        **scored.result,
        "median_step_seconds": median_step_seconds(log),
        "train_seconds": float(sum(log.step_seconds)),
        "eval_seconds": time.perf_counter() - eval_started,
    }
    return finish_arm(directory, result, scored.predictions)


def step_times(task: ScratchTask, *, rounds: int) -> dict[str, Any]:
    """:func:`~numtok.experiments.scratch.timing.interleaved_step_times` for every arm, on the first
    seed's initial weights and batches."""
    config = task.config
    if torch.device(config.device).type == "cpu":
        torch.set_num_threads(config.threads)
    seed = config.seeds[0]
    return interleaved_step_times(
        {arm: task.build(seed, arm).step for arm in config.arms},
        learning_rate=lambda index: learning_rate_at(index, config),
        batch_size=config.batch_size,
        device=config.device,
        threads=config.threads,
        rounds=rounds,
    )


def run_header(
    config: TrainingConfig,
    vocabulary_size: int,
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
        "model_parameters": Transformer(config.model_config(vocabulary_size)).num_parameters(),
    }


def step_costs(timing: dict[str, Any]) -> str:
    """Each arm's training step against CE's (the medians of :func:`step_times`), in the
    report's words: ``"was 1.01× CE's, mse 0.98× CE's"``, or ``"CE alone"``."""
    arms = timing["arms"]
    costs = [f"{arm} {entry['ratio_to_ce']:.2f}× CE's" for arm, entry in arms.items()
             if arm != "ce" and "ce" in arms]  # fmt: skip
    return ", ".join(costs) or "CE alone"


class ScratchRun(Protocol):
    """A whole comparison trained from scratch, as :func:`run_scratch` runs it. It is sent to
    the worker processes, which rebuild their :class:`ScratchTask` from it: it holds settings and
    paths, not data."""

    @property
    def config(self) -> TrainingConfig: ...

    @property
    def timing_rounds(self) -> int:
        """Interleaved rounds of the step timing."""
        ...

    @property
    def timing_beside_arms(self) -> bool:
        """True: the step timing runs as one more job beside the arms' (a worker would idle
        otherwise); False: alone in this process once every arm has finished."""
        ...

    def describe(self) -> str:
        """What the run compares, for its first status line."""
        ...

    def prepare(self, executor: Executor, show_progress: bool) -> None:
        """Make the data every job reads (for example, generate and cache it)."""
        ...

    def jobs(self) -> list[tuple[int, str]]:
        """Every (seed, arm), in the order the workers take them."""
        ...

    def scored_items(self) -> int:
        """How many items scoring one arm reports to the progress bar."""
        ...

    def task(self, seed: int) -> ScratchTask:
        """The task a worker trains ``seed``'s arms with."""
        ...

    def vocabulary_size(self) -> int:
        """The size of the model's vocabulary (the report counts its parameters)."""
        ...

    def description(
        self, runs: list[dict[str, Any]], timing: dict[str, Any], parameters: int
    ) -> RunDescription:
        """What the report says of the finished run: ``runs``, every arm's result;
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


def _arm_job(run: ScratchRun, seed: int, arm: str, run_dir: str) -> dict[str, Any]:
    return train_arm(run.task(seed), seed, arm, Path(run_dir), report_progress)


def _timing_job(run: ScratchRun, run_dir: str) -> dict[str, Any]:
    """:func:`step_times` on the first seed's task, stored in the run folder so that a resumed
    run does not measure again."""
    path = Path(run_dir) / _TIMING
    if path.exists():
        stored: dict[str, Any] = json.loads(path.read_text())
        return stored
    timing = step_times(run.task(run.config.seeds[0]), rounds=run.timing_rounds)
    path.write_text(json.dumps(timing, indent=1))
    return timing


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
    processes (each with ``config.threads`` threads; results do not depend on it), the step
    timing, the report. Finished arms are read back, interrupted ones continue from their
    checkpoints. ``command``: the command line, recorded in the report; ``log``: where status
    lines go (default: stderr)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    started = time.perf_counter()
    say = log or (lambda text: print(text, file=sys.stderr))
    config = run.config
    run_dir = Path(run_dir)
    prepare_run_dir(config, run_dir)
    say(
        f"numtok: {run.describe()}, arms {', '.join(config.arms)}, seeds {list(config.seeds)}, "
        f"{config.steps} steps; run folder {run_dir}"
    )
    jobs: list[Job] = [(_arm_job, (run, seed, arm, str(run_dir))) for seed, arm in run.jobs()]
    arms = len(jobs)
    if run.timing_beside_arms:
        jobs.append((_timing_job, (run, str(run_dir))))
    with open_executor(workers) as executor:
        run.prepare(executor, show_progress)
        work = arms * (config.steps + run.scored_items())
        with progress_bar(show_progress, work, "training steps + scored items", "it") as bar:
            outputs = executor.run(jobs, bar)
    if run.timing_beside_arms:
        timing = outputs[-1]
    else:
        if not (run_dir / _TIMING).exists():
            say("numtok: timing one training step per arm (interleaved rounds)...")
        timing = _timing_job(run, str(run_dir))
    runs = outputs[:arms]
    header = run_header(
        config, run.vocabulary_size(), command=command,
        wall_seconds=time.perf_counter() - started, workers=workers,
    )  # fmt: skip
    description = run.description(runs, timing, header["model_parameters"])
    return write_scratch_report(run_dir, config, runs, timing, header, description)


def _stored_answers(run_dir: Path, seed: int, arm: str) -> dict[str, Any]:
    """One arm's answers per split and readout, as its task's ``score`` stored them."""
    path = arm_directory(run_dir, seed, arm) / "predictions.json"
    stored: dict[str, Any] = json.loads(path.read_text())
    if "splits" not in stored:
        raise ValueError(
            f"{path} was written by an older numtok (no answers per split): run into a new --out"
        )
    splits: dict[str, Any] = stored["splits"]
    return splits


#: The entries of an arm's ``result.json`` that the rows keep.
_RUN_ENTRIES = ("seed", "arm", "history", "mass", "pruned", "median_step_seconds",
                "train_seconds", "eval_seconds")  # fmt: skip


def write_scratch_report(
    run_dir: Path,
    config: TrainingConfig,
    runs: list[dict[str, Any]],
    timing: dict[str, Any],
    header: dict[str, Any],
    description: RunDescription,
) -> dict[str, Any]:
    """The rows of a run trained from scratch — every seed's answer to every item of every
    split of ``description.references``, read back from each arm's ``predictions.json`` —
    written with their analysis by :func:`~numtok.experiments.report.analyse_and_write`;
    ``header``: the run's (:func:`run_header`); each arm's λ is ``config``'s."""
    design, references = description.design, description.references
    stored = {(r["seed"], r["arm"]): _stored_answers(run_dir, r["seed"], r["arm"]) for r in runs}
    first = design.seeds[0]
    answers = {
        split: {arm: {readout: [stored[(seed, arm)][split][readout] for seed in design.seeds]
                      for readout in stored[(first, arm)][split]}
                for arm in design.arms}
        for split in references
    }  # fmt: skip
    rows = {
        **header,
        "design": design.to_dict(),
        "data": description.data,
        "preregistration": None,
        "started": header["date"],
        "choice": {"chosen": {arm: config.weight_of(arm) for arm in config.arms}, "means": {}},
        "training_constants": constant_answers(description.training_answers),
        "references": references,
        "answers": answers,
        "runs": [{key: r[key] for key in _RUN_ENTRIES if key in r} for r in runs],
        "timing": timing,
        "minutes": sum(r["train_seconds"] + r["eval_seconds"] for r in runs) / 60,
    }
    return analyse_and_write(run_dir, json_safe(rows), preregistered=None)
