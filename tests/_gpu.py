"""How the GPU acceptance tests (the ``gpu`` marker, run by ``benchmarks/gpu.sh``) write their
rows and report section: the ``gpu_section`` fixture of ``tests/conftest.py``."""

from __future__ import annotations

from typing import Any, Protocol


class Section(Protocol):
    """Writes a test's rows and its section of gpu.sh's report so far (``finished=False`` after
    each case, so that a step stopped at its time limit keeps what it measured)."""

    def __call__(self, rows: list[dict[str, Any]], lines: list[str], finished: bool) -> None: ...
