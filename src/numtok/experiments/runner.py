"""Run a whole comparison: data for every seed, every (seed, arm) in worker processes, the step
timing, and the report. Rerunning the same settings into the same folder resumes: finished arms
are read back, interrupted ones continue from their checkpoints."""

from __future__ import annotations

import json
import multiprocessing
import os
import queue
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from numtok.experiments.compat import load_mathematics_dataset
from numtok.experiments.config import ExperimentConfig
from numtok.experiments.data import (
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
from numtok.experiments.report import write_report
from numtok.experiments.timing import measure_step_times
from numtok.experiments.train import train_arm

__all__ = ["default_cache_dir", "prepare_run_dir", "run_experiment"]

_CONFIG = "config.json"
_TIMING = "timing.json"

Job = tuple[Callable[..., Any], tuple[Any, ...]]

# Where a job reports progress: the pool's queue in a worker process (set by its initialiser),
# a direct bar update in this process.
_progress_sink: Any = None


def default_cache_dir() -> Path:
    """``$NUMTOK_CACHE``, else ``$XDG_CACHE_HOME/numtok``, else ``~/.cache/numtok``."""
    if os.environ.get("NUMTOK_CACHE"):
        return Path(os.environ["NUMTOK_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "numtok"


def prepare_run_dir(config: ExperimentConfig, run_dir: Path) -> None:
    """Create ``run_dir`` and record the settings; a folder that holds a run with other settings
    is a ValueError (resuming it with these settings would mix two experiments)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / _CONFIG
    settings = config.to_dict()
    if not path.exists():
        path.write_text(json.dumps(settings, indent=1))
        return
    stored = json.loads(path.read_text())
    if stored != settings:
        changed = sorted(
            k for k in stored.keys() | settings.keys() if stored.get(k) != settings.get(k)
        )
        raise ValueError(
            f"the run folder {run_dir} holds a run with other settings (differing: "
            f"{', '.join(changed)}); choose another --out, or delete the folder to start over"
        )


def _set_progress_sink(sink: Any) -> None:
    global _progress_sink
    _progress_sink = sink


def _report(amount: int) -> None:
    _progress_sink.put(amount)


def _evaluation_job(config_dict: dict[str, Any], seed: int) -> dict[str, list[Example]]:
    config = ExperimentConfig.from_dict(config_dict)
    return generate_evaluation(TASKS[config.task], seed, config.eval_questions, _report)


def _training_job(
    config_dict: dict[str, Any], seed: int, level: int, count: int, held_out: set[str]
) -> list[Example]:
    config = ExperimentConfig.from_dict(config_dict)
    return generate_training(TASKS[config.task], seed, level, count, held_out, _report)


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
    )
    return train_arm(config, seed, arm, data, Path(run_dir), progress=_report)


class _BarSink:
    """The in-process progress sink: updates the bar at once."""

    def __init__(self, bar: Any) -> None:
        self.bar = bar

    def put(self, amount: int) -> None:
        self.bar.update(amount)


class _SilentBar:
    def update(self, amount: int) -> None:
        pass

    def set_postfix_str(self, text: str) -> None:
        pass


class _Executor:
    """Runs jobs in this process (``workers == 1``) or in one pool of spawned processes that is
    kept for the whole run; jobs report progress through :func:`_report`."""

    def __init__(self, pool: ProcessPoolExecutor | None, progress_queue: Any) -> None:
        self.pool = pool
        self.queue = progress_queue

    def run(self, jobs: Sequence[Job], bar: Any) -> list[Any]:
        """Results in job order."""
        if self.pool is None:
            _set_progress_sink(_BarSink(bar))
            return [fn(*args) for fn, args in jobs]
        futures = [self.pool.submit(fn, *args) for fn, args in jobs]
        pending: set[Future[Any]] = set(futures)
        try:
            while pending:
                _, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                self._drain(bar)
            self._drain(bar)
            return [future.result() for future in futures]
        except BaseException:
            for future in pending:
                future.cancel()
            raise

    def _drain(self, bar: Any) -> None:
        while True:
            try:
                bar.update(self.queue.get_nowait())
            except queue.Empty:
                return


@contextmanager
def _executor(workers: int) -> Iterator[_Executor]:
    if workers == 1:
        yield _Executor(None, None)
        return
    context = multiprocessing.get_context("spawn")
    progress_queue = context.Queue()
    with ProcessPoolExecutor(
        max_workers=workers,
        mp_context=context,
        initializer=_set_progress_sink,
        initargs=(progress_queue,),
    ) as pool:
        yield _Executor(pool, progress_queue)


def _bar(show: bool, total: int, description: str, unit: str) -> Any:
    if not show:
        return nullcontext(_SilentBar())
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=description, unit=unit, dynamic_ncols=True, file=sys.stderr)


def _generate_data(
    config: ExperimentConfig, executor: _Executor, cache: Path, show_progress: bool
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
    with _bar(
        show_progress, len(missing) * total_questions(spec, **sizes), "questions", "q"
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
    with _executor(workers) as executor:
        _generate_data(config, executor, cache, show_progress)
        with _bar(show_progress, len(jobs) * config.steps, "training", "step") as bar:
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
        timing = measure_step_times(config, data)
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
