"""The arithmetic comparison from scratch, as :func:`~numtok_compare.comparison.run_comparison`
runs it: DeepMind's Mathematics questions generated for every seed and cached
(:class:`ArithmeticRun`), then every (seed, arm) (:class:`ArithmeticTask`: the small Llama of
:mod:`numtok_compare.scratch.arm` on character tokens, trained by the ``transformers.Trainer``,
scored by greedy decoding), and the report of every comparison (each seed draws its own questions:
items nested in seeds, the paired-seed analysis). Rerunning the same settings into the same folder
resumes: finished phases are read back, interrupted trainings continue from their checkpoints."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from numtok import last_number
from numtok_compare.comparison import run_comparison
from numtok_compare.design import Design
from numtok_compare.runner.parallel import (
    Executor,
    Job,
    RayCluster,
    progress_bar,
    report_progress,
)
from numtok_compare.runner.phases import Job as ArmJob
from numtok_compare.runner.phases import Phases
from numtok_compare.runner.scoring import WHOLE, Share, generate_answers
from numtok_compare.runner.training_log import Progress
from numtok_compare.scratch.arm import TransformerModels
from numtok_compare.scratch.comparison import RunDescription, ScratchComparison, step_costs
from numtok_compare.scratch.config import ExperimentConfig
from numtok_compare.scratch.tokenizer import character_tokenizer, encode_example
from numtok_compare.tasks import default_cache_dir
from numtok_compare.tasks.mathematics import (
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
from numtok_compare.tasks.mathematics_compat import load_mathematics_dataset

__all__ = ["ArithmeticRun", "ArithmeticTask", "run_experiment"]

#: The generator never produces longer answers (``generate_settings.MAX_ANSWER_LENGTH``); one
#: more token leaves room for ``<eos>``.
MAX_ANSWER_TOKENS = 31


class ArithmeticTask(TransformerModels):
    """One seed of the arithmetic comparison as the runner's
    :class:`~numtok_compare.runner.phases.Models`: the character tokenizer, the seed's training
    questions ``data.train``, and greedy answers to the questions of a split."""

    config: ExperimentConfig

    def __init__(self, config: ExperimentConfig, data: MathData) -> None:
        self.config = config
        self.data = data
        self.tokenizer = character_tokenizer()
        self.examples = [encode_example(self.tokenizer, q, a) for q, a in data.train]

    def score(
        self, answerer: nn.Module, split: str, progress: Progress, share: Share = WHOLE
    ) -> dict[str, Any]:
        """``{"answers": {"greedy": [the last number of the answer, or None]}, "texts": [the
        generated answer]}`` for every question of ``share`` of ``split`` (no progress: the bar
        counts training steps only)."""
        questions = share.of(self.data.evaluation[split], self.config.eval_batch_size)
        examples = [encode_example(self.tokenizer, q, a) for q, a in questions]
        texts = generate_answers(
            answerer, self.tokenizer, examples, self.config.eval_batch_size, MAX_ANSWER_TOKENS
        )
        return {"answers": {"greedy": [last_number(text) for text in texts]}, "texts": texts}


def _evaluation_job(config_dict: dict[str, Any], seed: int) -> dict[str, list[Example]]:
    config = ExperimentConfig.from_dict(config_dict)
    return generate_evaluation(TASKS[config.task], seed, config.eval_questions, report_progress)


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
    missing = [
        s for s in config.seeds if read_cache(config.task, s, cache_dir=cache, **sizes) is None
    ]
    if not missing:
        return
    config_dict = config.to_dict()
    with progress_bar(
        show_progress,
        len(missing) * total_questions(spec, **sizes),
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
class ArithmeticRun(ScratchComparison):
    """The arithmetic comparison of ``config``, its questions cached in ``cache_dir``."""

    config: ExperimentConfig
    cache_dir: str

    def prepare(self, run_dir: Path, executor: Executor, show_progress: bool) -> None:
        _generate_data(self.config, executor, Path(self.cache_dir), show_progress)

    def jobs(self) -> list[ArmJob]:
        config = self.config
        return [ArmJob(seed, arm, config.weight_of(arm)) for seed in config.seeds
                for arm in config.arms]  # fmt: skip

    def scored_items(self) -> dict[str, int]:
        return dict.fromkeys(self.config.splits, 0)

    def _data(self, seed: int) -> MathData:
        return load_data(
            self.config.task, seed, train_questions=self.config.train_questions,
            eval_questions=self.config.eval_questions, cache_dir=Path(self.cache_dir),
        )  # fmt: skip

    def models(self, seed: int) -> ArithmeticTask:
        return ArithmeticTask(self.config, self._data(seed))

    def tokenizer(self) -> Any:
        return character_tokenizer()

    def description(self, phases: Phases, parameters: int) -> RunDescription:
        """Every seed's answer to each of its own questions: one list of true answers per seed."""
        config = self.config
        data = [self._data(seed) for seed in config.seeds]
        return RunDescription(
            design=_design(config, parameters, phases),
            data={"generator": "mathematics_dataset", "task": config.task,
                  "sizes": {"train": config.train_questions, "per_split": config.eval_questions}},
            training_answers=[float(answer) for seed in data for _, answer in seed.train],
            references={split: [[float(answer) for _, answer in seed.evaluation[split]]
                                for seed in data] for split in config.splits},
        )  # fmt: skip


#: The test split a run's primary comparison reads: the generator's interpolation test setting.
PRIMARY_SPLIT = "interpolate"


def _design(config: ExperimentConfig, parameters: int, phases: Phases) -> Design:
    """What an arithmetic comparison trained, in the report's words."""
    tested = [split for split in config.splits if split != "validation"]
    trained = (
        f"a Llama from scratch ({config.n_layers} layers, d={config.d_model}, "
        f"{config.n_heads} heads, {parameters:,} parameters, character tokens: the digits "
        f"are the number tokens), {config.steps} steps × {config.batch_size} questions, the "
        f"Trainer's AdamW, learning rate {config.learning_rate:g}, {config.warmup_steps} "
        f"warm-up steps then cosine; {config.weights_text()}; loss on the answer tokens. "
        f"Data: DeepMind's Mathematics generator, {config.task}, each seed its own "
        f"{config.train_questions:,} training questions (easy/medium/hard thirds) and "
        f"{config.eval_questions} held-out questions per split (validation at the training "
        f"difficulties; test: {', '.join(tested) or 'not scored'}). Readout: greedy decoding, "
        "the last number of the answer. A training step (the median over seeds of each run's "
        "median): " + step_costs(phases) + "."
    )
    return Design(
        title=f"CE vs CE + λ·NTL on {config.task}, from scratch: {', '.join(config.arms)}",
        trained=trained,
        seeds=config.seeds,
        arms=config.arms,
        splits=(PRIMARY_SPLIT, *(split for split in tested if split != PRIMARY_SPLIT)),
        metric="log_mae",
        readout="greedy",
        max_value=None,
    )


def run_experiment(
    config: ExperimentConfig,
    run_dir: Path,
    *,
    workers: int = 1,
    cluster: RayCluster | None = None,
    cache_dir: Path | None = None,
    show_progress: bool = True,
    command: str | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run (or resume) the comparison described by ``config`` in ``run_dir``
    (:func:`~numtok_compare.comparison.run_comparison`): writes ``results.json``,
    ``report.md`` and ``report.png`` and returns the results. ``cache_dir``: where generated
    questions are kept (default :func:`~numtok_compare.tasks.default_cache_dir`); ``workers``
    and ``cluster``: :func:`~numtok_compare.comparison.run_comparison`'s."""
    load_mathematics_dataset()  # a missing dependency fails here, before any work
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return run_comparison(
        ArithmeticRun(config, str(cache)), run_dir,
        workers=workers, cluster=cluster, show_progress=show_progress, command=command, log=log,
    )  # fmt: skip
