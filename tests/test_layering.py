"""The package's layering, where import-linter cannot see it: no module takes a private name
(``_x``) from a public module. A module is private when a part of its name is (``numtok._common.*``,
``numtok.hf._head``); its names serve its peers. A public module's underscore names are its own:
what two modules share lives in a public name of a module below both (``numtok.maths.ntl``,
``numtok.ops.row_algebra``). (The module-level layers are import-linter contracts in
pyproject.toml, run by ``make lint``.)"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "numtok"


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
