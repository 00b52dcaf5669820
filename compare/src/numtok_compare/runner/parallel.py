"""Jobs in worker processes with one shared progress bar.

A run is a list of jobs (module-level functions and their arguments, so that spawned processes
can unpickle them). :func:`open_executor` runs them in this process (``workers == 1``) or in one
pool of spawned processes kept for the whole run; a job reports progress with
:func:`report_progress`, which reaches the bar of the process that waits for the jobs.
"""

from __future__ import annotations

import multiprocessing
import queue
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

__all__ = ["Executor", "Job", "open_executor", "progress_bar", "report_progress"]

Job = tuple[Callable[..., Any], tuple[Any, ...]]

# Where a job reports progress: the pool's queue in a worker process (set by its initialiser),
# a direct bar update in this process.
_progress_sink: Any = None


def _set_progress_sink(sink: Any) -> None:
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

    def set_postfix_str(self, text: str) -> None:
        pass


class Executor:
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
            _set_progress_sink(_BarSink(bar))
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
    """An :class:`Executor` with ``workers`` processes (1: this process)."""
    if workers == 1:
        yield Executor(None, None)
        return
    context = multiprocessing.get_context("spawn")
    progress_queue = context.Queue()
    with ProcessPoolExecutor(
        max_workers=workers,
        mp_context=context,
        initializer=_set_progress_sink,
        initargs=(progress_queue,),
    ) as pool:
        yield Executor(pool, progress_queue)


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
