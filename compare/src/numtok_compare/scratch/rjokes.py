"""The rJokes comparison from scratch, as :func:`~numtok_compare.comparison.run_comparison`
runs it (:class:`RJokesRun`): every (seed, arm) in worker processes (:class:`RJokesTask`: the small
Llama of :mod:`numtok_compare.scratch.arm` on the word tokens of the training jokes, trained by the
``transformers.Trainer``, token arms on the score's digits and ``<eos>``, ``head`` on the
standardised score; scored greedily and by the distribution's mean and median, or by the head), and
the report. Rerunning the same settings into the same folder resumes: finished
phases are read back, interrupted trainings continue from their checkpoints."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from numtok import last_number, predict_numbers
from numtok_compare.comparison import run_comparison
from numtok_compare.design import Design
from numtok_compare.regression_head import RegressionHead
from numtok_compare.runner.batches import Encoded
from numtok_compare.runner.parallel import Executor, RayCluster
from numtok_compare.runner.phases import Job, Phases
from numtok_compare.runner.scoring import (
    WHOLE,
    Share,
    head_predictions,
    readout_bounds,
    storable,
)
from numtok_compare.runner.training_log import Progress
from numtok_compare.scratch.arm import TransformerModels
from numtok_compare.scratch.comparison import (
    RunDescription,
    ScratchComparison,
    jobs_of,
    step_costs,
)
from numtok_compare.scratch.config import RJokesConfig
from numtok_compare.scratch.tokenizer import encode_example, word_tokenizer
from numtok_compare.tasks.rjokes import (
    Joke,
    RJokesData,
    evaluation_subset,
    find_data_dir,
    load_rjokes,
)

__all__ = [
    "PUBLISHED",
    "RJokesRun",
    "RJokesTask",
    "build_tokenizer",
    "prepare_training",
    "run_rjokes",
    "scored_jokes",
]

#: Greedy answers longer than this are cut (a score has at most two digits, then ``<eos>``).
GREEDY_TOKENS = 6


def build_tokenizer(config: RJokesConfig, data: RJokesData) -> Any:
    """The word vocabulary of the training jokes (validation and test jokes are not read)."""
    return word_tokenizer((text for text, _ in data.train), max_words=config.vocabulary_words)


def _encoded(config: RJokesConfig, tokenizer: Any, jokes: Sequence[Joke]) -> list[Encoded]:
    """``jokes`` as prompts (cut to ``max_prompt_tokens`` tokens) and their scores' digits."""
    return [
        encode_example(tokenizer, text, str(score), max_prompt_tokens=config.max_prompt_tokens)
        for text, score in jokes
    ]


# Tokenizer and encoded training jokes per (data, vocabulary settings): a worker process that
# trains several arms builds them once (a few seconds each time otherwise).
_PREPARED: dict[tuple[str, int, int, int], tuple[Any, list[Encoded]]] = {}


def prepare_training(config: RJokesConfig, data: RJokesData) -> tuple[Any, list[Encoded]]:
    """:func:`build_tokenizer` and the encoded training jokes of ``data.train``, built once per
    process for equal data and vocabulary settings."""
    key = (data.digest, len(data.train), config.vocabulary_words, config.max_prompt_tokens)
    if key not in _PREPARED:
        tokenizer = build_tokenizer(config, data)
        _PREPARED.clear()
        _PREPARED[key] = tokenizer, _encoded(config, tokenizer, data.train)
    return _PREPARED[key]


def scored_jokes(config: RJokesConfig, data: RJokesData) -> dict[str, list[Joke]]:
    """The jokes an arm is scored on, ``eval_jokes`` of each split (a fixed subset): validation
    (which the report's learnability gate reads), and the test split unless ``evaluate_on`` is
    ``validation`` (choosing settings)."""
    splits = {"validation": data.validation}
    if config.evaluate_on == "test":
        splits["test"] = data.test
    return {split: evaluation_subset(jokes, config.eval_jokes) for split, jokes in splits.items()}


class RJokesTask(TransformerModels):
    """The rJokes comparison as the runner's :class:`~numtok_compare.runner.phases.Models`: the
    word vocabulary and encoded training jokes of ``data`` (built once per process), and the
    jokes of :func:`scored_jokes`, read out greedily and by the distribution's mean and median
    (token arms, :func:`numtok.predict_numbers`) or by the head."""

    config: RJokesConfig

    def __init__(self, config: RJokesConfig, data: RJokesData) -> None:
        self.config = config
        self.jokes = scored_jokes(config, data)
        self.tokenizer, self.examples = prepare_training(config, data)

    def score(
        self, answerer: nn.Module, split: str, progress: Progress, share: Share = WHOLE
    ) -> dict[str, Any]:
        """``{"answers": {readout: [score or None per joke]}}``, and for token arms ``"mass"``
        (the probability the distribution readouts cover), ``"pruned"`` (what pruning left
        out of the distribution) and ``"bounds"`` (how far each distribution readout may lie
        from the exact one, :func:`~numtok_compare.runner.scoring.readout_bounds`) per joke, on
        ``share`` of ``split``'s scored jokes;
        ``progress`` hears of every ``eval_batch_size`` scored jokes."""
        config = self.config
        jokes = share.of(self.jokes[split], config.eval_batch_size)
        examples = _encoded(config, self.tokenizer, jokes)
        if isinstance(answerer, RegressionHead):
            head = head_predictions(
                answerer, examples, config.eval_batch_size, self.tokenizer.pad_token_id,
                self.scale,
            )  # fmt: skip
            progress(len(examples))
            return {"answers": {"head": head}}
        answers: dict[str, list[float | None]] = {"greedy": [], "expected": [], "median": []}
        mass: list[float] = []
        pruned: list[float] = []
        bounds: dict[str, list[float | None]] = {"expected": [], "median": []}
        for start in range(0, len(examples), config.eval_batch_size):
            chunk = examples[start : start + config.eval_batch_size]
            read = predict_numbers(
                answerer, self.tokenizer, [list(e.prompt) for e in chunk],
                max_digits=config.max_digits, min_probability=config.min_probability,
                new_tokens=GREEDY_TOKENS,
            )  # fmt: skip
            texts = self.tokenizer.batch_decode(
                [list(t) for t in read.greedy], skip_special_tokens=True
            )
            answers["greedy"] += [last_number(text) for text in texts]
            # The mean and median of numbers 0..10^max_digits - 1: finite, NaN without mass.
            answers["expected"] += storable(read.mean.tolist())
            answers["median"] += storable(read.median.tolist())
            mass += read.mass.tolist()
            pruned += read.pruned.tolist()
            read_bounds = readout_bounds(read)
            for readout, bounded in bounds.items():
                bounded += read_bounds[readout]
            progress(len(chunk))
        return {"answers": answers, "mass": mass, "pruned": pruned, "bounds": bounds}


#: The dataset paper's regression baselines, trained on the full 550k-joke train split (not
#: available offline): rJokesData ``analysis/regression_results_base.csv``.
PUBLISHED = (
    "BERT-base Pearson 0.44–0.47, RMSE 1.63–1.88; RoBERTa-base Pearson 0.45–0.47, RMSE 1.64–1.88 "
    "(Weller and Seppi 2020, trained on the full 550k-joke train split)"
)


@dataclass(frozen=True)
class RJokesRun(ScratchComparison):
    """The rJokes comparison of ``config`` on the files in ``data_dir``."""

    config: RJokesConfig
    data_dir: str

    def _data(self) -> RJokesData:
        return load_rjokes(self.data_dir, validation_jokes=self.config.validation_jokes)

    def prepare(self, run_dir: Path, executor: Executor, show_progress: bool) -> None:
        return None  # the files are there (find_data_dir); each worker reads them

    def jobs(self) -> list[Job]:
        # Longest jobs first: the head arms (no vocabulary-sized output, no readout) last.
        return jobs_of(self.config, tuple(sorted(self.config.arms, key=lambda arm: arm == "head")))

    def scored_items(self) -> dict[str, int]:
        return {
            split: len(jokes) for split, jokes in scored_jokes(self.config, self._data()).items()
        }

    def models(self, seed: int) -> RJokesTask:
        return RJokesTask(self.config, self._data())

    def tokenizer(self) -> Any:
        return build_tokenizer(self.config, self._data())

    def description(self, phases: Phases, parameters: int) -> RunDescription:
        """Every seed's prediction for every scored joke: one list of true scores per split."""
        config, data = self.config, self._data()
        jokes = scored_jokes(config, data)
        pruned = max((p for scored in phases.scorings() for p in scored.get("pruned", [])),
                     default=None)  # fmt: skip
        return RunDescription(
            design=_design(config, data, pruned, phases),
            data={"files": data.files, "digest": data.digest,
                  "sizes": {"train": len(data.train), "validation": len(data.validation),
                            "test": len(data.test)},
                  "scored": {split: len(scored) for split, scored in jokes.items()}},
            training_answers=[score for _, score in data.train],
            references={split: [score for _, score in scored] for split, scored in jokes.items()},
        )  # fmt: skip


def _design(config: RJokesConfig, data: RJokesData, pruned: float | None, phases: Phases) -> Design:
    """What an rJokes comparison trained, in the report's words (``pruned``: the most any joke's
    distribution left out, None when no arm read one)."""
    pruning = (
        f"prefixes below {config.min_probability:g} not extended (at most "
        f"{pruned or 0.0:.2g} of a joke's probability left out)"
        if config.min_probability > 0
        else "every prefix enumerated"
    )
    trained = (
        f"a Llama from scratch ({config.n_layers} layers, d={config.d_model}, "
        f"word tokens: the {config.vocabulary_words:,} most frequent training words and the ten "
        f"digits, a joke cut to {config.max_prompt_tokens} tokens), {config.steps} steps × "
        f"{config.batch_size} jokes, the Trainer's AdamW, learning rate {config.learning_rate:g}; "
        f"{config.weights_text()}; the head: squared error on the standardised score. Data: "
        f"rJokes ({', '.join(data.files)}, sha256 {data.digest}), {len(data.train):,} training "
        f"jokes, {config.eval_jokes or 'all'} scored per split. Readouts: greedy decoding, the "
        f"mean (`expected`) and median of the distribution over numbers of up to "
        f"{config.max_digits} digits ({pruning}). A training step (the median over seeds of "
        "each run's median): " + step_costs(phases) + f". Published for scale: {PUBLISHED}."
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
    cluster: RayCluster | None = None,
    show_progress: bool = True,
    command: str | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run (or resume) the rJokes comparison described by ``config`` in ``run_dir``
    (:func:`~numtok_compare.comparison.run_comparison`): writes ``results.json``,
    ``report.md`` and ``report.png`` and returns the results. ``data_dir``: the rJokes ``data/``
    folder (default: :func:`~numtok_compare.tasks.rjokes.default_data_dir`); ``workers`` and
    ``cluster``: :func:`~numtok_compare.comparison.run_comparison`'s."""
    directory = find_data_dir(data_dir)
    return run_comparison(
        RJokesRun(config, str(directory)), run_dir,
        workers=workers, cluster=cluster, show_progress=show_progress, command=command, log=log,
    )  # fmt: skip
