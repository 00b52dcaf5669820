"""The one runner of every comparison, from scratch or fine-tuning, in three phases over its jobs
(a :class:`Job` is one seed's arm at one λ):

1. **Validation.** Every job's :class:`Arm` is trained (its ``fit``: the
   ``transformers.Trainer`` of :mod:`~numtok_compare.runner.trainer`; checkpoints, resume,
   logged losses, step times) and
   scored on the validation split; ``validation.json`` stores the answers
   and marks the job done. The trained weights stay in ``model.pt``.
2. **Choice.** Each arm's λ is chosen from the validation answers alone (the caller's rule; one λ
   per arm: nothing to choose). The weights of the λ not chosen are deleted.
3. **Test.** Each seed's arm at its chosen λ is rebuilt from its ``model.pt`` and scored once on
   the test splits; ``test.json`` stores the answers, and ``model.pt`` is deleted.

Under ``torchrun`` every process trains each arm (DDP) and scores its share of each split's items
(:func:`~numtok_compare.runner.run_folder.stored_from_every_process`); the first joins the shares
and stores what one process would have.

What differs between comparisons is their :class:`Models`: how a job's arm is built (the model
initialised from the seed, and how it trains), rebuilt once trained, and scored on a split. Jobs
run in this process or in worker processes (:class:`~numtok_compare.runner.parallel.Executor`): a
:class:`ModelSource` is sent to them and gives each seed's :class:`Models` there. Rerunning the
same settings into the same folder resumes: a finished phase's stored results are read back, an
interrupted training continues from its last checkpoint, an interrupted scoring starts again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import torch

from numtok_compare.config import RunConfig
from numtok_compare.runner.parallel import Executor, report_progress
from numtok_compare.runner.run_folder import (
    WEIGHTS,
    drop_checkpoints,
    process_share,
    share_path,
    stored_from_every_process,
)
from numtok_compare.runner.scoring import WHOLE, Share
from numtok_compare.runner.training_log import Progress, TrainingLog, median_step_seconds

__all__ = [
    "TEST",
    "VALIDATION",
    "Arm",
    "Job",
    "ModelSource",
    "Models",
    "Phases",
    "UntrainedArm",
    "Work",
    "phase_rows",
    "remaining_work",
    "run_phases",
    "score_test",
    "train_and_validate",
]

VALIDATION, TEST = "validation.json", "test.json"


class Job(NamedTuple):
    """One seed's arm at λ = ``weight`` (a plain ``(seed, arm, weight)`` tuple as a key)."""

    seed: int
    arm: str
    weight: float


class Arm(Protocol):
    """A job's arm ready to train: ``fit(directory, progress)`` trains it in ``directory``
    (resuming from a checkpoint there; ``model.pt`` at the end), tells ``progress`` of its steps
    and leaves it in eval mode; ``answerer`` is what :meth:`Models.score` reads once trained
    (the model, or the model with its head's scale)."""

    @property
    def answerer(self) -> Any: ...

    def fit(self, directory: Path, progress: Progress | None) -> TrainingLog: ...


@dataclass
class UntrainedArm:
    """An arm that does not train (the pretrained model, scored as it is)."""

    answerer: Any

    def fit(self, directory: Path, progress: Progress | None) -> TrainingLog:
        return TrainingLog([], [])


class Models(Protocol):
    """What one comparison's models supply to the runner, for one seed's jobs."""

    def build(self, job: Job) -> Arm:
        """The job's arm on the config's device, its weights initialised from ``job.seed`` (the
        same for every arm of a seed)."""
        ...

    def load(self, job: Job, directory: Path) -> Any:
        """The answerer of the job's arm as training left it (rebuilt, and its ``model.pt``
        from ``directory`` loaded; an arm that does not train: as built)."""
        ...

    def score(
        self, answerer: Any, split: str, progress: Progress, share: Share = WHOLE
    ) -> dict[str, Any]:
        """``{"answers": {readout: [answer or None per item]}, ...}`` on ``share`` of
        ``split``'s items (:meth:`Share.of <numtok_compare.runner.scoring.Share.of>` of them and
        the comparison's batch size), lists of one entry per item all through (anything else the
        comparison keeps per item beside the answers); ``progress`` hears of scored items."""
        ...


class ModelSource(Protocol):
    """What the runner sends to a worker process: settings and paths, not data."""

    @property
    def config(self) -> RunConfig: ...

    def models(self, seed: int) -> Models:
        """The models of ``seed``'s jobs (built in the process that runs them)."""
        ...


def _set_threads(config: RunConfig) -> None:
    if torch.device(config.device).type == "cpu":
        torch.set_num_threads(config.threads)


def train_and_validate(
    models: Models, job: Job, directory: Path, progress: Progress
) -> dict[str, Any]:
    """Phase 1 for one job: train it in ``directory`` (resuming from its checkpoint) and score it
    on validation; store (and return) ``validation.json``, then drop the checkpoint.
    ``progress`` hears of every training step and item this process scored. Under torchrun
    every process trains and scores its share (``run_folder.stored_from_every_process``)."""
    directory.mkdir(parents=True, exist_ok=True)
    # A share this process stored before its launch was interrupted may be of other weights (a
    # resumed training need not retrace its steps exactly). Every process deletes its own before
    # training, and none finishes training before all have started (DDP), so none is joined.
    share_path(directory / VALIDATION, process_share()).unlink(missing_ok=True)
    began = time.perf_counter()
    arm = models.build(job)
    log = arm.fit(directory, progress)
    trained_minutes = (time.perf_counter() - began) / 60
    began = time.perf_counter()

    def validated(scored: dict[str, Any]) -> dict[str, Any]:
        return {
            "seed": job.seed, "arm": job.arm, "weight": job.weight, **scored,
            "history": log.history, "seconds_per_step": median_step_seconds(log),
            "train_minutes": trained_minutes,
            "score_minutes": (time.perf_counter() - began) / 60,
            **({} if log.resumed_at is None else {"resumed_at": log.resumed_at}),
        }  # fmt: skip

    stored = stored_from_every_process(
        lambda share: models.score(arm.answerer, "validation", progress, share),
        validated,
        directory / VALIDATION,
    )
    drop_checkpoints(directory)
    return stored


def score_test(
    models: Models, job: Job, directory: Path, splits: Sequence[str], progress: Progress
) -> dict[str, Any]:
    """Phase 3 for one job: rebuild it as training left it in ``directory`` and score it on the
    test ``splits`` (under torchrun, each process its share); store (and return)
    ``test.json``."""
    began = time.perf_counter()

    def scored(share: Share) -> dict[str, Any]:
        answerer = models.load(job, directory)
        return {"splits": {split: models.score(answerer, split, progress, share)
                           for split in splits}}  # fmt: skip

    def tested(scored: dict[str, Any]) -> dict[str, Any]:
        return {
            "seed": job.seed, "arm": job.arm, "weight": job.weight, **scored,
            "score_minutes": (time.perf_counter() - began) / 60,
        }  # fmt: skip

    return stored_from_every_process(scored, tested, directory / TEST)


def _validation_job(source: ModelSource, job: Job, directory: str) -> dict[str, Any]:
    _set_threads(source.config)
    models = source.models(job.seed)
    return train_and_validate(models, job, Path(directory), report_progress)


def _test_job(
    source: ModelSource, job: Job, directory: str, splits: Sequence[str]
) -> dict[str, Any]:
    _set_threads(source.config)
    return score_test(source.models(job.seed), job, Path(directory), splits, report_progress)


def _read(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


@dataclass
class Phases:
    """What :func:`run_phases` did: ``validation[job]`` and ``test[(seed, arm)]`` (the stored
    results) and ``choice`` (``{"chosen": {arm: λ}, ...}``, the choice rule's)."""

    validation: dict[Job, dict[str, Any]]
    choice: dict[str, Any]
    test: dict[tuple[int, str], dict[str, Any]]

    def scorings(self) -> list[dict[str, Any]]:
        """Every stored scoring of one split: each job's on validation, then each test split's."""
        tested = (scored for stored in self.test.values() for scored in stored["splits"].values())
        return [*self.validation.values(), *tested]


@dataclass(frozen=True)
class Work:
    """What a run still has to do: training steps and scored items (a finished phase's stored
    results are not done again)."""

    steps: int
    items: int


def remaining_work(
    jobs: Sequence[Job],
    directories: Mapping[Job, Path],
    *,
    steps: Callable[[Job], int],
    items: Mapping[str, int],
    test_splits: Sequence[str],
) -> Work:
    """Every training step (``steps(job)``) and scored item (``items[split]``) of ``jobs`` not
    yet stored; a job's test splits are counted at its first λ (the one chosen is not known
    yet)."""
    trained = scored = 0
    first: dict[tuple[int, str], Job] = {}
    for job in jobs:
        first.setdefault((job.seed, job.arm), job)
        if not (directories[job] / VALIDATION).exists():
            trained += steps(job)
            scored += items.get("validation", 0)
    for job in first.values():
        if not (directories[job] / TEST).exists():
            scored += sum(items.get(split, 0) for split in test_splits)
    return Work(trained, scored)


def run_phases(
    source: ModelSource,
    jobs: Sequence[Job],
    directories: Mapping[Job, Path],
    *,
    choose: Callable[[Mapping[Job, dict[str, Any]]], dict[str, Any]],
    test_source: Callable[[Mapping[str, Any]], ModelSource] | None = None,
    test_splits: Sequence[str],
    executor: Executor,
    bar: Any,
    log: Callable[[str], None],
) -> Phases:
    """Run (or resume) the three phases of ``jobs`` (each in ``directories[job]``) with
    ``executor``, its progress on ``bar``: validation, the choice (``choose(validation) ->
    {"chosen": {arm: λ}, ...}``), and the test splits (none:
    stop after the choice, the test splits unseen, kept weights and all), scored by
    ``test_source(choice)`` (default: ``source``)."""
    stored = {job: _read(directories[job] / VALIDATION) for job in jobs}
    missing = [job for job, found in stored.items() if found is None]

    def validated(index: int, stored: Any) -> None:
        if index < len(missing):
            job = missing[index]
            log(f"seed {job.seed} {job.arm} λ={job.weight:g}: trained and validation scored")

    outputs = executor.run(
        [(_validation_job, (source, job, str(directories[job]))) for job in missing],
        bar,
        validated,
    )
    ran = dict(zip(missing, outputs, strict=True))
    validation = {job: found if found is not None else ran[job] for job, found in stored.items()}
    choice = choose(validation)
    test: dict[tuple[int, str], dict[str, Any]] = {}
    if test_splits:
        chosen = [job for job in jobs if job.weight == choice["chosen"][job.arm]]
        for job in jobs:
            if job not in chosen:
                (directories[job] / WEIGHTS).unlink(missing_ok=True)
        stored_tests = {job: _read(directories[job] / TEST) for job in chosen}
        untested = [job for job, found in stored_tests.items() if found is None]

        def tested(index: int, stored: Any) -> None:
            log(f"seed {untested[index].seed} {untested[index].arm}: test splits scored")

        scorer = source if test_source is None else test_source(choice)
        scored = executor.run(
            [(_test_job, (scorer, job, str(directories[job]), tuple(test_splits)))
             for job in untested],
            bar,
            tested,
        )  # fmt: skip
        tested_now = dict(zip(untested, scored, strict=True))
        for job in chosen:
            (directories[job] / WEIGHTS).unlink(missing_ok=True)
            found = stored_tests[job]
            test[(job.seed, job.arm)] = found if found is not None else tested_now[job]
    return Phases(validation, choice, test)


def phase_rows(phases: Phases, seeds: Sequence[int], splits: Sequence[str]) -> dict[str, Any]:
    """What every comparison's rows hold of its phases (:mod:`numtok_compare.report` reads
    them): ``answers[split][arm][readout]``, one list of answers per seed that ran the arm at its
    chosen λ, in ``seeds`` order (a seed-free arm such as ``base``: one), for each of
    ``splits``; the ``choice``; one ``runs`` entry per trained job (its λ, logged losses, step
    time and minutes); each tested job's ``test_minutes``; the ``minutes`` of it all; and where
    the scorings kept them, ``readout_bounds[split][arm][readout]`` beside the answers (how far
    each may lie from the exact readout, :mod:`numtok_compare.readout_error`) and
    ``readout_standard_errors[split][arm][readout]`` (each drawn answer's standard error), for
    the readouts every seed's scoring kept them."""
    chosen = phases.choice["chosen"]
    tested = {job: phases.test.get((job.seed, job.arm), {"splits": {}})["splits"]
              for job in phases.validation if job.weight == chosen[job.arm]}  # fmt: skip
    by_arm: dict[str, list[Job]] = {}
    for job in sorted(tested, key=lambda job: list(seeds).index(job.seed)):
        by_arm.setdefault(job.arm, []).append(job)

    def scored(job: Job, split: str) -> dict[str, Any]:
        return phases.validation[job] if split == "validation" else tested[job][split]

    answers = {
        split: {arm: {readout: [scored(job, split)["answers"][readout] for job in jobs]
                      for readout in scored(jobs[0], split)["answers"]}
                for arm, jobs in by_arm.items()}
        for split in splits
    }  # fmt: skip

    def beside(key: str) -> dict[str, Any]:
        """The scorings' ``key`` lists beside the answers, ``[split][arm][readout]``, for the
        readouts every seed's scoring kept them; empty where none did."""
        kept = {
            split: {arm: {readout: [scored(job, split)[key][readout] for job in jobs]
                          for readout in answers[split][arm]
                          if all(readout in scored(job, split).get(key, {}) for job in jobs)}
                    for arm, jobs in by_arm.items()}
            for split in splits
        }  # fmt: skip
        return kept if any(by_r for by_a in kept.values() for by_r in by_a.values()) else {}

    bounds, errors = beside("bounds"), beside("standard_errors")
    validation, test = phases.validation.values(), phases.test.values()
    return {
        "choice": phases.choice,
        "answers": answers,
        **({"readout_bounds": bounds} if bounds else {}),
        **({"readout_standard_errors": errors} if errors else {}),
        "runs": [
            {"seed": r["seed"], "arm": r["arm"], "weight": r["weight"], "history": r["history"],
             "seconds_per_step": r["seconds_per_step"], "train_minutes": r["train_minutes"],
             "validation_minutes": r["score_minutes"],
             **({"resumed_at": r["resumed_at"]} if "resumed_at" in r else {})}
            for r in validation
        ],
        "test_minutes": {f"seed{r['seed']}/{r['arm']}": r["score_minutes"] for r in test},
        "minutes": sum(r["train_minutes"] + r["score_minutes"] for r in validation)
        + sum(r["score_minutes"] for r in test),
    }  # fmt: skip
