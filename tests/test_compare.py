"""``numtok compare`` on a user's JSON Lines: the data reader and its one-line errors, a whole
run from the command line on a tiny random model (report, rows without NaN, resuming, λ chosen on
validation), the learnability gate per comparison, one interval per difference, unparsed answers
scored by one rule, one seed, and pre-registration."""

from __future__ import annotations

import json
import math
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import numtok
from numtok.readout.distribution import FAST_TOLERANCE
from numtok_compare.analysis import comparisons, learnability_gate, metric_table
from numtok_compare.finetune.preregistration import (
    check_preregistration,
    write_preregistration,
)
from numtok_compare.item_metrics import (
    HIGHER_IS_BETTER,
    MEAN_METRICS,
    item_metrics,
    item_scores,
)
from numtok_compare.provenance import git_provenance
from numtok_compare.report import _difference_cells, _gate_lines
from numtok_compare.tasks.jsonl import DataError, read_records, read_user_data

from conftest import without_root_override


def _write(path: Path, lines: list[Any]) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                            for line in lines))  # fmt: skip
    return path


def _sums(count: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    examples = {}
    while len(examples) < count:
        a, b = rng.randint(0, 40), rng.randint(0, 40)
        examples[f"{a}+{b}="] = a + b
    return [{"prompt": prompt, "answer": answer} for prompt, answer in examples.items()]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "data.jsonl:2: not valid JSON"),
        ('["prompt", "answer"]', "data.jsonl:2: expected a JSON object"),
        (
            '{"answer": 3}',
            "data.jsonl:2: field 'prompt' must be a non-empty string, got no 'prompt'",
        ),
        ('{"prompt": "  ", "answer": 3}', "field 'prompt' must be a non-empty string"),
        ('{"prompt": "2+2="}', "data.jsonl:2: field 'answer' is missing"),
        ('{"prompt": "2+2=", "answer": "four"}', "data.jsonl:2: field 'answer' must be a finite"),
        ('{"prompt": "2+2=", "answer": true}', "field 'answer' must be a finite number"),
        ('{"prompt": "2+2=", "answer": NaN}', "field 'answer' must be a finite number"),
        ('{"prompt": "2+2=", "answer": "1e3"}', "field 'answer' must be a finite number"),
        ('{"prompt": "2+2=", "answer": 4, "split": "dev"}', "field 'split' must be one of"),
    ],
)
def test_a_bad_line_is_named_by_file_line_and_field(
    tmp_path: Path, line: str, message: str
) -> None:
    path = _write(tmp_path / "data.jsonl", [{"prompt": "1+1=", "answer": 2}, line])
    with pytest.raises(DataError, match=message.replace("[", r"\[").replace("+", r"\+")):
        read_records(path)


def test_answers_are_trained_as_written(tmp_path: Path) -> None:
    path = _write(tmp_path / "data.jsonl", [
        {"prompt": "a", "answer": 12}, {"prompt": "b", "answer": 1e-7},
        {"prompt": "c", "answer": "0.50"}, {"prompt": "d", "answer": -3.25},
        {"prompt": "e", "answer": 1e16},
    ])  # fmt: skip
    assert [(r.answer, r.value) for r in read_records(path)] == [
        ("12", 12.0), ("0.0000001", 1e-7), ("0.50", 0.5), ("-3.25", -3.25),
        ("10000000000000000", 1e16),
    ]  # fmt: skip


def test_unsplit_data_is_split_by_prompt_with_a_fixed_seed(tmp_path: Path) -> None:
    examples = _sums(100)
    path = _write(tmp_path / "data.jsonl", examples + examples[:5])  # five prompts twice
    data = read_user_data(path)
    assert sum(len(records) for records in data.splits.values()) == 105
    prompts = {s: {r.prompt for r in records} for s, records in data.splits.items()}
    assert not (prompts["train"] & prompts["test"]) and not (
        prompts["validation"] & prompts["test"]
    )
    assert (len(prompts["validation"]), len(prompts["test"])) == (10, 10)
    assert "split 80 / 10 / 10 % with the fixed seed 0" in data.how_split
    assert read_user_data(path).splits == data.splits  # the same every time


def test_split_errors_name_the_examples(tmp_path: Path) -> None:
    named = [{**e, "split": s} for e, s in zip(_sums(4), ["train", "validation", "test", "train"],
                                                strict=True)]  # fmt: skip
    assert [
        len(v) for v in read_user_data(_write(tmp_path / "a.jsonl", named)).splits.values()
    ] == [2, 1, 1]
    mixed = [*named, {"prompt": "9+9=", "answer": 18}]
    with pytest.raises(DataError, match=r"b.jsonl:5: field 'split' is missing, while .*b.jsonl:1"):
        read_user_data(_write(tmp_path / "b.jsonl", mixed))
    empty = [e for e in named if e["split"] != "validation"]
    with pytest.raises(DataError, match="the validation split is empty"):
        read_user_data(_write(tmp_path / "c.jsonl", empty))
    repeated = [*named, {**named[0], "split": "test"}]
    with pytest.raises(
        DataError, match=r"d.jsonl:5: field 'prompt' repeats the prompt of .*d.jsonl:1"
    ):
        read_user_data(_write(tmp_path / "d.jsonl", repeated))


def test_a_folder_gives_its_files_names_as_splits(tmp_path: Path) -> None:
    folder = tmp_path / "task"
    folder.mkdir()
    examples = _sums(6)
    _write(folder / "train.jsonl", examples[:4])
    _write(folder / "validation.jsonl", examples[4:5])
    _write(folder / "test.jsonl", [{**examples[5], "split": "test"}])
    data = read_user_data(folder)
    assert [len(v) for v in data.splits.values()] == [4, 1, 1]
    assert data.how_split == "the splits the data names"
    _write(folder / "test.jsonl", [{**examples[5], "split": "train"}])
    with pytest.raises(DataError, match=r"test.jsonl:1: field 'split' is 'train', but the file"):
        read_user_data(folder)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"must hold .jsonl files, found none"):
        read_user_data(tmp_path / "empty")
    with pytest.raises(DataError, match="no such file or folder"):
        read_user_data(tmp_path / "missing.jsonl")


def _compare(tiny_llama_dir: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return ["compare", "--data", str(data), "--model", str(tiny_llama_dir), "--seeds", "2",
            "--steps", "2", "--batch-size", "4", "--threads", "1", "--adaptation", "full",
            "--learning-rate", "0.01", "--out", str(out), "--no-progress", *extra]  # fmt: skip


def _strict_json(path: Path) -> Any:
    def refuse(constant: str) -> None:
        raise AssertionError(f"{path.name} holds {constant}")

    return json.loads(path.read_text(), parse_constant=refuse)


def test_compare_runs_reports_and_resumes_from_the_command_line(
    tiny_llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from numtok.cli import main

    data = _write(tmp_path / "sums.jsonl", _sums(40))
    out = tmp_path / "run"
    arguments = _compare(tiny_llama_dir, data, out, "--arms", "base,ce,was")
    assert main(arguments) == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert "learnability gate (validation log_mae, " in printed and "primary endpoint" in printed
    assert "  was: " in printed and ", MDE " in printed
    # Before training: the plan, what two seeds cannot show, then the minutes a timed probe
    # expects for what is left.
    plan, warning, estimate = captured.err.splitlines()[:3]
    assert warning.startswith("warning: two seeds: ")
    assert plan.startswith("plan: arms base, ce, was × seeds [0, 1]") and "4 arms to train" in plan
    assert re.fullmatch(
        r"estimate: [\d.]+ min \([\d.]+ training the 8 steps left, [\d.]+ scoring the \d+ "
        r"examples left; a probe: [\d.]+ s a CE step, [\d.]+ s an example\); up to [\d.]+ min "
        r"where the test splits draw more, chosen on validation within the training's time",
        estimate,
    )
    results = _strict_json(out / "results.json")
    largest = max(r.value for r in read_user_data(data).splits["train"])
    assert results["config"]["max_value"] == largest  # --max-value auto: the largest training sum
    assert set(results["answers"]["test"]["ce"]) == {"greedy", "expected", "median", "mode"}
    assert results["gate"]["constant"] in ("mean", "median", "mode")
    # A --data run draws its distribution readouts: each expected answer's standard error kept.
    assert results["config"]["readout_samples"] == 64 and results["largest_unexplored"] is None
    scorings = [json.loads(path.read_text()) for path in out.glob("seed*/*/*.json")]
    errors = [error for scored in scorings
              for error in scored.get("standard_errors", {}).get("expected", [])
              if error is not None]  # fmt: skip
    assert errors and results["sampling_error"]["largest"] == max(errors)
    # The test splits drew what validation chose (--readout-samples auto, the default), the
    # analysis reads them as such, and each interval has its share of variance from the draws.
    chosen = results["choice"]["draws"]  # the rule: tests/test_experiments_draws.py
    assert chosen["validation"] == 64 and chosen["test"] >= 64
    assert set(chosen["needed"]) == {"base − ce", "was − ce"}
    assert set(results["readout_standard_errors"]["test"]["ce"]) == {"expected"}
    assert all("draws_share" in entry for entry in results["comparisons"])
    report = (out / "report.md").read_text()
    for heading in ("## Primary endpoint", "## Learnability gate", "## Settings", "## test",
                    "## validation", "Not pre-registered"):  # fmt: skip
        assert heading in report
    assert "drew 64 numbers per item on validation instead of enumerating them, and " in report
    assert "% draws) |" in report and "The (x % draws) after an interval" in report
    median = results["unparsed_answer"]
    assert f"scores an unparsed answer as the training median ({median:.4g})" in report
    assert report.count("parsed, arm / baseline") == 1 + len(results["answers"])  # every table
    import numtok_compare.finetune.comparison as runner

    monkeypatch.setattr(runner, "build_arm", lambda *a, **k: pytest.fail("trained again"))
    assert main(arguments) == 0
    assert _strict_json(out / "results.json")["answers"] == results["answers"]
    assert "estimate:" not in capsys.readouterr().err  # nothing left: no probe
    with pytest.raises(SystemExit) as stopped:
        main([*arguments, "--steps", "3"])
    error = capsys.readouterr().err
    assert stopped.value.code == 2 and "holds a run with other settings (differing: steps)" in error
    assert error.count("\n") == 1  # one line, no traceback


def test_a_readout_tolerance_enumerates_with_the_bound_beside_each_interval(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    """--readout-tolerance asks for the enumeration (no draws): each item's unexplored mass is
    kept, and the report gives the readouts' bound after every interval."""
    from numtok.cli import main

    data = _write(tmp_path / "sums.jsonl", _sums(40))
    out = tmp_path / "run"
    assert main(_compare(tiny_llama_dir, data, out, "--arms", "ce,was",
                         "--readout-tolerance", "0.05")) == 0  # fmt: skip
    results = _strict_json(out / "results.json")
    assert results["config"]["readout_samples"] is None and "sampling_error" not in results
    unexplored = [u for path in out.glob("seed*/*/*.json")
                  for u in json.loads(path.read_text()).get("unexplored", [])]  # fmt: skip
    assert unexplored and results["largest_unexplored"] == max(unexplored)
    assert set(results["readout_bounds"]["test"]["ce"]) == {"expected", "median", "mode"}
    expected = [e for e in results["comparisons"] if e["readout"] == "expected"]
    assert expected and all(e["readout_bound"] is None or e["readout_bound"] >= 0
                            for e in expected)  # fmt: skip
    report = (out / "report.md").read_text()
    assert f"left at most {results['largest_unexplored']:.2g} of an item's probability" in report
    assert "The ± beside an interval" in report and "] ±0 |" in report


@pytest.mark.parametrize(
    ("flags", "samples"),
    [((), 64), (("--readout-samples", "8"), 8), (("--readout-samples", "none"), None),
     (("--readout-tolerance", "0.01"), None)],
)  # fmt: skip
def test_readout_samples_from_the_command_line(
    tmp_path: Path, flags: tuple[str, ...], samples: int | None
) -> None:
    from numtok_compare.cli import _parser
    from numtok_compare.finetune.command import compare_config

    data = _write(tmp_path / "sums.jsonl", _sums(40))
    args = _parser().parse_args(["compare", "--data", str(data), *flags])
    assert compare_config(args, None).readout_samples == samples


def test_bad_readout_samples_are_named(tmp_path: Path) -> None:
    from numtok_compare.cli import _parser
    from numtok_compare.finetune.command import compare_config

    data = _write(tmp_path / "sums.jsonl", _sums(40))
    for text, message in (("many", "--readout-samples must be an int, 'auto' or 'none', got "
                                   "'many'"),
                          ("1", "readout_samples must be at least 2")):  # fmt: skip
        args = _parser().parse_args(["compare", "--data", str(data), "--readout-samples", text])
        with pytest.raises(ValueError, match=re.escape(message)):
            compare_config(args, None)
    # auto (the default): 64 on validation, the test splits' chosen; a count: that on every split.
    for given, samples, chosen in ((None, 64, True), ("auto", 64, True), ("32", 32, False),
                                   ("none", None, False)):  # fmt: skip
        flags = [] if given is None else ["--readout-samples", given]
        config = compare_config(_parser().parse_args(["compare", "--data", str(data), *flags]),
                                None)  # fmt: skip
        assert (config.readout_samples, config.choose_test_samples) == (samples, chosen)


def test_compare_chooses_lambda_on_validation(
    tiny_llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    from numtok.cli import main

    data = _write(tmp_path / "sums.jsonl", _sums(40))
    out = tmp_path / "grid"
    arguments = _compare(tiny_llama_dir, data, out, "--arms", "ce,was", "--choose-on-validation",
                         "0.3,3", "--max-value", "none", "--metric", "mae")  # fmt: skip
    # First validation only: the test split stays unseen, every λ's weights are kept.
    assert main([*arguments, "--validation-only"]) == 0
    # The estimate counts what this run will do: 6 arms × the validation split, no test split.
    validation = len(read_user_data(data).splits["validation"])
    assert f"scoring the {6 * validation} examples left" in capsys.readouterr().err
    assert not list(out.rglob("test.json")) and len(list(out.rglob("model.pt"))) == 6
    assert "**Not measured: the test splits were not scored**" in (out / "report.md").read_text()
    assert list(_strict_json(out / "results.json")["answers"]) == ["validation"]
    import numtok_compare.finetune.comparison as runner

    train = runner.build_arm
    retrained: list[Any] = []
    monkeypatch.setattr(runner, "build_arm", lambda *a, **k: retrained.append(a) or train(*a, **k))
    assert main(arguments) == 0  # the same command scores the test split, training nothing
    assert retrained == []
    results = _strict_json(out / "results.json")
    assert {p.name for p in (out / "seed0").iterdir()} == {"ce", "was-lambda0.3", "was-lambda3"}
    chosen = results["choice"]["chosen"]["was"]
    means = results["choice"]["means"]["was"]
    (row,) = [
        line
        for line in (out / "report.md").read_text().splitlines()
        if line.startswith("| was | ") and line.count("|") == 5
    ]  # λ=0.3, λ=3, chosen
    assert "the parsed share in brackets" in (out / "report.md").read_text()
    assert "reuse the seeds whose validation answers chose λ" in (out / "report.md").read_text()
    assert all(cell.strip().endswith(")") for cell in row.split("|")[2:4]), row
    defined = {float(w): m for w, m in means.items() if m is not None}
    if defined:
        assert chosen == min(defined, key=lambda w: (defined[w], w))
    for seed in ("seed0", "seed1"):  # the test split is scored for the chosen λ alone
        scored = {p.parent.name for p in (out / seed).glob("was-*/test.json")}
        assert scored == {f"was-lambda{chosen:g}"}
    assert not list(out.rglob("model.pt"))


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([{"prompt": "x" * 70, "answer": 1}], r"data.jsonl:1: field 'prompt' is \d+ tokens"),
        (["oops"], "data.jsonl:1: not valid JSON"),
    ],
)
def test_compare_refuses_bad_data_in_one_line(
    tiny_llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], lines: list[Any],
    message: str,
) -> None:  # fmt: skip
    from numtok.cli import main

    data = _write(tmp_path / "data.jsonl", [*lines, *_sums(30)])
    with pytest.raises(SystemExit) as stopped:
        main(_compare(tiny_llama_dir, data, tmp_path / "run"))
    error = capsys.readouterr().err
    assert stopped.value.code == 2 and error.count("\n") == 1
    assert __import__("re").search(message, error), error
    assert not (tmp_path / "run").exists()  # nothing written before the checks pass


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--out", "{tmp}/a-file"], "--out {tmp}/a-file cannot be the run folder: it is a file"),
        (
            ["--out", "{tmp}/a-file/x"],
            "--out {tmp}/a-file/x cannot be the run folder: {tmp}/a-file is a file, not a folder",
        ),
        (["--model", "/nonexistent"], "--model /nonexistent: the folder does not exist"),
        (["--model", "{tmp}/a-file"], "--model {tmp}/a-file is a file, not a model folder"),
        (["--preregister", "{tmp}"], "--preregister {tmp} is a folder, not a file"),
        (["--preregister", "{tmp}/a-file"], "--preregister {tmp}/a-file is not a pre-registration"),
        (["--data", "{tmp}/missing.jsonl"], "{tmp}/missing.jsonl: no such file or folder"),
        (["--data", "{tmp}/latin1.jsonl"], "{tmp}/latin1.jsonl: not UTF-8 text"),
        (["--data", "{tmp}/bad.jsonl"], "{tmp}/bad.jsonl:1: not valid JSON"),
    ],
)
def test_compare_refuses_bad_paths_in_one_line_before_loading_the_model(
    tiny_llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch, flags: list[str], message: str,
) -> None:  # fmt: skip
    """Each path flag's error is one line naming the flag, and it comes before the model is
    loaded or built (which took 6-21 s, 85 s where SmolLM2 was built first)."""
    import numtok_compare.finetune.comparison as runner
    import numtok_compare.pretrained as pretrained
    from numtok.cli import main

    def too_late(*_: Any, **__: Any) -> Any:
        pytest.fail("the model was loaded before the arguments and the data were checked")

    monkeypatch.setattr(runner, "prepare", too_late)
    monkeypatch.setattr(pretrained, "ensure_smollm2", too_late)
    (tmp_path / "a-file").write_text("x\n")
    (tmp_path / "latin1.jsonl").write_bytes('{"prompt": "é", "answer": 1}\n'.encode("latin-1"))
    (tmp_path / "bad.jsonl").write_text("oops\n")
    data = _write(tmp_path / "data.jsonl", _sums(30))
    arguments = _compare(tiny_llama_dir, data, tmp_path / "run", "--max-value", "none")
    arguments += [flag.format(tmp=tmp_path) for flag in flags]  # the last of a flag counts
    with pytest.raises(SystemExit) as stopped:
        main(arguments)
    (line,) = capsys.readouterr().err.splitlines()
    assert stopped.value.code == 2
    assert line.startswith(f"numtok: error: {message.format(tmp=tmp_path)}"), line
    assert not (tmp_path / "run").exists()


# A real process each (3 s): the run folder in make test, the three reads slow.
@pytest.mark.parametrize(
    "what",
    ["out", *(pytest.param(what, marks=pytest.mark.slow)
             for what in ("data file", "data folder", "preregistration"))],
)  # fmt: skip
def test_compare_refuses_paths_without_permission_in_one_line(tmp_path: Path, what: str) -> None:
    """A run folder in a folder it may not write, data it may not read: one line, in a real
    process (as root: without the capabilities that bypass file permissions)."""
    (tmp_path / "data").mkdir()
    data = _write(tmp_path / "data" / "data.jsonl", _sums(30))
    (tmp_path / "locked").mkdir()
    registered = tmp_path / "registered.json"
    registered.write_text("{}\n")
    flags = {
        "out": ["--data", str(data), "--out", str(tmp_path / "locked" / "run")],
        "data file": ["--data", str(data)],
        "data folder": ["--data", str(tmp_path / "data")],
        "preregistration": ["--data", str(data), "--preregister", str(registered)],
    }[what]
    locked = {"out": tmp_path / "locked", "data file": data, "data folder": tmp_path / "data",
              "preregistration": registered}[what]  # fmt: skip
    expected = {
        "out": f"--out {tmp_path / 'locked' / 'run'} cannot be the run folder: no permission "
        f"to write in {tmp_path / 'locked'}",
        "data file": f"{data}: cannot read the file (Permission denied)",
        "data folder": f"{tmp_path / 'data'}: cannot read the folder (Permission denied)",
        "preregistration": f"--preregister {registered}: cannot read the file (Permission denied)",
    }[what]
    locked.chmod(0o555 if what == "out" else 0)
    try:
        done = subprocess.run(
            [*without_root_override(), sys.executable, "-m", "numtok.cli", "compare", *flags,
             "--model", str(tmp_path), "--max-value", "none"],  # a folder: checked later
            capture_output=True, text=True, timeout=300, check=False,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )  # fmt: skip
    finally:
        locked.chmod(0o755)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [f"numtok: error: {expected}"]


def _learnt(references: np.ndarray, spread: float, seeds: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([references + rng.normal(0, spread, len(references)).round()
                     for _ in range(seeds)])  # fmt: skip


def _run(seeds: int = 3, items: int = 200) -> tuple[Any, Any, dict[str, float]]:
    """Answers of a run where CE and MSE learnt (MSE better) and WAS answers the training
    median to every item (it learnt nothing), with the references of both splits."""
    rng = np.random.default_rng(0)
    references = {s: rng.integers(0, 100, items).astype(np.float64)
                  for s in ("validation", "test")}  # fmt: skip
    answers = {
        split: {"ce": {"greedy": _learnt(truth, 10, seeds, 1)},
                "was": {"greedy": np.full((seeds, items), 50.0)},
                "mse": {"greedy": _learnt(truth, 3, seeds, 2)}}
        for split, truth in references.items()
    }  # fmt: skip
    return answers, references, {"mean": 49.0, "median": 50.0, "mode": 3.0}


def test_a_comparison_gets_a_verdict_only_where_both_of_its_arms_learnt() -> None:
    """The gate is per comparison: WAS, which did not beat the constant on validation, gets no
    verdict against CE although its interval excludes 0; MSE, in the same run, gets one."""
    answers, references, constants = _run()
    gate = learnability_gate(answers["validation"], constants, references["validation"], 3, "mae",
                             constants["median"])  # fmt: skip
    assert gate["constant"] == "median" and gate["candidates"] == 3
    assert gate["confidence"] == pytest.approx(1 - 2 * 0.05 / 3)  # Bonferroni over 3, one-sided
    learnt = {e["arm"]: e["learnt"] for e in gate["arms"]}
    assert learnt == {"ce": True, "was": False, "mse": True}
    assert gate["closest"]["arm"] == "was" and gate["closest"]["improvement"] == 0
    entries = comparisons(answers, references, 3, constants["median"], gate)
    test = {e["arm"]: e for e in entries if (e["split"], e["metric"]) == ("test", "mae")}
    assert test["was"]["interval_verdict"] == "worse" and test["was"]["verdict"] == "no verdict"
    assert test["was"]["reason"] == "learning not shown on validation for was (greedy)"
    assert test["mse"]["verdict"] == "better" and test["mse"]["high"] < 0
    assert test["mse"]["mde"] > 0 and test["mse"]["df"] > 0
    assert {e["metric"] for e in entries} == {"exact_accuracy", "within_1_percent", "mae", "mse",
                                              "log_mae"}  # fmt: skip


def test_a_failed_gate_says_not_shown_with_the_closest_interval_and_its_mde() -> None:
    answers, references, constants = _run()
    only_was = {"was": answers["validation"]["was"], "ce": {"greedy": np.full((3, 200), 50.0)}}
    gate = learnability_gate(only_was, constants, references["validation"], 3, "mae", 50.0)
    lines = _gate_lines(gate, nested=False)
    (sentence,) = [line for line in lines if line.startswith("**Not shown at this budget**")]
    closest = gate["closest"]
    assert f"Closest: {closest['arm']} (greedy), +0.000 [+0.000, +0.000]" in sentence, sentence
    assert "the smallest improvement this run could have shown (its MDE)" in sentence
    assert "not learnt" not in "\n".join(lines)
    accuracy = learnability_gate(answers["validation"], constants, references["validation"], 3,
                                 "exact_accuracy", 50.0)  # fmt: skip
    learnt = {e["arm"]: e["learnt"] for e in accuracy["arms"]}
    assert learnt["mse"] and not learnt["was"]  # higher is better for accuracy


# 20 runs in make test (three Monte Carlo errors allow up to 20 %: the old rule's 82 % fails),
# 200 in make test-slow (up to 9.6 %).
@pytest.mark.parametrize("runs", [20, pytest.param(200, marks=pytest.mark.slow)])
def test_the_gate_stays_at_its_level_over_many_null_candidates(runs: int) -> None:
    """Ten arms that learnt nothing (random digits, as accurate as the constant 0 on average):
    the gate passes some candidate in at most about 5 % of runs (Bonferroni over the 10; the
    old rule, one bootstrap SE, passed about 82 % of such runs)."""
    rng = np.random.default_rng(7)
    zero = {"mean": 0.0, "median": 0.0, "mode": 0.0}
    passed = 0
    for _ in range(runs):
        references = rng.integers(0, 10, 100).astype(np.float64)
        answers = {f"arm{k}": {"greedy": rng.integers(0, 10, (3, 100)).astype(np.float64)}
                   for k in range(10)}  # fmt: skip
        gate = learnability_gate(answers, zero, references, 3, "exact_accuracy", 0.0)
        passed += any(entry["learnt"] for entry in gate["arms"])
    assert passed / runs <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / runs)


def test_one_seed_gives_no_interval_and_says_so() -> None:
    from numtok_compare.finetune.config import FinetuneConfig
    from numtok_compare.finetune.rows import design_of
    from numtok_compare.summary import summary_lines

    answers, references, constants = _run(seeds=1)
    gate = learnability_gate(answers["validation"], constants, references["validation"], 1, "mae",
                             50.0)  # fmt: skip
    assert not any(e["learnt"] for e in gate["arms"])
    entries = comparisons(answers, references, 1, 50.0, gate)
    assert {e["verdict"] for e in entries} == {"no verdict"}
    assert all(e["low"] is None and e["reason"].startswith("one seed") for e in entries)
    config = FinetuneConfig(seeds=(0,), arms=("ce", "was", "mse"), metric="mae",
                            test_splits=("test",))  # fmt: skip
    design = design_of(config, [], {arm: 0.3 for arm in config.arms}).to_dict()
    printed = summary_lines(
        {"design": design, "gate": gate, "comparisons": entries, "answers": answers}
    )
    assert any(line.startswith("one seed cannot give a verdict") for line in printed), printed
    assert "cannot be shown with one seed" in printed[0]
    gate_lines = _gate_lines(gate, nested=False)
    assert any("**Cannot be shown with one seed**" in line for line in gate_lines)
    assert not any("degrees of freedom" in line for line in printed)


def test_an_arm_cannot_gain_by_answering_less() -> None:
    """Every error metric scores an unparsed answer as the training median: an arm that answers
    nothing on half the items scores exactly as if it had answered the median there, so it
    cannot beat the same arm answering them all (here each answer is closer than the median)."""
    rng = np.random.default_rng(3)
    references = rng.integers(1, 100, 300).astype(np.float64)
    median = 50.0
    everything = references + rng.choice([-1.0, 0.0, 1.0], 300)
    half = everything.copy()
    half[::2] = np.nan
    as_median = np.where(np.isnan(half), median, half)
    with_less = item_metrics(half, references, unparsed=median)
    with_median = item_metrics(as_median, references)
    with_all = item_metrics(everything, references, unparsed=median)
    for metric in ("mae", "rmse", "log_mae", "within_1_percent", "pearson"):
        less, full = with_less[metric], with_all[metric]
        assert less is not None and full is not None
        assert less == pytest.approx(with_median[metric])
        assert (less < full) == (metric in HIGHER_IS_BETTER), metric  # never better
    accuracy = item_metrics(everything, references)["exact_accuracy"]
    assert accuracy is not None
    # An unparsed answer is wrong.
    assert with_less["exact_accuracy"] == pytest.approx(accuracy / 2, abs=0.01)
    rows = np.stack([half, everything])
    for metric in MEAN_METRICS:  # the per-item scores' mean is the metric (RMSE: MSE's root)
        scores = item_scores(metric, rows, references, unparsed=median)
        name = "rmse" if metric == "mse" else metric
        for row, row_scores in zip(rows, scores, strict=True):
            value = item_metrics(row, references, unparsed=median)[name]
            mean = float(row_scores.mean())
            assert (math.sqrt(mean) if metric == "mse" else mean) == pytest.approx(value)


def test_the_parsed_share_stands_beside_every_metric() -> None:
    answers, references, constants = _run()
    answers["test"]["was"]["greedy"][:, ::4] = np.nan
    gate = learnability_gate(answers["validation"], constants, references["validation"], 3, "mae",
                             50.0)  # fmt: skip
    entries = comparisons(answers, references, 3, 50.0, gate)
    was = [e for e in entries if (e["split"], e["arm"]) == ("test", "was")]
    assert all(e["parsed_share"] == {"arm": 0.75, "baseline": 1.0} for e in was)
    cells = _difference_cells(was[0])
    assert "0.750 / 1.000" in cells
    table = metric_table(answers, references, 3, 50.0)
    assert {e["metric"] for e in table} >= {"parsed_share", "mae", "pearson"}


def _git(folder: Path, *arguments: str) -> None:
    identity = ("-c", "user.name=t", "-c", "user.email=t@t")
    subprocess.run(["git", *identity, *arguments], cwd=folder, check=True, capture_output=True)


def _commit(path: Path) -> None:
    """Commit ``path`` in a git repository of its own folder (made if there is none)."""
    if not (path.parent / ".git").exists():
        _git(path.parent, "init", "-q")
    _git(path.parent, "add", path.name)
    _git(path.parent, "commit", "-q", "-m", "register")


def test_a_preregistration_is_written_once_and_held_against_the_run(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    code = {"commit": "a", "source": "0123456789abcdef"}
    record = {"hypothesis": "h", "arms": ["ce", "was"], "settings": {"steps": 60, "seeds": [3]},
              "code": code}  # fmt: skip
    write_preregistration(path, record)
    with pytest.raises(ValueError, match="written once, never replaced"):
        write_preregistration(path, record)
    # Not committed: git cannot date it before the run, so the run is refused...
    with pytest.raises(ValueError, match=r"plan.json is not committed in git as it is"):
        check_preregistration(path, record)
    assert git_provenance(path)["commit"] is None  # not in git
    # ... unless a deviation says why, and then the difference is returned for the report.
    stored, differences = check_preregistration(path, record, deviation="a dry run")
    assert stored["hypothesis"] == "h" and len(differences) == 1
    _commit(path)
    committed = git_provenance(path)
    assert committed["commit"] and committed["committed"]
    assert check_preregistration(path, record) == (stored, [])
    # The commit is recorded, not held (committing the file makes a new commit); the source is.
    assert check_preregistration(path, {**record, "code": {**code, "commit": "b"}})[1] == []
    with pytest.raises(ValueError, match=r"code: registered with source 0123456789abcdef, this"):
        check_preregistration(path, {**record, "code": {**code, "source": "fedcba9876543210"}})
    changed = {**record, "settings": {"steps": 61, "seeds": [3]}}
    with pytest.raises(ValueError, match=r"steps: registered 60, this run 61.*--deviation"):
        check_preregistration(path, changed)
    assert check_preregistration(path, changed, deviation="more steps")[1] == [
        "settings.steps: registered 60, this run 61"
    ]
    with pytest.raises(ValueError, match=r"settings.steps"):  # a blank reason is none
        check_preregistration(path, changed, deviation="  ")
    # A setting added after the registration was written: registered at its default.
    later = {**record, "settings": {**record["settings"], "readout_tolerance": FAST_TOLERANCE}}
    assert check_preregistration(path, later)[1] == []
    other = {**record, "settings": {**record["settings"], "readout_tolerance": 0.01}}
    with pytest.raises(ValueError, match=r"settings.readout_tolerance: registered 0.001, this run"):
        check_preregistration(path, other)
    path.write_text(path.read_text() + " ")
    assert git_provenance(path)["commit"] is None  # changed since it was committed
    with pytest.raises(ValueError, match=r"not committed in git as it is"):
        check_preregistration(path, record)


def test_compare_preregisters_then_runs_only_the_registered_run(
    tiny_llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from numtok.cli import main

    data = _write(tmp_path / "sums.jsonl", _sums(40))
    plan = tmp_path / "plan.json"
    arguments = _compare(tiny_llama_dir, data, tmp_path / "run", "--arms", "ce,was", "--max-value",
                         "none", "--preregister", str(plan))  # fmt: skip
    assert main([*arguments, "--hypothesis", "WAS lowers log-MAE", "--primary", "was"]) == 0
    assert "commit it" in capsys.readouterr().out and not (tmp_path / "run").exists()
    stored = json.loads(plan.read_text())
    assert stored["primary_endpoints"] == [
        {"arm": "was", "readout": "greedy", "baseline": "ce", "baseline_readout": "greedy",
         "metric": "log_mae", "split": "test", "equivalence_margin": None}
    ]  # fmt: skip
    assert stored["splits"]["sizes"]["test"] == 4 and stored["seeds"] == [0, 1]
    assert re.fullmatch("[0-9a-f]{16}", stored["splits"]["content_digest"])
    assert stored["code"]["numtok"] == numtok.__version__ and "commit" in stored["code"]
    assert re.fullmatch("[0-9a-f]{16}", stored["code"]["source"])
    with pytest.raises(SystemExit):
        main(arguments)  # not committed yet
    assert "plan.json is not committed in git as it is" in capsys.readouterr().err
    _commit(plan)
    with pytest.raises(SystemExit):
        main([*arguments, "--steps", "3"])  # not the registered 2 (the last flag wins)
    error = capsys.readouterr().err
    assert "plan.json pre-registered (settings.steps: registered 2, this run 3)" in error
    assert not (tmp_path / "run").exists()
    assert main(arguments) == 0
    report = (tmp_path / "run" / "report.md").read_text()
    assert report.startswith("# Fine-tuning") and "**Pre-registered** in `plan.json`" in report
    assert "The run checked its settings, data, model and code (source " in report
    assert "they matched. The settings these rows record are the registered ones" in report
    assert "Hypothesis: WAS lowers log-MAE" in report
    assert report.index("Pre-registered") < report.index("## Primary endpoint")


def test_estimate_probes_and_prints_the_time_then_stops(
    tiny_llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--estimate: the model and the data are read, a probe times training and scoring, the
    estimate splits the two, and nothing is trained or written (issue 60: --dry-run gave no
    time)."""
    from numtok.cli import main

    data = _write(tmp_path / "sums.jsonl", _sums(40))
    arguments = _compare(tiny_llama_dir, data, tmp_path / "run", "--arms", "ce,was",
                         "--max-value", "none", "--estimate")  # fmt: skip
    assert main(arguments) == 0
    captured = capsys.readouterr()
    estimate = next(line for line in captured.err.splitlines() if line.startswith("estimate:"))
    assert re.fullmatch(
        r"estimate: \d+\.\d min \(\d+\.\d training the 8 steps left, \d+\.\d scoring the "
        r"\d+ examples left; a probe: \d+\.\d\d s a CE step, \d+\.\d\d s an example\)",
        estimate,
    ), estimate
    assert "an estimate only: nothing trained or written" in captured.out
    assert not (tmp_path / "run").exists()


def test_a_registered_run_with_other_data_or_code_is_refused_unless_a_deviation_says_why(
    tiny_llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Issue 60: a registered comparison whose data file or code changed after the registration
    does not start; with --deviation it runs, and its report lists the differences and the
    reason."""
    from numtok.cli import main
    from numtok_compare import provenance

    data = _write(tmp_path / "sums.jsonl", _sums(40))
    plan = tmp_path / "plan.json"
    arguments = _compare(tiny_llama_dir, data, tmp_path / "run", "--arms", "ce,was", "--max-value",
                         "none", "--preregister", str(plan))  # fmt: skip
    assert main([*arguments, "--hypothesis", "WAS lowers log-MAE", "--primary", "was"]) == 0
    _commit(plan)
    capsys.readouterr()
    changed = _sums(40)
    changed[0] = {**changed[0], "answer": changed[0]["answer"] + 1}  # one answer corrected
    _write(data, changed)
    with pytest.raises(SystemExit):
        main(arguments)
    error = capsys.readouterr().err
    assert "is not the one" in error and "splits.digest: registered" in error
    assert "--deviation TEXT" in error and not (tmp_path / "run").exists()
    _write(data, _sums(40))
    registered_source = json.loads(plan.read_text())["code"]["source"]
    monkeypatch.setattr(provenance, "source_digest", lambda: "f" * 16)
    with pytest.raises(SystemExit):
        main(arguments)
    error = capsys.readouterr().err
    assert f"code: registered with source {registered_source}, this run's is {'f' * 16}" in error
    assert main([*arguments, "--deviation", "a patched harness, to test the refusal"]) == 0
    report = (tmp_path / "run" / "report.md").read_text()
    assert "**The run deviated from it**" in report
    assert f"code: registered with source {registered_source}" in report
    assert "Deviation stated: a patched harness, to test the refusal" in report
    rows = json.loads((tmp_path / "run" / "results.json").read_text())
    assert rows["registration_check"]["deviation"] == "a patched harness, to test the refusal"


def test_compare_runs_every_preset_and_refuses_the_flags_of_the_other_kind(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One comparison command: an unknown --preset lists every preset, from scratch and
    fine-tuning alike; a flag of the other kind of run is one error line naming the flag."""
    from numtok.cli import main

    with pytest.raises(SystemExit) as stopped:
        main(["compare", "--preset", "bogus"])
    error = capsys.readouterr().err
    assert stopped.value.code == 2 and "unknown preset 'bogus'" in error
    assert all(f"  {name}:" in error for name in ("smollm2-arithmetic", "demo", "smoke", "rjokes"))
    scratch_only = " (it applies to the presets trained from scratch; numtok list shows them)"
    fine_tuning_only = (
        ", a comparison trained from scratch (it applies to --data and the smollm2-* presets)"
    )
    for arguments, message in (
        (["--preset", "smoke", "--adaptation", "lora"],
         "--adaptation does not apply to the arithmetic task of 'smoke'"),
        (["--preset", "smoke", "--choose-on-validation", "0.3,1"],
         "--choose-on-validation does not apply to the arithmetic task of 'smoke'"),
        (["--preset", "smoke", "--hypothesis", "x"],
         "--hypothesis does not apply to 'smoke'" + fine_tuning_only),
        (["--preset", "smoke", "--max-value", "9"],
         "--max-value does not apply to 'smoke'" + fine_tuning_only),
        (["--preset", "smoke", "--readout-samples", "9"],
         "--readout-samples does not apply to 'smoke'" + fine_tuning_only),
        (["--preset", "rjokes-smoke", "--margin", "0.1"],
         "--margin does not apply to 'rjokes-smoke'" + fine_tuning_only),
        (["--preset", "smollm2-arithmetic", "--workers", "2"],
         "--workers does not apply to the fine-tuning preset 'smollm2-arithmetic'" + scratch_only),
        (["--data", "x.jsonl", "--cache-dir", "x"],
         "--cache-dir does not apply to a comparison of --data" + scratch_only),
    ):  # fmt: skip
        with pytest.raises(SystemExit) as stopped:
            main(["compare", *arguments])
        assert stopped.value.code == 2
        assert capsys.readouterr().err.splitlines() == [f"numtok: error: {message}"]


@pytest.mark.parametrize("flag", ["--margin", "--target-effect"])
def test_a_margin_or_target_effect_that_is_not_positive_is_named_by_its_flag(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from numtok.cli import main

    with pytest.raises(SystemExit) as stopped:
        main(["compare", "--preset", "smollm2-arithmetic", flag, "0", "--dry-run"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"numtok: error: {flag} must be a positive number, got 0"
    ]


def test_lambda_is_chosen_with_unparsed_answers_scored_as_the_report_scores_them() -> None:
    """An arm that answers less cannot win λ's choice: its unparsed answers count as the training
    median in the validation metric, as in the report."""
    from numtok_compare.finetune.comparison import _metric_of
    from numtok_compare.item_metrics import answer_values

    references = answer_values([3.0, 5.0])
    silent = {"answers": {"greedy": [None, 5.0]}}
    answered = {"answers": {"greedy": [4.0, 5.0]}}
    assert _metric_of(silent, "greedy", "mae", references, 100.0) == pytest.approx(48.5)
    assert _metric_of(answered, "greedy", "mae", references, 100.0) == pytest.approx(0.5)
    assert _metric_of(silent, "expected", "mae", references, 100.0) is None


DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_reanalyse_rebuilds_the_committed_pre_registered_run_with_this_analysis(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The committed rows of the pre-registered run, analysed again: the crossed interval of
    WAS − CE log-MAE (computed by hand from the same rows when the analysis replaced the
    bootstrap: −0.0074 [−0.0276, +0.0128], df 5.7, MDE 0.027, with the 16,384 plain draws of
    then; converged, [−0.0274, +0.0127]) and the gate on validation."""
    from numtok.cli import main

    rows = DOCS / "compare-arithmetic-fresh-rows.json"
    assert main(["compare", "--reanalyse", str(rows), "--out", str(tmp_path / "again")]) == 0
    printed = capsys.readouterr().out
    assert "was: -0.0074 [-0.0274, +0.0127], MDE 0.0268: not shown" in printed
    assert "shown for 2 of 2 arm × readout candidates" in printed
    report = (tmp_path / "again" / "report.md").read_text()
    assert "| was | -0.007 | [-0.027, +0.013] | 5.7 | 0.027 | 1.000 / 1.000 | not shown |" in report
    assert "| Δ | 95 % interval | df | MDE | parsed, arm / baseline | verdict |" in report
    assert "**Pre-registered** in `compare-arithmetic-fresh-preregistration.json`" in report
    results = json.loads((tmp_path / "again" / "results.json").read_text())
    assert "bootstrap_replicates" not in results  # the old analysis is not carried over
    assert results["answers"] == json.loads(rows.read_text())["answers"]
    # Run again into that folder with a target effect, the command warns before training.
    from numtok_compare.finetune.command import preflight_warnings
    from numtok_compare.finetune.config import FinetuneConfig

    seeds = FinetuneConfig(seeds=tuple(results["design"]["seeds"]))
    (warning,) = preflight_warnings(seeds, tmp_path / "again", 0.02)
    assert warning.startswith("was − CE: the MDE of this design is 0.0268 log_mae (from ")
    assert warning.endswith(
        "it needs 10 seeds at 1,000 items, or 28,674 items at 6 seeds (at the components' 95 % "
        "limits 6–50 seeds, 826–any number items)"
    )
    assert preflight_warnings(seeds, tmp_path / "again", 0.03) == []


def test_one_or_two_seeds_are_warned_of_before_training(tmp_path: Path) -> None:
    from numtok_compare.finetune.command import preflight_warnings
    from numtok_compare.finetune.config import FinetuneConfig

    (warning,) = preflight_warnings(FinetuneConfig(seeds=(3,)), tmp_path, None)
    assert warning.startswith("one seed (3): the seed × item analysis needs at least two seeds")
    (warning,) = preflight_warnings(FinetuneConfig(seeds=(3, 4)), tmp_path, 0.1)
    assert warning.startswith("two seeds: the seed × item analysis estimates the seed component")
    assert preflight_warnings(FinetuneConfig(seeds=(3, 4, 5)), tmp_path, 0.1) == []


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--reanalyse", "{docs}/compare-arithmetic-fresh-rows.json"],
         "--reanalyse {docs}/compare-arithmetic-fresh-rows.json is a file: give --out DIR"),
        (["--reanalyse", "{tmp}/nowhere"], "--reanalyse {tmp}/nowhere: no such run folder"),
        (["--reanalyse", "{docs}/smollm2-rjokes-test-rows.json", "--out", "{tmp}/x"],
         "--reanalyse {docs}/smollm2-rjokes-test-rows.json: not the results of a run"),
        (["--reanalyse", "{tmp}", "--seeds", "3"], "--seeds does not apply to --reanalyse"),
        (["--reanalyse", "{tmp}", "--target-effect", "-1"],
         "--target-effect must be a positive number, got -1"),
        (["--reanalyse", "{tmp}"], "--reanalyse {tmp}: cannot read the run's results"),
    ],
)  # fmt: skip
def test_reanalyse_refuses_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    from numtok.cli import main

    def filled(text: str) -> str:
        return text.format(docs=DOCS, tmp=tmp_path)

    with pytest.raises(SystemExit) as stopped:
        main(["compare", *(filled(flag) for flag in flags)])
    assert stopped.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"numtok: error: {filled(message)}"), line


def test_a_margin_tests_equivalence_under_the_same_gate(tmp_path: Path) -> None:
    """--margin: two one-sided tests within ±m of the run's tested metric, for every comparison
    of that metric against the margin's baseline arm (and no other); "equivalent" where the 90 %
    interval lies inside, "different" where outside, withheld by the gate like the difference;
    the report shows them in the primary table of that baseline alone."""
    from numtok_compare.crossed import equivalence
    from numtok_compare.design import Design
    from numtok_compare.finetune.config import FinetuneConfig
    from numtok_compare.report import analyse_and_write

    answers, references, constants = _run()
    answers["test"]["near"] = {"greedy": answers["test"]["ce"]["greedy"] + 0.01}
    answers["validation"]["near"] = {"greedy": answers["validation"]["ce"]["greedy"] + 0.01}
    gate = learnability_gate(answers["validation"], constants, references["validation"], 3, "mae",
                             constants["median"])  # fmt: skip
    entries = comparisons(
        answers, references, 3, constants["median"], gate, margin=("mae", 1.0, "ce")
    )
    test = {e["arm"]: e for e in entries if (e["split"], e["metric"]) == ("test", "mae")}
    assert test["near"]["equivalence"]["verdict"] == "equivalent"
    assert test["mse"]["equivalence"]["verdict"] == "different"  # MSE's errors 5 lower
    assert test["was"]["equivalence"]["verdict"] == "no verdict"  # WAS did not learn
    expected = equivalence(
        np.abs(answers["test"]["mse"]["greedy"] - references["test"]),
        np.abs(answers["test"]["ce"]["greedy"] - references["test"]), margin=1.0,
    )  # fmt: skip
    assert (test["mse"]["equivalence"]["low"], test["mse"]["equivalence"]["high"]) == (
        expected.low, expected.high,
    )  # fmt: skip
    assert all("equivalence" not in e for e in entries if e["metric"] != "mae")
    against_head = comparisons(
        answers, references, 3, constants["median"], gate, margin=("mae", 1.0, "head")
    )
    assert not any("equivalence" in e for e in against_head)  # no head: nothing tested
    design = Design(
        title="t",
        trained="x.",
        seeds=(0, 1, 2),
        arms=("ce", "mse", "near"),
        splits=("test",),
        metric="mae",
        readout="greedy",
        max_value=None,
        margin=1.0,
    )
    stored = {split: {arm: {readout: rows.tolist() for readout, rows in by_readout.items()}
                      for arm, by_readout in by_arm.items()}
              for split, by_arm in answers.items()}  # fmt: skip
    rows = {"design": design.to_dict(), "config": {}, "choice": {"chosen": {}, "means": {}},
            "training_constants": constants, "minutes": 1.0, "answers": stored,
            "references": {s: r.tolist() for s, r in references.items()}}  # fmt: skip
    analyse_and_write(tmp_path, rows, preregistered=None)
    report = (tmp_path / "report.md").read_text()
    assert (
        "| arm − CE | Δ | 95 % interval | df | MDE | parsed, arm / baseline | verdict | "
        "equivalence ±1 | 90 % interval |" in report
    )
    assert "| mse | -5.083 |" in report and "| **better** | **different** |" in report
    assert "| near | +0.000 |" in report and "| not shown | **equivalent** |" in report
    assert "Equivalence within ±1 (mae) of each arm − CE (the comparisons the margin" in report
    with_head = {**rows, "design": {**design.to_dict(), "arms": ["ce", "mse", "near", "head"]}}
    assert Design.from_dict(with_head["design"]).equivalence_baseline == "head"
    with pytest.raises(ValueError, match=r"margin_baseline must be 'ce', or 'head' where"):
        FinetuneConfig(margin=1.0, margin_baseline="head")
    assert FinetuneConfig(margin=1.0).equivalence_baseline == "ce"
    assert "margin_baseline" not in FinetuneConfig(margin=1.0).to_dict()  # fingerprints kept
    with pytest.raises(ValueError, match=r"margin must be a finite number > 0, got 0\.0"):
        FinetuneConfig(margin=0.0)


@pytest.mark.parametrize(
    "name",
    [
        "rjokes-test",
        "number-losses-test",
        "number-losses-rjokes-trainer",
        "number-losses-arithmetic",
        "number-losses-arithmetic-trainer",
    ],
)
def test_the_committed_rjokes_reports_are_their_rows_reanalysed(tmp_path: Path, name: str) -> None:
    """docs/rjokes-test-report.md (make demo's run), docs/number-losses-test-report.md (the
    rjokes-losses preset) and its rerun on the Trainer (number-losses-rjokes-trainer-report.md),
    docs/number-losses-arithmetic-report.md (add_or_sub-losses) and its rerun on the Trainer
    (-trainer-report.md) are what --reanalyse writes from their rows (paths replaced by DATA and
    runs/...), byte for byte."""
    from numtok_compare.report import reanalyse

    reanalyse(DOCS / f"{name}-rows.json", tmp_path)
    assert (tmp_path / "report.md").read_text() == (DOCS / f"{name}-report.md").read_text()


def test_the_committed_diamonds_test_is_its_rows_reanalysed(tmp_path: Path) -> None:
    """docs/smollm2-diamonds-test.md is its preface, then what --reanalyse writes from
    docs/smollm2-diamonds-test-rows.json below the report's title, byte for byte: the
    registration found; its two endpoints, (b) NTL-WAS − CE not shown (no equivalence: the margin
    was registered for (a)) and (a) NTL-WAS − head undecided at ±50, both in the primary
    section."""
    from numtok_compare.report import reanalyse

    reanalyse(DOCS / "smollm2-diamonds-test-rows.json", tmp_path)
    title, body = (tmp_path / "report.md").read_text().split("\n", 1)
    assert title == "# Fine-tuning smollm2 on diamonds-hundreds"
    page = (DOCS / "smollm2-diamonds-test.md").read_text()
    assert page.endswith("\n\n" + body.lstrip("\n"))
    assert "before the run began (2026-12-04T17:03:30+00:00; both by the committer's" in body
    # Its rows predate the run's recorded check: the report says so and checks the settings.
    assert "These rows do not record the run's own check of its data, model and code" in body
    assert "The settings these rows record are the registered ones (checked by this" in body
    # The registered margin was for (a), NTL-WAS − the head: only that row is tested against it.
    assert "[-65.397, +68.451] | 2.4 | 75.869 | 1.000 / 1.000 | not shown |\n" in body
    assert "| was (expected) | +193.781 | [-349.066, +736.627] | 3.2 | 562.629 |" in body
    assert "| not shown | undecided | [-181.600, +569.162] |" in body


def test_a_target_effect_plans_the_seeds_and_items_that_reach_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--target-effect: each primary comparison's variance components give the MDE of this
    design and the fewest seeds (at this many items) and items (at this many seeds) that reach
    the target; checked against the crossed analysis of the same per-item scores."""
    from numtok.cli import main
    from numtok_compare.crossed import crossed_difference, seeds_needed

    rows = DOCS / "compare-arithmetic-fresh-rows.json"
    flags = ["--out", str(tmp_path / "plan"), "--target-effect", "0.02"]
    assert main(["compare", "--reanalyse", str(rows), *flags]) == 0
    printed = capsys.readouterr().out
    assert (
        "was − CE: MDE now 0.0268; seeds needed at 1,000 items: 10 (at the components' 95 % "
        "limits 6–50); items needed at 6 seeds: 28,674 (at the components' 95 % limits "
        "826–not reachable)" in printed
    )
    report = (tmp_path / "plan" / "report.md").read_text()
    assert "| 0.027 | 10 at 1,000 items (6–50) | 28,674 (826–not reachable) |" in report
    plan = json.loads((tmp_path / "plan" / "results.json").read_text())["planning"]
    (entry,) = plan["arms"]
    stored = json.loads(rows.read_text())
    truth = np.array(stored["references"]["test_fresh_4_digit"])
    answers = stored["answers"]["test_fresh_4_digit"]
    scores = {
        arm: item_scores("log_mae", np.array(answers[arm]["greedy"]), truth, unparsed=410.0)
        for arm in ("was", "ce")
    }
    components = crossed_difference(scores["was"], scores["ce"], higher_is_better=False).components
    assert components is not None
    assert entry["components"] == pytest.approx(
        {"seed": components.seed, "item": components.item, "resid": components.resid}
    )
    needed = entry["seeds_needed"]
    assert components.minimal_detectable_effect(needed, 1000) <= 0.02
    assert components.minimal_detectable_effect(needed - 1, 1000) > 0.02
    low, high = components.at_confidence_limits(6, 1000)
    assert entry["seeds_needed_range"] == [
        seeds_needed(low, 0.02, items=1000),
        seeds_needed(high, 0.02, items=1000),
    ]
    items = entry["items_needed"]
    assert components.minimal_detectable_effect(6, items) <= 0.02
    assert components.minimal_detectable_effect(6, items - 1) > 0.02
    assert plan["mde_above"] == ["was"]
    report = (tmp_path / "plan" / "report.md").read_text()
    assert "## Planning" in report and "| was | 0.000191 | 0.00386 | 0.161 | 0.027 | 10" in report


def test_reanalyse_refuses_results_that_are_not_an_object(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from numtok.cli import main

    (tmp_path / "results.json").write_text("3\n")  # JSON, but no rows
    with pytest.raises(SystemExit) as stopped:
        main(["compare", "--reanalyse", str(tmp_path)])
    assert stopped.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"numtok: error: --reanalyse {tmp_path}: not the results of a run")
