"""Jobs in worker processes with one shared progress bar.

A run is a list of jobs (module-level functions and their arguments, so that spawned processes
can unpickle them). :func:`open_executor` runs them in this process (``workers == 1``) or in one
pool of spawned processes kept for the whole run, and
:func:`~numtok_compare.runner.ray_executor.open_ray_executor` as Ray tasks (on a
:class:`RayCluster`; imported only then); a job reports progress with
:func:`report_progress`, which reaches the bar of the process that waits for the jobs.
"""

from __future__ import annotations

import multiprocessing
import queue
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "Executor",
    "Job",
    "JobsFailedError",
    "LocalExecutor",
    "RayCluster",
    "ThrottledProgress",
    "open_executor",
    "progress_bar",
    "report_progress",
    "set_progress_sink",
]

Job = tuple[Callable[..., Any], tuple[Any, ...]]

# Where a job reports progress: the pool's queue in a worker process (set by its initialiser),
# a direct bar update in this process.
_progress_sink: Any = None


@dataclass(frozen=True)
class RayCluster:
    """Where and how the jobs run as Ray tasks: ``address``, a running cluster's (None: Ray's
    own choice, ``RAY_ADDRESS`` or a new instance on this machine); ``processes``, how many
    processes train each job (``torchrun`` inside its task), each with ``cpus`` CPUs and ``gpus``
    GPUs; ``retries``, how often a job whose worker was lost runs again."""

    address: str | None = None
    cpus: float = 1.0
    gpus: float = 0.0
    processes: int = 1
    retries: int = 3


class JobsFailedError(RuntimeError):
    """Jobs that raised an error of their own: ``failures`` holds ``(job, error text)``; every
    other job of the call finished and was stored."""

    def __init__(self, failures: Sequence[tuple[str, str]]) -> None:
        self.failures = list(failures)
        listed = "; ".join(f"{job}: {error}" for job, error in self.failures)
        super().__init__(
            f"{len(self.failures)} job(s) failed, the others finished: {listed} (rerun the same "
            "command to run the failed ones again)"
        )


class Executor(Protocol):
    """What runs a list of jobs: :class:`LocalExecutor`, or Ray's
    (:class:`~numtok_compare.runner.ray_executor.RayExecutor`)."""

    def run(
        self, jobs: Sequence[Job], bar: Any, finished: Callable[[int, Any], None] | None = None
    ) -> list[Any]: ...


class ThrottledProgress:
    """Progress passed on to ``send`` summed, at most every ``every`` seconds, for a job whose
    every report would cost a round trip (to Ray's queue actor: once per training step it cost
    a 4000-step job on 2 cores more than Ray's start-up) or a file written; :meth:`flush` sends
    what is left."""

    def __init__(self, send: Callable[[int], None], every: float = 0.5) -> None:
        self.send = send
        self.every = every
        self.unsent = 0
        self.sent_at = time.monotonic()

    def put(self, amount: int) -> None:
        self.unsent += amount
        if time.monotonic() - self.sent_at >= self.every:
            self.flush()

    def flush(self) -> None:
        if self.unsent:
            self.send(self.unsent)
        self.unsent, self.sent_at = 0, time.monotonic()


def set_progress_sink(sink: Any) -> None:
    """Where :func:`report_progress` sends progress in this process (anything with ``put``)."""
    global _progress_sink
    _progress_sink = sink


def report_progress(amount: int) -> None:
    """Advance the run's progress bar by ``amount`` (from inside a job)."""
    _progress_sink.put(amount)


class _BarSink:
    """The in-process progress sink: updates the bar at once."""

    def __init__(self, bar: Any) -> None:
        self.bar = bar

    def put(self, amount: int) -> None:
        self.bar.update(amount)


class _SilentBar:
    def update(self, amount: int) -> None:
        pass


class LocalExecutor:
    """Runs jobs in this process or in a pool; see :func:`open_executor`."""

    def __init__(self, pool: ProcessPoolExecutor | None, progress_queue: Any) -> None:
        self.pool = pool
        self.queue = progress_queue

    def run(
        self, jobs: Sequence[Job], bar: Any, finished: Callable[[int, Any], None] | None = None
    ) -> list[Any]:
        """Results in job order; ``finished(index, result)`` hears of each job as it ends."""
        tell = finished or (lambda _index, _result: None)
        if self.pool is None:
            set_progress_sink(_BarSink(bar))
            results = []
            for index, (fn, args) in enumerate(jobs):
                results.append(fn(*args))
                tell(index, results[-1])
            return results
        futures = [self.pool.submit(fn, *args) for fn, args in jobs]
        pending: set[Future[Any]] = set(futures)
        try:
            while pending:
                ended, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                self._drain(bar)
                for future in ended:
                    tell(futures.index(future), future.result())
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
def open_executor(workers: int) -> Iterator[Executor]:
    """A :class:`LocalExecutor` with ``workers`` processes (1: this process)."""
    if workers == 1:
        yield LocalExecutor(None, None)
        return
    context = multiprocessing.get_context("spawn")
    progress_queue = context.Queue()
    with ProcessPoolExecutor(
        max_workers=workers,
        mp_context=context,
        initializer=set_progress_sink,
        initargs=(progress_queue,),
    ) as pool:
        yield LocalExecutor(pool, progress_queue)


def progress_bar(
    show: bool, total: int, description: str, unit: str
) -> AbstractContextManager[Any]:
    """A tqdm bar on stderr, or a silent stand-in when ``show`` is False."""
    if not show:
        return nullcontext(_SilentBar())
    from tqdm.auto import tqdm

    bar: AbstractContextManager[Any] = tqdm(
        total=total, desc=description, unit=unit, dynamic_ncols=True, file=sys.stderr
    )
    return bar
