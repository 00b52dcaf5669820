"""One job of a run on every process of a ``torchrun`` launch: how a Ray task of
``--job-processes N`` trains its arm on N processes (N GPUs)
(:mod:`~numtok_compare.runner.ray_executor`).

    python -m torch.distributed.run --standalone --nproc-per-node N \\
        -m numtok_compare.runner.distributed_job JOB

``JOB`` holds the pickled job (a module-level function and its arguments). Every process runs it:
the Trainer trains the arm on all of them (``RANK`` and ``WORLD_SIZE`` are torchrun's) and each
scores its share of a split (:mod:`~numtok_compare.runner.phases`). The first process writes what
the task reads back beside ``JOB``: ``.progress``, the steps and items it has done so far (at most
every half second), ``.result``, the job's pickled result, or ``.error``, the job's error in one
line.
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from pathlib import Path

from numtok_compare.runner.parallel import set_progress_sink

__all__ = ["ERROR", "PROGRESS", "RESULT", "main"]

PROGRESS, RESULT, ERROR = ".progress", ".result", ".error"
_WRITE_EVERY = 0.5


class _Counter:
    """The first process's progress, its running total written to a file for the task."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.done = 0
        self.written_at = 0.0

    def put(self, amount: int) -> None:
        self.done += amount
        if time.monotonic() - self.written_at >= _WRITE_EVERY:
            self.write()

    def write(self) -> None:
        if self.path is not None:
            _write(self.path, str(self.done).encode())
        self.written_at = time.monotonic()


def _write(path: Path, data: bytes) -> None:
    temporary = path.with_name(f"{path.name}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)


def main(argv: list[str] | None = None) -> None:
    """Run the job in ``argv[0]`` (default: the command line's) on this process."""
    job = Path((argv if argv is not None else sys.argv[1:])[0])
    fn, args = pickle.loads(job.read_bytes())
    first = int(os.environ.get("RANK", "0")) == 0
    counter = _Counter(job.with_name(job.name + PROGRESS) if first else None)
    set_progress_sink(counter)
    try:
        result = fn(*args)
    except Exception as error:
        if first:
            text = f"{type(error).__name__}: {error}".splitlines()[0]
            _write(job.with_name(job.name + ERROR), text.encode())
        raise
    counter.write()
    if first:
        _write(job.with_name(job.name + RESULT), pickle.dumps(result))


if __name__ == "__main__":
    main()
