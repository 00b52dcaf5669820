"""The statistics and files of a finished run, and the ``numtok`` command end to end."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mathematics_dataset", reason="needs the harness: pip install ./compare[demo]")
pytest.importorskip("matplotlib", reason="needs the harness: pip install ./compare[demo]")

from numtok.cli import main
from numtok.numbers.text import last_number
from numtok_compare.design import Design
from numtok_compare.presets import PRESETS
from numtok_compare.report import analyse_and_write
from numtok_compare.report_format import signed
from numtok_compare.scratch.arithmetic import run_experiment
from numtok_compare.tasks.mathematics import TASKS, generate, read_cache

SMOKE = PRESETS["smoke"].config


def test_signed_differences_carry_a_sign_and_no_negative_zero() -> None:
    assert [signed(v) for v in (0.0155, -0.0006, 2.0, -1e-17, -0.0004, 0.0)] == [
        "+0.015", "-0.001", "+2.000", "+0.000", "+0.000", "+0.000",
    ]  # fmt: skip
    assert signed(1.23456, 4) == "+1.2346" and signed(-0.00004, 4) == "+0.0000"
    assert signed(None) == signed(math.nan) == signed(-math.inf) == "n/a"


def _slog(x: float) -> float:
    return math.copysign(math.log1p(abs(x)), x)


def test_items_nested_in_seeds_get_the_paired_seed_t_interval(tmp_path: Path) -> None:
    """Each seed answers its own items (references one list per seed): every difference is the
    t interval over the seeds' means, its verdict read from it, and the report says so."""
    seeds = (0, 1, 2)
    references = [[10.0 + s, 20.0 + s, 30.0 + s, 45.0 + s] for s in seeds]
    ce = [[r + 5 for r in row] for row in references]
    was = [[r + 2 for r in row] for row in references]
    design = Design(
        title="nested",
        trained="fabricated.",
        seeds=seeds,
        arms=("ce", "was"),
        splits=("interpolate",),
        metric="log_mae",
        readout="greedy",
        max_value=None,
    )
    answers = {
        split: {"ce": {"greedy": ce}, "was": {"greedy": was}}
        for split in ("interpolate", "validation")
    }
    rows = {"design": design.to_dict(), "config": {}, "choice": {"chosen": {}, "means": {}},
            "training_constants": {"mean": 1e6, "median": 1e6, "mode": 1e6}, "minutes": 1.0,
            "answers": answers, "references": {"interpolate": references,
                                               "validation": references}}  # fmt: skip
    results = analyse_and_write(tmp_path, rows, preregistered=None)
    per_seed = [
        statistics.fmean(abs(_slog(w) - _slog(r)) - abs(_slog(c) - _slog(r))
                         for w, c, r in zip(w_row, c_row, r_row, strict=True))
        for w_row, c_row, r_row in zip(was, ce, references, strict=True)
    ]  # fmt: skip
    half = 4.302652729911275 * statistics.stdev(per_seed) / math.sqrt(3)  # t(0.975, 2)
    centre = statistics.fmean(per_seed)
    key = ("interpolate", "was", "log_mae")
    entry = next(e for e in results["comparisons"] if (e["split"], e["arm"], e["metric"]) == key)
    assert (entry["difference"], entry["low"], entry["high"], entry["df"]) == pytest.approx(
        (centre, centre - half, centre + half, 2.0)
    )
    assert entry["verdict"] == "better" and entry["components"] is None
    ce_log_mae = next(e for e in results["metrics"] if (e["split"], e["arm"], e["metric"])
                      == ("interpolate", "ce", "log_mae"))  # fmt: skip
    assert ce_log_mae["values"] == pytest.approx(
        [statistics.fmean(abs(_slog(c) - _slog(r)) for c, r in zip(c_row, r_row, strict=True))
         for c_row, r_row in zip(ce, references, strict=True)]
    )  # fmt: skip
    report = (tmp_path / "report.md").read_text()
    assert "paired by seed (3 seeds)" in report
    assert "the paired-seed t over the means of each seed's own items (df: S − 1;" in report
    assert "by the same paired-seed analysis" in report


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, Any]]:
    run_dir = tmp_path_factory.mktemp("run") / "smoke"
    cache = tmp_path_factory.mktemp("questions")
    results = run_experiment(SMOKE, run_dir, cache_dir=cache, show_progress=False)
    return run_dir, cache, results


def test_run_writes_results_report_and_plot(smoke_run: tuple[Path, Path, dict[str, Any]]) -> None:
    """The one report writer's files, from every seed's answer to each of its own questions:
    the greedy answer is the last number of the generated text, the references the seed's."""
    run_dir, cache, results = smoke_run
    stored = json.loads((run_dir / "results.json").read_text())  # standard JSON: no NaN
    assert stored == json.loads(json.dumps(results))
    assert (run_dir / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (run_dir / "report.md").read_text()
    for heading in ("## Primary endpoint", "## Learnability gate (validation)", "## interpolate"):
        assert heading in report
    assert "the paired-seed t over the means of each seed's own items" in report
    assert {(r["seed"], r["arm"]) for r in results["runs"]} == {
        (s, a) for s in SMOKE.seeds for a in SMOKE.arms
    }
    assert results["design"]["splits"] == ["interpolate", "easy", "medium_hard", "extrapolate"]
    assert set(results["answers"]) == {"validation", "easy", "medium_hard", "interpolate",
                                       "extrapolate"}  # fmt: skip
    sizes = {"train_questions": SMOKE.train_questions, "eval_questions": SMOKE.eval_questions}
    for index, seed in enumerate(SMOKE.seeds):
        data = read_cache(SMOKE.task, seed, cache_dir=cache, **sizes)
        assert data is not None
        folder = run_dir / f"seed{seed}" / "was"
        validated = json.loads((folder / "validation.json").read_text())
        tested = json.loads((folder / "test.json").read_text())["splits"]
        texts = {"validation": validated["texts"]} | {s: t["texts"] for s, t in tested.items()}
        assert set(texts) == set(data.evaluation)
        for split, examples in data.evaluation.items():
            assert results["references"][split][index] == [float(a) for _, a in examples]
            assert results["answers"][split]["was"]["greedy"][index] == [
                last_number(text) for text in texts[split]
            ]
    assert {run["arm"] for run in results["runs"]} == set(SMOKE.arms)
    assert all(run["seconds_per_step"] > 0 for run in results["runs"])
    assert "A training step (the median over seeds of each run's median): was" in report


def test_validation_run_scores_only_the_validation_split(tmp_path: Path) -> None:
    config = SMOKE.with_overrides(evaluate_on="validation", arms=("ce", "del"), seeds=(0,))
    results = run_experiment(config, tmp_path / "run", cache_dir=tmp_path, show_progress=False)
    assert set(results["answers"]) == {"validation"}
    report = (tmp_path / "run" / "report.md").read_text()
    assert "**Not measured: the test splits were not scored**" in report
    assert "**One seed cannot give a verdict**" in report


def test_run_caches_what_generate_makes(smoke_run: tuple[Path, Path, dict[str, Any]]) -> None:
    _, cache, _ = smoke_run
    sizes = {"train_questions": SMOKE.train_questions, "eval_questions": SMOKE.eval_questions}
    for seed in SMOKE.seeds:
        cached = read_cache(SMOKE.task, seed, cache_dir=cache, **sizes)
        assert cached == generate(TASKS[SMOKE.task], seed, **sizes)


def test_rerun_resumes_instead_of_training_again(
    smoke_run: tuple[Path, Path, dict[str, Any]],
) -> None:
    run_dir, cache, results = smoke_run
    result_file = run_dir / "seed0" / "ce" / "test.json"
    stamp = result_file.stat().st_mtime_ns
    again = run_experiment(SMOKE, run_dir, cache_dir=cache, show_progress=False)
    assert result_file.stat().st_mtime_ns == stamp
    assert again["runs"] == results["runs"] and again["metrics"] == results["metrics"]


def test_run_folder_with_other_settings_is_refused(
    smoke_run: tuple[Path, Path, dict[str, Any]],
) -> None:
    run_dir, cache, _ = smoke_run
    with pytest.raises(ValueError, match="holds a run with other settings \\(differing: steps\\)"):
        run_experiment(SMOKE.with_overrides(steps=41), run_dir, cache_dir=cache)


def test_run_folder_of_an_older_layout_is_refused(
    smoke_run: tuple[Path, Path, dict[str, Any]], tmp_path: Path
) -> None:
    """A folder whose arms an older numtok stored (result.json and predictions.json) is refused
    before any training, not silently trained again beside the old files."""
    run_dir, cache, _ = smoke_run
    older = tmp_path / "older"
    (older / "seed0" / "ce").mkdir(parents=True)
    (older / "config.json").write_text((run_dir / "config.json").read_text())
    (older / "seed0" / "ce" / "result.json").write_text("{}")
    with pytest.raises(ValueError, match=r"was written by an older numtok .*run into a new --out"):
        run_experiment(SMOKE, older, cache_dir=cache, show_progress=False)
    assert sorted(p.name for p in older.rglob("*")) == ["ce", "config.json", "result.json", "seed0"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--steps", "0"], "steps must be at least 1, got 0 (set with --steps)"),
        (["--ntl-weight", "-0.3"], "ntl_weight must be a finite number >= 0, got -0.3"),
        (["--device", "tpu9"], "unknown device 'tpu9'"),
        (["--task", "arithmetic__add"], "arithmetic__add_sub_multiple"),
        (["--arms", "ce,ntl"], "arms must be chosen from ['ce', 'was', 'mse', 'gls', 'number'"),
        (["--workers", "0"], "--workers must be at least 1"),
    ],
)
def test_bad_input_fails_before_any_work(
    flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--task", "arithmetic__add_or_sub", *flags, "--out", str(tmp_path / "run"),
              "--cache-dir", str(tmp_path)])  # fmt: skip
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_unknown_preset_lists_the_presets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["compare", "--preset", "huge", "--out", str(tmp_path / "run")])
    error = capsys.readouterr().err
    assert "unknown preset 'huge'" in error
    assert all(name in error for name in PRESETS)


@pytest.mark.slow
def test_cli_runs_in_worker_processes_and_matches_the_in_process_run(
    smoke_run: tuple[Path, Path, dict[str, Any]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, cache, in_process = smoke_run
    status = main(["compare", "--preset", "smoke", "--workers", "2", "--no-progress",
                   "--out", str(tmp_path / "run"), "--cache-dir", str(cache)])  # fmt: skip
    assert status == 0
    output = capsys.readouterr().out
    assert "learnability gate (validation log_mae" in output
    assert f"run folder: {tmp_path / 'run'}" in output
    spawned = json.loads((tmp_path / "run" / "results.json").read_text())
    assert spawned["command"].startswith("numtok compare --preset smoke")
    assert spawned["answers"] == in_process["answers"]  # workers do not change results
