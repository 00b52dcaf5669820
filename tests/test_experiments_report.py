"""The statistics and files of a finished run, and the ``numtok`` command end to end."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mathematics_dataset", reason="needs the demo extra: pip install numtok[demo]")
pytest.importorskip("matplotlib", reason="needs the demo extra: pip install numtok[demo]")

from numtok.cli import main
from numtok.experiments.config import ExperimentConfig
from numtok.experiments.presets import PRESETS
from numtok.experiments.report_format import signed
from numtok.experiments.runner import run_experiment
from numtok.experiments.scratch_report import METRICS, format_table, write_report
from numtok.experiments.stats import paired_test
from numtok.experiments.tasks.mathematics import TASKS, generate, read_cache

SMOKE = PRESETS["smoke"].config


def test_signed_differences_carry_a_sign_and_no_negative_zero() -> None:
    assert [signed(v) for v in (0.0155, -0.0006, 2.0, -1e-17, -0.0004, 0.0)] == [
        "+0.015", "-0.001", "+2.000", "+0.000", "+0.000", "+0.000",
    ]  # fmt: skip
    assert signed(1.23456, 4) == "+1.2346" and signed(-0.00004, 4) == "+0.0000"
    assert signed(None) == signed(math.nan) == signed(-math.inf) == "n/a"


def test_paired_test_matches_the_t_statistic() -> None:
    differences = [0.02, 0.03, 0.025]
    n = len(differences)
    t = statistics.fmean(differences) / (statistics.stdev(differences) / math.sqrt(n))
    assert paired_test(differences) == (pytest.approx(t), True)  # t ≈ 8.7 > 4.303
    assert paired_test([0.05, -0.01, 0.02]) == (pytest.approx(1.1547005), False)  # t < 4.303
    assert paired_test([0.1]) == (None, None)  # one seed: spread unknown
    assert paired_test([0.0, 0.0]) == (0.0, False)
    assert paired_test([0.01, 0.01]) == (math.inf, True)


def _fabricated_runs(config: ExperimentConfig, accuracy: dict[str, list[float]]) -> list[Any]:
    """Runs whose metrics are all 1.0 except the given exact accuracies per arm and seed."""
    runs = []
    for index, seed in enumerate(config.seeds):
        for arm in config.arms:
            metrics = {metric: 1.0 for metric in METRICS}
            metrics["exact_accuracy"] = accuracy[arm][index]
            runs.append(
                {
                    "seed": seed,
                    "arm": arm,
                    "metrics": {split: dict(metrics) for split in TASKS[config.task].splits},
                    "history": [{"step": 5, "loss": 2.0, "ce": 2.0, "ntl": None}],
                    "examples": {split: [["1+1", "2", "2"]] for split in TASKS[config.task].splits},
                    "median_step_seconds": 0.1,
                    "train_seconds": 1.0,
                    "eval_seconds": 0.5,
                }
            )
    return runs


def test_report_states_which_differences_exceed_the_seed_spread(tmp_path: Path) -> None:
    config = SMOKE.with_overrides(seeds=(0, 1, 2), arms=("ce", "was"))
    timing = {"rounds": 3, "batch_size": 16, "device": "cpu", "threads": 1, "arms": {
        arm: {"median_seconds": 0.1, "ratio_to_ce": 1.0, "ratio_p20": 1.0, "ratio_p80": 1.0}
        for arm in config.arms
    }}  # fmt: skip
    # WAS beats CE by 0.10, 0.11, 0.12 on every split: t = 0.11 / (0.01 / sqrt 3) = 19 > 4.3.
    better = _fabricated_runs(config, {"ce": [0.2, 0.3, 0.4], "was": [0.3, 0.41, 0.52]})
    results = write_report(
        config, better, timing, tmp_path, command=None, wall_seconds=1.0, workers=1
    )
    assert results["verdict"].startswith("4 of 20 comparisons to CE exceed the seed spread")
    assert ": 4 better than CE, 0 worse." in results["verdict"]
    assert results["verdict_hits"][0].startswith(
        "CE+NTL-WAS on easy: exact acc +0.11 vs CE (better"
    )
    # The same mean gain with a sign flip in one seed does not exceed the spread.
    noisy = _fabricated_runs(config, {"ce": [0.2, 0.3, 0.4], "was": [0.45, 0.5, 0.38]})
    results = write_report(
        config, noisy, timing, tmp_path, command=None, wall_seconds=1.0, workers=1
    )
    assert results["verdict"].startswith("No difference to CE exceeds the seed spread")
    single = write_report(
        config.with_overrides(seeds=(0,)), noisy[:2], timing, tmp_path, command=None,
        wall_seconds=1.0, workers=1,
    )  # fmt: skip
    assert single["verdict"].startswith("With one seed the seed spread is unknown")


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, Any]]:
    run_dir = tmp_path_factory.mktemp("run") / "smoke"
    cache = tmp_path_factory.mktemp("questions")
    results = run_experiment(SMOKE, run_dir, cache_dir=cache, show_progress=False)
    return run_dir, cache, results


def test_run_writes_results_report_and_plot(smoke_run: tuple[Path, Path, dict[str, Any]]) -> None:
    run_dir, _, results = smoke_run
    stored = json.loads((run_dir / "results.json").read_text())  # standard JSON: no NaN
    assert stored == json.loads(json.dumps(results))
    assert (run_dir / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (run_dir / "report.md").read_text()
    for heading in ("## Results", "## Paired differences to CE", "## Verdict", "## Cost"):
        assert heading in report
    assert "step time =" in report and results["verdict"] in report

    runs = {(r["seed"], r["arm"]): r for r in results["runs"]}
    assert set(runs) == {(s, a) for s in SMOKE.seeds for a in SMOKE.arms}
    splits = results["splits"]
    assert splits == ["easy", "medium_hard", "interpolate", "extrapolate"]
    for split in splits:
        for metric in METRICS:
            values = [runs[(s, "ce")]["metrics"][split][metric] for s in SMOKE.seeds]
            assert results["summary"][split]["ce"][metric]["values"] == values
            difference = results["paired_differences"][split]["was"][metric]
            expected = [
                runs[(s, "was")]["metrics"][split][metric]
                - runs[(s, "ce")]["metrics"][split][metric]
                for s in SMOKE.seeds
                if runs[(s, "ce")]["metrics"][split][metric] is not None
                and runs[(s, "was")]["metrics"][split][metric] is not None
            ]
            assert difference["values"] == pytest.approx(expected)
            against_was = results["paired_vs_was"][split]["mse"][metric]
            assert set(results["paired_vs_was"][split]) == {"mse"}  # not CE, not NTL-WAS itself
            assert against_was["values"] == pytest.approx(
                [
                    runs[(s, "mse")]["metrics"][split][metric]
                    - runs[(s, "was")]["metrics"][split][metric]
                    for s in SMOKE.seeds
                    if runs[(s, "mse")]["metrics"][split][metric] is not None
                    and runs[(s, "was")]["metrics"][split][metric] is not None
                ]
            )
    assert set(results["timing"]["arms"]) == set(SMOKE.arms)
    assert "## Paired differences to NTL-WAS" in (run_dir / "report.md").read_text()
    table = format_table(results)
    assert table.count("CE+NTL-WAS") == len(splits)


def test_validation_run_scores_only_the_validation_split(tmp_path: Path) -> None:
    config = SMOKE.with_overrides(evaluate_on="validation", arms=("ce", "del"), seeds=(0,))
    results = run_experiment(config, tmp_path / "run", cache_dir=tmp_path, show_progress=False)
    assert results["splits"] == ["validation"]
    assert set(results["summary"]) == {"validation"}
    assert set(results["runs"][0]["metrics"]) == {"validation"}
    report = (tmp_path / "run" / "report.md").read_text()
    assert "on the validation split(s): validation" in report
    assert "**validation (train difficulties, held out; for choosing settings)**" in report


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
    result_file = run_dir / "seed0" / "ce" / "result.json"
    stamp = result_file.stat().st_mtime_ns
    again = run_experiment(SMOKE, run_dir, cache_dir=cache, show_progress=False)
    assert result_file.stat().st_mtime_ns == stamp
    assert again["runs"] == results["runs"] and again["summary"] == results["summary"]


def test_run_folder_with_other_settings_is_refused(
    smoke_run: tuple[Path, Path, dict[str, Any]],
) -> None:
    run_dir, cache, _ = smoke_run
    with pytest.raises(ValueError, match="holds a run with other settings \\(differing: steps\\)"):
        run_experiment(SMOKE.with_overrides(steps=41), run_dir, cache_dir=cache)


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
    assert "exact acc" in output and f"run folder: {tmp_path / 'run'}" in output
    spawned = json.loads((tmp_path / "run" / "results.json").read_text())
    assert spawned["command"].startswith("numtok compare --preset smoke")
    assert spawned["summary"] == in_process["summary"]  # workers do not change results
