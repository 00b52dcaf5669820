"""The rJokes comparison as :func:`~numtok.experiments.scratch.run_scratch` runs it
(:class:`RJokesRun`): every (seed, arm) in worker processes, the step timing beside them, and
the report. Rerunning the same settings into the same folder resumes: finished arms are read
back, interrupted ones continue from their checkpoints."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from numtok.experiments.parallel import Executor
from numtok.experiments.rjokes.config import RJokesConfig
from numtok.experiments.rjokes.report import constant_predictions, write_report
from numtok.experiments.rjokes.train import RJokesTask, build_tokenizer, evaluation_jokes
from numtok.experiments.scratch import run_scratch
from numtok.experiments.tasks.rjokes import RJokesData, find_data_dir, load_rjokes

__all__ = ["RJokesRun", "run_rjokes"]


@dataclass(frozen=True)
class RJokesRun:
    """The rJokes comparison of ``config`` on the files in ``data_dir``."""

    config: RJokesConfig
    data_dir: str
    timing_rounds: int = 20
    #: Timed as one more job: interleaved, so its ratios hold beside another worker, and it
    #: fills the end of the run instead of leaving a core idle.
    timing_beside_arms: bool = True

    def _data(self) -> RJokesData:
        return load_rjokes(self.data_dir, validation_jokes=self.config.validation_jokes)

    def describe(self) -> str:
        return f"rJokes, evaluated on {self.config.evaluate_on}"

    def prepare(self, executor: Executor, show_progress: bool) -> None:
        return None  # the files are there (find_data_dir); each worker reads them

    def jobs(self) -> list[tuple[int, str]]:
        # Longest jobs first: the head arms (no vocabulary-sized output, no readout) last.
        order = sorted(self.config.arms, key=lambda arm: arm == "head")
        return [(seed, arm) for arm in order for seed in self.config.seeds]

    def scored_items(self) -> int:
        return len(evaluation_jokes(self.config, self._data()))

    def task(self, seed: int) -> RJokesTask:
        return RJokesTask(self.config, self._data())

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
        data = self._data()
        evaluated = evaluation_jokes(self.config, data)
        return write_report(
            self.config,
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
            vocabulary_size=len(build_tokenizer(self.config, data)),
            command=command,
            wall_seconds=wall_seconds,
            workers=workers,
        )


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
    """Run (or resume) the rJokes comparison described by ``config`` in ``run_dir``
    (:func:`~numtok.experiments.scratch.run_scratch`): writes ``results.json``, ``report.md``
    and ``report.png`` and returns the results. ``data_dir``: the rJokes ``data/`` folder
    (default: :func:`~numtok.experiments.tasks.rjokes.default_data_dir`)."""
    directory = find_data_dir(data_dir)
    return run_scratch(
        RJokesRun(config, str(directory)), run_dir,
        workers=workers, show_progress=show_progress, command=command, log=log,
    )  # fmt: skip
