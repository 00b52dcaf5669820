"""Import DeepMind's ``mathematics_dataset`` 1.0.1 under current sympy and numpy.

The package (2019) needs three fixes, applied here to live module objects at import time; nothing
in site-packages is modified and nothing outside ``mathematics_dataset`` changes:

1. sympy moved ``base_solution_linear`` from the package ``sympy.solvers.diophantine`` to its
   submodule ``sympy.solvers.diophantine.diophantine``. It is re-exported on the package object,
   taken from ``sys.modules`` because the attribute ``diophantine`` of ``sympy.solvers`` is
   shadowed by the function of that name.
2. numpy 2 removed ``np.object`` and 3. ``ndarray.itemset``, both used by
   ``mathematics_dataset.sample.polynomials``. That module's ``np`` global is replaced by a view of
   numpy that adds ``object`` and whose ``zeros``/``empty`` return arrays with an ``itemset``
   method (``a.itemset(index, value)`` is ``a[index] = value``).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

import numpy as np

__all__ = ["load_mathematics_dataset"]


class _ItemsetArray(np.ndarray):
    """An ndarray with numpy 1's ``itemset``, removed in numpy 2."""

    def itemset(self, index: Any, value: Any) -> None:
        self[index] = value


class _Numpy1View(types.ModuleType):
    """numpy as ``mathematics_dataset.sample.polynomials`` expects it (numpy 1 names)."""

    object = object

    def __init__(self) -> None:
        super().__init__("numpy", "numpy with the numpy 1 names mathematics_dataset uses")

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    @staticmethod
    def zeros(*args: Any, **kwargs: Any) -> _ItemsetArray:
        return np.zeros(*args, **kwargs).view(_ItemsetArray)

    @staticmethod
    def empty(*args: Any, **kwargs: Any) -> _ItemsetArray:
        return np.empty(*args, **kwargs).view(_ItemsetArray)


def _reexport_base_solution_linear() -> None:
    importlib.import_module("sympy.solvers.diophantine.diophantine")
    package = sys.modules["sympy.solvers.diophantine"]
    if not hasattr(package, "base_solution_linear"):
        submodule = sys.modules["sympy.solvers.diophantine.diophantine"]
        package.base_solution_linear = submodule.base_solution_linear  # type: ignore[attr-defined]


def load_mathematics_dataset() -> types.ModuleType:
    """Import and fix ``mathematics_dataset``; returns its ``modules.arithmetic`` module.

    Raises:
        ModuleNotFoundError: with the install command, when the package is missing.
    """
    try:
        importlib.import_module("absl")
        importlib.import_module("mathematics_dataset")
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            f"the demo needs DeepMind's Mathematics generator ({error.name} is missing); "
            "install it with: pip install './compare[demo]' in a checkout of numtok "
            "(or: pip install mathematics_dataset==1.0.1 absl-py)"
        ) from error
    _reexport_base_solution_linear()
    polynomials = importlib.import_module("mathematics_dataset.sample.polynomials")
    if not isinstance(getattr(polynomials, "np", None), _Numpy1View):
        setattr(polynomials, "np", _Numpy1View())  # noqa: B010 (a module global, set by name)
    return importlib.import_module("mathematics_dataset.modules.arithmetic")
