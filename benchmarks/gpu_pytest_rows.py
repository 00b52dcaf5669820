"""A pytest plugin for the steps of ``benchmarks/gpu.sh`` that run tests: each test's outcome
written as soon as it is known, so that a run stopped at its time limit keeps every result it
had, and the GPU acceptance tests' rows and report sections (:func:`section`, which
``tests/conftest.py``'s ``gpu_section`` fixture hands them where this plugin is loaded).

``pytest -p gpu_pytest_rows`` (with ``benchmarks/`` on ``PYTHONPATH``) appends to
``$GPU_SH_TEST_ROWS`` one JSON line per test, ``{"test", "outcome", "seconds"}`` (its call's
time, or its set-up's where that failed or skipped it), and first ``{"record": "collected",
"seconds"}``, the time from the start of the session to the first result (the collection and
the first test). Under pytest-xdist the controller writes the lines of every worker's reports.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from gpu_common import write, write_so_far

_STARTED = time.perf_counter()


def _path(config: pytest.Config) -> Path | None:
    if hasattr(config, "workerinput"):  # an xdist worker: the controller writes
        return None
    path = os.environ.get("GPU_SH_TEST_ROWS")
    return Path(path) if path else None


def _append(path: Path, row: dict[str, Any]) -> None:
    with path.open("a") as out:
        out.write(json.dumps(row) + "\n")


class _Rows:
    def __init__(self, path: Path) -> None:
        self.path, self.first = path, True

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        done = report.when == "call" or (report.when == "setup" and not report.passed)
        if not done:
            return
        if self.first:
            self.first = False
            _append(self.path, {"record": "collected", "seconds": time.perf_counter() - _STARTED})
        outcome = "xfailed" if hasattr(report, "wasxfail") and report.skipped else report.outcome
        _append(
            self.path,
            {"test": report.nodeid, "outcome": outcome, "seconds": round(report.duration, 3)},
        )


def section(rows: list[dict[str, Any]], lines: list[str], finished: bool) -> None:
    """A GPU acceptance test's rows and section: ``$GPU_SH_SECTION.jsonl`` and ``.md`` (gpu.sh
    names one per step), rewritten whole; marked as still running until ``finished``."""
    path = os.environ.get("GPU_SH_SECTION")
    if path is None:
        return
    if finished:
        write(Path(path), rows, lines)
    else:
        write_so_far(Path(path), rows, lines)


def pytest_configure(config: pytest.Config) -> None:
    path = _path(config)
    if path is not None:
        config.pluginmanager.register(_Rows(path), "gpu_pytest_rows_writer")
