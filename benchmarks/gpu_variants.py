"""The Triton kernel variants a process launches, as the JIT tells them apart: what each step of
``benchmarks/gpu.sh`` would compile on a GPU.

Triton's JIT compiles a kernel once per *variant*: its constexprs (``BLOCK_V=...``, ``num_warps``)
and the specialisation of its other arguments (a tensor's dtype and whether its address is
divisible by 16; an int equal to 1, divisible by 16, or past int32). :func:`describe` writes an
argument as that specialisation sees it, :func:`variant` a launch as one string, so that two
launches with the same string share one binary.

``gpu.sh``'s dry run puts a ``sitecustomize`` into the folder on its ``PYTHONPATH`` that calls
:func:`record_on_import` with ``$GPU_SH_VARIANTS``: every process of a step (pytest's xdist
workers too) appends each launch's kernel and variant to that file, one JSON line each, and the
report counts the variants no earlier step compiled (:mod:`gpu_budget`). Recording only wraps the
kernels of ``numtok.ops.kernels.triton_rows``; it changes nothing they compute.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

#: The kernels of numtok.ops.kernels.triton_rows.
KERNELS = ("prepare_rows", "ce_ntl_rows", "sum_terms", "scale_rows")
MODULE = "numtok.ops.kernels.triton_rows"


def describe(value: Any) -> Any:
    """A launch argument as the JIT's specialisation sees it: a tensor's dtype and whether its
    address is divisible by 16, an int's being 1, divisible by 16 or past int32."""
    if hasattr(value, "data_ptr") and hasattr(value, "dtype"):
        aligned = "/16" if value.data_ptr() % 16 == 0 else ""
        return str(value.dtype).removeprefix("torch.") + aligned
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        if value == 1:
            return "1"
        return ("i64" if abs(value) >= 2**31 else "i32") + ("/16" if value % 16 == 0 else "")
    if isinstance(value, float):
        return "f32"
    return getattr(value, "name", repr(value))  # tl dtypes, constexprs


def variant(args: Sequence[Any], kwargs: dict[str, Any]) -> str:
    """One launch as the JIT's variant: its positional arguments as :func:`describe` writes
    them, then its keyword arguments in name order by value (numtok's launches pass the
    constexprs and ``num_warps`` by keyword, and each value is a variant of its own)."""
    described = [describe(a) for a in args]
    constants = [f"{k}={getattr(v, 'name', v)!r}" for k, v in sorted(kwargs.items())]
    return ", ".join(described + constants)


class Recorded:
    """A kernel of ``triton_rows`` that calls ``record(kernel name, variant)`` before each
    launch and then launches it; every other attribute is the kernel's."""

    def __init__(self, name: str, kernel: Any, record: Callable[[str, str], None]) -> None:
        self._name, self._kernel, self._record = name, kernel, record

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._kernel, attribute)

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        launch = self._kernel[grid]

        def run(*args: Any, **kwargs: Any) -> Any:
            self._record(self._name, variant(args, kwargs))
            return launch(*args, **kwargs)

        return run


def record_into(module: ModuleType, path: Path) -> None:
    """Wrap the kernels of the loaded ``triton_rows`` module so that each launch appends
    ``{"kernel", "variant", "file"}`` to ``path``, ``file`` the test file that launched it under
    pytest (``$PYTEST_CURRENT_TEST``), else "" (once per variant, file and process; short
    appends, so processes writing at once do not mix their lines)."""
    seen: set[tuple[str, str, str]] = set()

    def record(name: str, described: str) -> None:
        test_file = os.environ.get("PYTEST_CURRENT_TEST", "").split("::")[0]
        if (name, described, test_file) not in seen:
            seen.add((name, described, test_file))
            row = {"kernel": name, "variant": described, "file": test_file}
            with path.open("a") as out:
                out.write(json.dumps(row) + "\n")

    for name in KERNELS:
        kernel = getattr(module, name)
        if not isinstance(kernel, Recorded):
            setattr(module, name, Recorded(name, kernel, record))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds ``triton_rows`` with the other finders and wraps its kernels once it has run."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def find_spec(self, name: str, import_path: Any, target: Any = None) -> Any:
        if name != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, import_path)
        if spec is None or spec.loader is None:
            return spec
        loader, path = spec.loader, self.path

        class Loader(importlib.abc.Loader):
            def create_module(self, spec: Any) -> Any:
                return loader.create_module(spec)

            def exec_module(self, module: ModuleType) -> None:
                loader.exec_module(module)  # type: ignore[attr-defined]
                record_into(module, path)

        spec.loader = Loader()
        return spec


def record_on_import(path: str) -> None:
    """Record every launch of this process into ``path`` (see the module docstring)."""
    if path and not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(Path(path)))


def read(path: Path) -> set[tuple[str, str]]:
    """The distinct (kernel, variant) pairs recorded in ``path`` (none if it does not exist)."""
    if not path.is_file():
        return set()
    found = set()
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a time limit
            continue
        found.add((row["kernel"], row["variant"]))
    return found
