"""The package's layering, where import-linter cannot see it: no module takes a private name
(``_x``) from a public module, and the harness beside the library (``numtok_compare``, the
package numtok-compare) takes from numtok only the names numtok documents as public: those in
the ``__all__`` of ``numtok``, ``numtok.hf`` and ``numtok.readout``. A module is private when a
part of its name is (``numtok._common.*``, ``numtok.hf._head``); its names serve its peers. A
public module's underscore names are its own: what two modules share lives in a public name of a
module below both (``numtok.maths.ntl``, ``numtok.ops.row_algebra``). (The module-level layers
are import-linter contracts in pyproject.toml, run by ``make lint``.)"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "numtok"
HARNESS = Path(__file__).resolve().parent.parent / "compare" / "src" / "numtok_compare"
#: The modules of numtok whose ``__all__`` is the API a client (the harness) may use.
PUBLIC_MODULES = ("numtok", "numtok.hf", "numtok.readout")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_module(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    """The absolute name of the module a ``from ... import`` reads from."""
    if node.level == 0:
        return node.module or ""
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def private_names_from_public_modules(source: str, importer: str, is_package: bool) -> list[str]:
    """``"module.name"`` for every ``from module import _name`` in ``source`` where ``module`` is
    a numtok module whose own name is public."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom):
            continue
        module = _imported_module(node, importer, is_package)
        parts = module.split(".")
        if parts[0] != "numtok" or any(part.startswith("_") for part in parts):
            continue
        found += [
            f"{module}.{alias.name}"
            for alias in node.names
            if alias.name.startswith("_")
            and not alias.name.startswith("__")
            and not _is_module(f"{module}.{alias.name}")  # a private module, imported as a peer
        ]
    return found


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_the_checker_sees_absolute_and_relative_imports() -> None:
    source = (
        "from numtok.losses.token import _LossSpec, Kind\n"
        "from numtok._common.validation import check_bool, _squashed\n"
        "from .fused import _rows\n"
        "from numtok.hf import _head\n"
        "from __future__ import annotations\n"
    )
    assert private_names_from_public_modules(source, "numtok.losses.module", is_package=False) == [
        "numtok.losses.token._LossSpec",
        "numtok.losses.fused._rows",
    ]


def test_no_module_imports_a_private_name_from_a_public_module() -> None:
    offences = {
        _module_name(path): names
        for path in sorted(PACKAGE.rglob("*.py"))
        if (
            names := private_names_from_public_modules(
                path.read_text(encoding="utf-8"),
                _module_name(path),
                is_package=path.name == "__init__.py",
            )
        )
    }
    assert offences == {}, (
        "move what these modules share into a public name of a module below both "
        f"(as numtok.ops.row_algebra for the row algebra): {offences}"
    )


def names_outside_the_public_api(source: str) -> list[str]:
    """``"module.name"`` for every name ``source`` takes from numtok that is not in the
    ``__all__`` of a public module (``import numtok.x`` of any other module counts as well)."""
    public = {module: set(importlib.import_module(module).__all__) for module in PUBLIC_MODULES}
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "numtok":
                continue
            allowed = public.get(node.module, set())
            found += [f"{node.module}.{a.name}" for a in node.names if a.name not in allowed]
        elif isinstance(node, ast.Import):
            found += [
                alias.name
                for alias in node.names
                if alias.name.split(".")[0] == "numtok" and alias.name not in PUBLIC_MODULES
            ]
    return found


def test_the_public_api_checker_sees_private_and_unlisted_names() -> None:
    source = (
        "import numtok\n"
        "import numtok.losses.token\n"
        "from numtok import NumberVocab, __version__\n"
        "from numtok.hf import NTLossForTrainer\n"
        "from numtok.hf._head import causal_lm_of\n"
        "from numtok.readout import MAX_DIGITS, check_max_value\n"
        "from numtok_compare.report import reanalyse\n"
    )
    assert names_outside_the_public_api(source) == [
        "numtok.losses.token",
        "numtok.__version__",
        "numtok.hf._head.causal_lm_of",
        "numtok.readout.check_max_value",
    ]


def test_the_harness_uses_only_numtoks_public_names() -> None:
    offences = {
        str(path.relative_to(HARNESS)): names
        for path in sorted(HARNESS.rglob("*.py"))
        if (names := names_outside_the_public_api(path.read_text(encoding="utf-8")))
    }
    assert offences == {}, (
        "the harness is a client of numtok: make what it needs public (in the __all__ of "
        f"{', '.join(PUBLIC_MODULES)}, with a docstring) or do without it: {offences}"
    )
