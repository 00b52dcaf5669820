"""The jobs of a run as Ray tasks (``numtok compare --executor ray``), on this machine or on a
running Ray cluster, with the interface of :class:`~numtok_compare.runner.parallel.Executor`.

* **Resources.** Each job is a task of ``cluster.cpus`` CPUs and ``cluster.gpus`` GPUs, which Ray
  schedules where they are free (with a GPU, Ray sets ``CUDA_VISIBLE_DEVICES``, so ``cuda`` is
  the job's own device). With ``cluster.processes`` above 1 the task asks for that many times
  both and trains the job on as many processes, a ``torchrun`` launch of
  :mod:`~numtok_compare.runner.distributed_job` (one arm of a model that needs several GPUs).
* **A lost worker** (killed, preempted, out of memory) is a system failure: Ray runs the task
  again, up to ``cluster.retries`` times, and the job resumes from the last checkpoint the lost
  attempt wrote into the run folder (:class:`~numtok_compare.runner.trainer.TrainerArm`), not from
  step 0. A job that raises (bad data, a missing file) is not retried: its error is kept,
  the other jobs finish, and then :class:`JobsFailedError` names every failed job with its error.
* **Ctrl-C** cancels this run's tasks (their workers are killed) and leaves the folder, which
  the same command resumes under either executor.
* **The run folder** is the one record: workers write checkpoints and answers into it, so it must
  be on storage every node sees. :func:`check_shared_folder` asks one task on every node to read a
  file the driver wrote there, before any training.

Importing this module imports Ray (numtok-compare's ``ray`` extra); nothing else does.
"""

from __future__ import annotations

import ctypes
import json
import pickle
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ray
import torch
from ray.util.queue import Empty, Queue
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from numtok_compare.runner.distributed_job import ERROR, PROGRESS, RESULT
from numtok_compare.runner.parallel import (
    Job,
    JobsFailedError,
    RayCluster,
    ThrottledProgress,
    set_progress_sink,
)

__all__ = ["RayExecutor", "check_shared_folder", "describe", "open_ray_executor"]

#: The file the driver writes into the run folder for every node to read.
_PROBE = ".ray-shared-folder-check"
#: Seconds between looks at a job's progress file (its processes write it as often).
_LOOK_EVERY = 0.5
#: prctl's option that signals a process when its parent dies (linux/prctl.h).
_PR_SET_PDEATHSIG = 1


def _run_job(queue: Queue, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """A job in a Ray worker, its progress sent to the driver through ``queue``."""
    sink = ThrottledProgress(queue.put)
    set_progress_sink(sink)
    try:
        return fn(*args)
    finally:
        sink.flush()


def _end_with_this_process() -> None:
    """In a child, before it runs: SIGTERM it when the process that started it dies (Linux's
    PR_SET_PDEATHSIG), so that torchrun and its processes end with a killed Ray worker instead
    of training on beside the job's retry."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _run_job_on_processes(
    queue: Queue, fn: Callable[..., Any], args: tuple[Any, ...], processes: int
) -> Any:
    """A job in a Ray worker, trained on ``processes`` processes of a ``torchrun`` launch
    (:mod:`~numtok_compare.runner.distributed_job`), its first process's progress sent on."""
    with tempfile.TemporaryDirectory(prefix="numtok-job-") as folder:
        job = Path(folder) / "job"
        job.write_bytes(pickle.dumps((fn, args)))
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc-per-node={processes}", "-m", "numtok_compare.runner.distributed_job",
                   str(job)]  # fmt: skip
        launch = subprocess.Popen(command, preexec_fn=_end_with_this_process)
        progress, sent = job.with_name(job.name + PROGRESS), 0
        while True:
            ended = launch.poll() is not None
            total = json.loads(progress.read_text()) if progress.exists() else 0
            if total > sent:
                queue.put(total - sent)
                sent = total
            if ended:
                break
            time.sleep(_LOOK_EVERY)
        error = job.with_name(job.name + ERROR)
        if error.exists():
            raise RuntimeError(json.loads(error.read_text()))
        if launch.returncode != 0:
            raise RuntimeError(
                f"torchrun of the job's {processes} processes ended with status "
                f"{launch.returncode} (their output is above)"
            )
        return torch.load(job.with_name(job.name + RESULT), weights_only=False)


def _read_probe(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def describe(fn: Callable[..., Any], args: tuple[Any, ...]) -> str:
    """A job in words: its arm (``seed 0 was λ=0.3``) where one of its arguments is a
    :class:`~numtok_compare.runner.phases.Job`, else its function's name."""
    for argument in args:
        if all(hasattr(argument, name) for name in ("seed", "arm", "weight")):
            return f"seed {argument.seed} {argument.arm} λ={argument.weight:g}"
    return str(getattr(fn, "__name__", fn))


def _error_text(error: BaseException) -> str:
    """The job's own error in one line (the exception raised inside the task, not Ray's
    wrapper with its traceback)."""
    cause = getattr(error, "cause", None) or error
    return f"{type(cause).__name__}: {cause}".splitlines()[0]


class RayExecutor:
    """Runs jobs as Ray tasks of ``cluster``'s resources; see the module docstring."""

    def __init__(self, cluster: RayCluster) -> None:
        self.cluster = cluster
        self.queue = Queue(actor_options={"num_cpus": 0})
        function = _run_job if cluster.processes == 1 else _run_job_on_processes
        self.task = ray.remote(function).options(
            num_cpus=cluster.cpus * cluster.processes, num_gpus=cluster.gpus * cluster.processes,
            max_retries=cluster.retries, retry_exceptions=False,
        )  # fmt: skip

    def run(
        self, jobs: Sequence[Job], bar: Any, finished: Callable[[int, Any], None] | None = None
    ) -> list[Any]:
        """Results in job order; ``finished(index, result)`` hears of each job as it ends. The jobs
        that raised are reported, in job order, after every other job ended
        (:class:`JobsFailedError`)."""
        tell = finished or (lambda _index, _result: None)
        more = () if self.cluster.processes == 1 else (self.cluster.processes,)
        references = [self.task.remote(self.queue, fn, args, *more) for fn, args in jobs]
        index = {reference: position for position, reference in enumerate(references)}
        results: list[Any] = [None] * len(jobs)
        failures: dict[int, tuple[str, str]] = {}
        pending = list(references)
        try:
            while pending:
                ended, pending = ray.wait(pending, num_returns=1, timeout=0.2)
                self._drain(bar)
                for reference in ended:
                    position = index[reference]
                    try:
                        results[position] = ray.get(reference)
                    except ray.exceptions.RayError as error:
                        failures[position] = (describe(*jobs[position]), _error_text(error))
                        continue
                    tell(position, results[position])
            self._drain(bar)
        except BaseException:
            for reference in pending:
                ray.cancel(reference, force=True)
            raise
        if failures:  # in the jobs' order, whichever failed first
            raise JobsFailedError([failures[position] for position in sorted(failures)])
        return results

    def _drain(self, bar: Any) -> None:
        while True:
            try:
                bar.update(self.queue.get_nowait())
            except Empty:
                return


def check_shared_folder(run_dir: Path) -> None:
    """Refuse a run folder that a node of the cluster cannot read: the driver writes a file of
    its own into it and a task on every alive node must read the same text back; otherwise a
    ValueError naming the folder and the nodes."""
    run_dir.mkdir(parents=True, exist_ok=True)
    probe = run_dir / _PROBE
    token = secrets.token_hex(16)
    probe.write_text(token)
    try:
        read = ray.remote(num_cpus=0)(_read_probe)
        nodes = [node["NodeID"] for node in ray.nodes() if node.get("Alive")]  # type: ignore[no-untyped-call]
        answers = ray.get([
            read.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
            ).remote(str(probe.absolute()))
            for node in nodes
        ])  # fmt: skip
    finally:
        probe.unlink(missing_ok=True)
    blind = [node for node, text in zip(nodes, answers, strict=True) if text != token]
    if blind:
        raise ValueError(
            f"the run folder {run_dir} is not on storage every Ray node sees ({len(blind)} of "
            f"{len(nodes)} nodes could not read a file the driver wrote there: "
            f"{', '.join(blind)}): give an --out on a shared file system"
        )


@contextmanager
def open_ray_executor(cluster: RayCluster, run_dir: Path) -> Iterator[RayExecutor]:
    """Ray started on this machine (``cluster.address`` None, and no ``RAY_ADDRESS``) or joined
    at its address, ``run_dir`` checked (:func:`check_shared_folder`), and an executor on it; a
    Ray this call started is shut down after."""
    started = not ray.is_initialized()
    if started:
        ray.init(address=cluster.address, log_to_driver=True, configure_logging=False)
    try:
        check_shared_folder(run_dir)
        yield RayExecutor(cluster)
    finally:
        if started:
            ray.shutdown()
