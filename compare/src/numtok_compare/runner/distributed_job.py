"""One job of a run on every process of a ``torchrun`` launch: how a Ray task of
``--job-processes N`` trains its arm on N processes (N GPUs)
(:mod:`~numtok_compare.runner.ray_executor`).

    python -m torch.distributed.run --standalone --nproc-per-node N \\
        -m numtok_compare.runner.distributed_job JOB

``JOB`` holds the pickled job (a module-level function and its arguments). Every process runs it:
the Trainer trains the arm on all of them (``RANK`` and ``WORLD_SIZE`` are torchrun's) and each
scores its share of a split (:mod:`~numtok_compare.runner.phases`). The first process writes what
the task reads back beside ``JOB``: ``.progress.json``, the steps and items it has done so far (at
most every half second), ``.result.pt``, the job's result, or ``.error.json``, the job's error in
one line.
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

from numtok_compare.runner.parallel import ThrottledProgress, set_progress_sink
from numtok_compare.runner.run_folder import save_atomically

__all__ = ["ERROR", "PROGRESS", "RESULT", "main"]

#: What the first process writes beside the job: JSON, and the result as ``torch.save`` writes
#: it (:func:`~numtok_compare.runner.run_folder.save_atomically`).
PROGRESS, RESULT, ERROR = ".progress.json", ".result.pt", ".error.json"


def main(argv: list[str] | None = None) -> None:
    """Run the job in ``argv[0]`` (default: the command line's) on this process."""
    job = Path((argv if argv is not None else sys.argv[1:])[0])
    fn, args = pickle.loads(job.read_bytes())
    first = int(os.environ.get("RANK", "0")) == 0
    done = 0

    def record(amount: int) -> None:
        nonlocal done
        done += amount
        if first:
            save_atomically(done, job.with_name(job.name + PROGRESS))

    progress = ThrottledProgress(record)
    set_progress_sink(progress)
    try:
        result = fn(*args)
    except Exception as error:
        if first:
            text = f"{type(error).__name__}: {error}".splitlines()[0]
            save_atomically(text, job.with_name(job.name + ERROR))
        raise
    progress.flush()
    if first:
        save_atomically(result, job.with_name(job.name + RESULT))


if __name__ == "__main__":
    main()
