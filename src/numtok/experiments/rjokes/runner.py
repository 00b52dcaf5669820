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
from numtok.experiments.report import Design
from numtok.experiments.report_format import run_header
from numtok.experiments.rjokes.config import RJokesConfig
from numtok.experiments.rjokes.train import RJokesTask, build_tokenizer, scored_jokes
from numtok.experiments.scratch import run_scratch, step_costs, write_scratch_report
from numtok.experiments.tasks.rjokes import RJokesData, find_data_dir, load_rjokes

__all__ = ["PUBLISHED", "RJokesRun", "run_rjokes"]

#: The dataset paper's regression baselines, trained on the full 550k-joke train split (not
#: available offline): rJokesData ``analysis/regression_results_base.csv``.
PUBLISHED = (
    "BERT-base Pearson 0.44–0.47, RMSE 1.63–1.88; RoBERTa-base Pearson 0.45–0.47, RMSE 1.64–1.88 "
    "(Weller and Seppi 2020, trained on the full 550k-joke train split)"
)


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
        return sum(len(jokes) for jokes in scored_jokes(self.config, self._data()).values())

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
        """The run's rows (every seed's prediction for every scored joke), written with their
        analysis by the one report writer (:func:`~numtok.experiments.report.analyse_and_write`)."""
        config, data = self.config, self._data()
        jokes = scored_jokes(config, data)
        header = run_header(
            config, len(build_tokenizer(config, data)), command=command,
            wall_seconds=wall_seconds, workers=workers,
        )  # fmt: skip
        return write_scratch_report(
            run_dir, config, runs, timing, header=header,
            design=_design(config, data, runs, timing),
            data={"files": data.files, "digest": data.digest,
                  "sizes": {"train": len(data.train), "validation": len(data.validation),
                            "test": len(data.test)},
                  "scored": {split: len(scored) for split, scored in jokes.items()}},
            training_answers=[score for _, score in data.train],
            references={split: [score for _, score in scored] for split, scored in jokes.items()},
        )  # fmt: skip


def _design(
    config: RJokesConfig, data: RJokesData, runs: list[dict[str, Any]], timing: dict[str, Any]
) -> Design:
    """What an rJokes comparison trained, in the report's words."""
    pruned = [r["pruned"] for r in runs if r["pruned"] is not None]
    pruning = (
        f"prefixes below {config.min_probability:g} not extended (at most "
        f"{max(pruned, default=0.0):.2g} of a joke's probability left out)"
        if config.min_probability > 0
        else "every prefix enumerated"
    )
    trained = (
        f"a decoder-only transformer from scratch ({config.n_layers} layers, d={config.d_model}, "
        f"word tokens: the {config.vocabulary_words:,} most frequent training words and the ten "
        f"digits, a joke cut to {config.max_prompt_tokens} tokens), {config.steps} steps × "
        f"{config.batch_size} jokes, AdamW learning rate {config.learning_rate:g}; "
        f"{config.weights_text()}; the head: squared error on the standardised score. Data: "
        f"rJokes ({', '.join(data.files)}, sha256 {data.digest}), {len(data.train):,} training "
        f"jokes, {config.eval_jokes or 'all'} scored per split. Readouts: greedy decoding, the "
        f"mean (`expected`) and median of the distribution over numbers of up to "
        f"{config.max_digits} digits ({pruning}). A training step (interleaved timing, median): "
        + step_costs(timing)
        + f". Published for scale: {PUBLISHED}."
    )
    return Design(
        title=f"rJokes from scratch: {', '.join(config.arms)}",
        trained=trained,
        seeds=config.seeds,
        arms=config.arms,
        splits=("test",),
        metric="rmse",
        readout="expected",
        max_value=None,
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
