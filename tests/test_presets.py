"""Every preset runs through the one comparison command: each as a dry run in the suite (its
settings and flags checked, its plan printed, nothing written), each for two steps in
``make test-slow`` (the from-scratch ones on their own model and tiny data, the fine-tuning ones on
a tiny Llama), and ``numtok repro`` as the alias it now is."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any

import pytest

from numtok.cli import main
from numtok_compare.finetune.config import FinetuneConfig
from numtok_compare.presets import PRESETS
from numtok_compare.scratch.config import RJokesConfig


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder and a cache of their own: a run folder or a download would show."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NUMTOK_CACHE", str(tmp_path / "cache"))
    return tmp_path


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_has_a_dry_run(
    name: str, elsewhere: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = PRESETS[name].config
    assert main(["compare", "--preset", name, "--dry-run", "--steps", "7"]) == 0
    printed = capsys.readouterr().out
    plan = printed.splitlines()[0]
    assert plan.startswith(f"{name}: plan: arms {', '.join(config.arms)} × seeds ")
    trained = config.with_overrides(steps=7).trained_arms()
    assert f"{trained} arms to train × 7 steps of {config.batch_size} examples" in plan
    assert "dry run" in printed
    assert sorted(p.name for p in elsewhere.iterdir()) == []  # no runs/, no cache, no download


def test_one_seed_is_warned_of_before_training(
    elsewhere: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare", "--preset", "smoke", "--seeds", "1", "--dry-run"]) == 0
    assert "one seed gives no interval and so no verdict" in capsys.readouterr().out
    assert main(["compare", "--preset", "smoke", "--seeds", "2", "--dry-run"]) == 0
    assert "one seed" not in capsys.readouterr().out


def test_repro_is_an_alias_of_compare(elsewhere: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "--preset", "add_or_sub-6k", "--dry-run"]) == 0
    compared = capsys.readouterr().out
    assert main(["repro", "--dry-run"]) == 0  # its default preset, as before
    aliased = capsys.readouterr()
    assert aliased.out == compared
    assert aliased.err == "numtok: numtok repro is an alias: running numtok compare --preset " \
        "add_or_sub-6k\n"  # fmt: skip
    assert main(["repro", "--task", "rjokes", "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith("rjokes: plan: arms ce, was, mse, head")


def _jokes(folder: Path) -> Path:
    """rJokes-shaped files: a score 0-11 and a joke per line."""
    folder.mkdir()
    rng = random.Random(0)
    for name, count in (("dev.tsv.gz", 120), ("test.tsv.gz", 40)):
        lines = [f"{rng.randint(0, 11)}\tjoke {i} about {rng.randint(0, 99)} cats\n"
                 for i in range(count)]  # fmt: skip
        with gzip.open(folder / name, "wt", encoding="utf-8") as file:
            file.writelines(lines)
    return folder


def _two_steps(name: str, data_dir: Path, model_dir: Path) -> list[str]:
    """The flags that make preset ``name`` a run of two steps on little data, one seed."""
    config = PRESETS[name].config
    flags = ["--steps", "2", "--seeds", "1", "--no-progress"]
    if isinstance(config, FinetuneConfig):
        flags += ["--model", str(model_dir), "--threads", "1"]
        return flags + (["--data-dir", str(data_dir)] if config.task == "rjokes" else [])
    flags += ["--workers", "1", "--batch-size", "8"]
    if isinstance(config, RJokesConfig):
        return [*flags, "--data-dir", str(data_dir), "--eval-examples", "5"]
    return [*flags, "--train-examples", "64", "--eval-examples", "4"]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_runs_two_steps(
    name: str, tmp_path: Path, tiny_llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NUMTOK_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    flags = _two_steps(name, _jokes(tmp_path / "jokes"), tiny_llama_dir)
    # Splits the tiny files hold, and little to score: these sizes have no flag of their own.
    if isinstance(PRESETS[name].config, FinetuneConfig):
        monkeypatch.setitem(
            PRESETS, name, _smaller(PRESETS[name], train_examples=40, validation_examples=8,
                                    test_examples=8, harder_examples=6, max_prompt_tokens=12)
        )  # fmt: skip
    elif isinstance(PRESETS[name].config, RJokesConfig):
        monkeypatch.setitem(
            PRESETS, name, _smaller(PRESETS[name], validation_jokes=20, vocabulary_words=200)
        )
    assert main(["compare", "--preset", name, *flags, "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["steps"] == 2
    assert (out / "report.md").stat().st_size > 0


def _smaller(preset: Any, **sizes: int) -> Any:
    from dataclasses import replace

    return replace(preset, config=preset.config.with_overrides(**sizes))
