"""The examples a user copies from must run as shipped."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_the_patched_training_loop_runs_offline(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.argv", ["train_loop_patched.py", "--steps", "2"])
    runpy.run_path(str(EXAMPLES / "train_loop_patched.py"), run_name="__main__")
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["step 0", "step 1"]
    losses = [float(line.split("loss ")[1].split()[0]) for line in lines]
    assert losses[1] < losses[0]  # it trains


def test_quickstart_runs_offline(capsys: pytest.CaptureFixture[str]) -> None:
    runpy.run_path(str(EXAMPLES / "quickstart.py"), run_name="__main__")
    printed = capsys.readouterr().out
    assert "1691 number tokens in a vocabulary of 50304" in printed
    ce, ntl = (float(printed.split(name)[1].split()[0]) for name in ("cross-entropy", "NTL"))
    assert ce > 0 and ntl > 0
