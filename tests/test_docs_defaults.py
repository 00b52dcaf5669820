"""The defaults table of ``docs/index.md`` ("Every entry point's defaults") against the
signatures: a cell written as a Python literal (`` `False` ``, `` `"auto"` ``) is the default of
that parameter in every entry point its row names that has the parameter, and at least one has
it; a cell in words ("always", "–", "yours") names a parameter none of them takes."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

import numtok
import numtok.hf

INDEX = Path(__file__).resolve().parents[1] / "docs" / "index.md"
SECTION = "## Every entry point's defaults"
# The table's first column names the entry points; the others are these parameters.
PARAMETERS = ("shift", "logits_free", "cross_entropy", "impl")
NOTHING = object()


def defaults_table(markdown: str) -> list[list[str]]:
    """The cells of the table below :data:`SECTION`, header row first."""
    lines = markdown[markdown.index(SECTION) :].splitlines()[1:]
    rows = []
    for line in lines:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            break
    return [row for row in rows if not set("".join(row)) <= set("- ")]


def entry_points(cell: str) -> dict[str, Any]:
    """The public callables a first cell names: `` `name` `` or `` `Name(...).attach(...)` ``;
    names that are not numtok's (Axolotl's plugin, configured by YAML) are left out."""
    found = {}
    for code in re.findall(r"`([^`]+)`", cell):
        name = re.match(r"\w+", code)
        if name is None:
            continue
        for module in (numtok, numtok.hf):
            if name.group() in module.__all__:
                found[name.group()] = getattr(module, name.group())
    return found


def literal(cell: str) -> object:
    """The Python value a cell opens with, `` `False` `` or `` `"auto"` ``; NOTHING for words."""
    match = re.match(r"`([^`]+)`", cell)
    if match is None:
        return NOTHING
    try:
        return ast.literal_eval(match.group(1))
    except (ValueError, SyntaxError):
        return NOTHING


def check_row(cells: list[str], header: list[str]) -> list[str]:
    """What a row of the table says that the signatures contradict."""
    problems = []
    callables = entry_points(cells[0])
    for column, cell in zip(header[1:], cells[1:], strict=True):
        parameter = column.strip("`")
        value = literal(cell)
        defaults = {
            name: inspect.signature(function).parameters[parameter].default
            for name, function in callables.items()
            if parameter in inspect.signature(function).parameters
        }
        if value is NOTHING:
            problems += [f"{name} takes {parameter}, the table says {cell!r}" for name in defaults]
            continue
        if not defaults:
            problems.append(f"none of {sorted(callables)} takes {parameter}, the table says {cell}")
        problems += [
            f"{name}'s {parameter} defaults to {default!r}, the table says {value!r}"
            for name, default in defaults.items()
            if default != value
        ]
    return problems


def test_the_defaults_table_states_the_signatures() -> None:
    header, *rows = defaults_table(INDEX.read_text(encoding="utf-8"))
    assert tuple(column.strip("`") for column in header[1:]) == PARAMETERS
    checked = [row for row in rows if entry_points(row[0])]
    assert len(checked) >= 5, rows
    assert [problem for row in checked for problem in check_row(row, header)] == []


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ('| `cross_entropy_with_ntl` | `True` | – | numtok\'s | `"auto"` |', "defaults to False"),
        ('| `patch_model` | always | `True` | `"auto"` | `"torch"` |', "defaults to 'auto'"),
        ('| `number_token_loss` | `False` | – | ours | `"auto"` |', "none of"),
        ('| `NTLossForTrainer` | always | `False` | `"auto"` | `"auto"` |', "takes shift"),
    ],
)
def test_a_wrong_row_is_caught(row: str, problem: str) -> None:
    header = ["entry point", *(f"`{parameter}`" for parameter in PARAMETERS)]
    cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
    problems = check_row(cells, header)
    assert len(problems) == 1 and problem in problems[0], problems
