"""What a user installs (issue 46, item 2): the ``examples`` extra holds what the README's quick
start and ``examples/*.py`` import beyond torch, the README's install steps say how to get torch's
CPU build and name that extra, and the Makefile's comment says what it installs. ``make wheel``
builds without the dev environment."""

from __future__ import annotations

import ast
import contextlib
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11 on
from packaging.requirements import Requirement  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"


def _name(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def _extras() -> dict[str, list[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras: dict[str, list[str]] = project["optional-dependencies"]
    return {"": project["dependencies"], **extras}


def _installed_by(extra: str) -> set[str]:
    """The distributions ``pip install ".[extra]"`` installs (torch, the extra's requirements,
    numtok's own extras they name, and everything those require, as installed here)."""
    extras = _extras()
    pending = [*extras[""], *extras[extra]]
    found: set[str] = set()
    while pending:
        requirement = Requirement(pending.pop())
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = _name(requirement.name)
        if name == "numtok":
            pending += [r for e in requirement.extras for r in extras[e]]
            continue
        if name in found:
            continue
        found.add(name)
        # Not installed here: what it requires is not counted.
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            pending += importlib.metadata.requires(requirement.name) or []
    return found


def _imports(source: str) -> set[str]:
    """The top-level modules a Python source imports (inside ``try`` too)."""
    modules = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module.split(".")[0])
    return modules - set(sys.stdlib_module_names) - {"__future__", "numtok"}


def _readme_blocks() -> list[str]:
    return re.findall(r"```python[^\n]*\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_the_examples_extra_holds_what_the_quick_start_and_the_examples_import() -> None:
    sources = {"README.md": "\n".join(_readme_blocks())} | {
        f"examples/{path.name}": path.read_text() for path in sorted(ROOT.glob("examples/*.py"))
    }
    assert "examples" in _extras(), "no 'examples' extra in pyproject.toml"
    installed = _installed_by("examples")
    owners = importlib.metadata.packages_distributions()
    missing = {
        (where, module)
        for where, source in sources.items()
        for module in _imports(source)
        if not {_name(d) for d in owners.get(module, [module])} & installed
    }
    assert not missing, f'pip install ".[examples]" leaves out what these import: {missing}'


def _install_section() -> str:
    readme = (ROOT / "README.md").read_text()
    return readme.split("[start:install]")[1].split("[end:install]")[0]


def test_the_readme_says_how_to_get_the_cpu_build_and_the_examples_extra() -> None:
    section = _install_section()
    assert f"pip install torch {CPU_INDEX}" in section
    assert 'pip install ".[examples]"' in section
    assert "| `examples` |" in section


def test_the_makefile_comment_says_what_it_installs() -> None:
    makefile = (ROOT / "Makefile").read_text()
    torch = re.search(r"^TORCH := (.+)$", makefile, re.M)
    assert torch is not None
    header = "".join(re.match(r"(?:#[^\n]*\n)+", makefile).group(0))  # type: ignore[union-attr]
    assert f"`{torch.group(1)}`" in header
    # A claim of the CPU build holds only where the install line asks PyTorch's CPU index.
    if re.search(r"pinned to the\s+(#\s+)?CPU wheel", header):
        assert "whl/cpu" in torch.group(1)
    assert CPU_INDEX in " ".join(line.lstrip("# ") for line in header.splitlines())


def _rule(makefile: str, target: str) -> tuple[str, str]:
    """A Makefile rule's prerequisites and recipe."""
    rule = re.search(rf"^{re.escape(target)}:(.*)\n((?:\t.*\n)+)", makefile, re.M)
    assert rule is not None, f"no rule for {target}"
    return rule.group(1), rule.group(2)


def test_make_wheel_builds_in_a_small_environment_of_its_own() -> None:
    """It needed the dev environment (.venv, some GB) to run ``python -m build --no-isolation``."""
    makefile = (ROOT / "Makefile").read_text()
    prerequisites, recipe = _rule(makefile, "wheel")
    assert prerequisites.split() == ["$(BUILD_VENV)/.installed"]
    assert "$(PY)" not in recipe and "$(BUILD_VENV)/bin/python -m build " in recipe
    assert "--no-isolation" not in recipe  # setuptools comes into each build's own environment
    _, setup = _rule(makefile, "$(BUILD_VENV)/.installed")
    installs = re.findall(r"-m pip install --quiet (.+)", setup)
    assert installs == ["--upgrade pip", "build"]
    venv = re.search(r"^BUILD_VENV := (\S+)$", makefile, re.M)
    assert venv is not None and f"{venv.group(1)}/" in (ROOT / ".gitignore").read_text().split()
