"""``numtok choose-weights``: λ per arm from validation run folders, by the rule fixed before the
runs (the best mean over seeds, ties to the smaller λ), and the folders it refuses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from numtok.cli import main
from numtok.experiments.finetune.choose import choose_weights, read_validation_runs


def _results(weight: float, values: dict[str, list[float]], **config: Any) -> dict[str, Any]:
    """A results.json as the fine-tuning harness writes it: one run per (seed, arm), the
    validation metric ``log_mae`` and ``exact_accuracy`` of the greedy readout."""
    runs = [
        {
            "seed": seed,
            "arm": arm,
            "metrics": {"validation": {"greedy": {"log_mae": value, "exact_accuracy": 1 - value}}},
        }
        for arm, per_seed in values.items()
        for seed, value in enumerate(per_seed)
    ]
    settings = {"seeds": [0, 1, 2], "ntl_weight": weight, "evaluate_on": "validation", **config}
    return {"config": settings, "runs": runs}


def _folder(root: Path, result: dict[str, Any]) -> Path:
    folder = root / f"val-{result['config']['ntl_weight']:g}"
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps(result))
    return folder


SWEEP = [
    _results(0.3, {"ce": [0.2, 0.2, 0.2], "was": [0.30, 0.20, 0.25], "del": [0.5, 0.6, 0.7]}),
    _results(1.0, {"ce": [0.2, 0.2, 0.2], "was": [0.10, 0.40, 0.10], "del": [0.4, 0.6, 0.5]}),
    _results(3.0, {"ce": [0.2, 0.2, 0.2], "was": [0.20, 0.20, 0.20], "del": [0.9, 0.9, 0.9]}),
]


def test_each_arm_gets_the_weight_with_the_best_mean_over_seeds() -> None:
    choices = choose_weights(SWEEP, ["was", "del"], metric="log_mae")
    assert [(c.arm, c.chosen) for c in choices] == [("was", 1.0), ("del", 1.0)]
    assert choices[0].means == pytest.approx({0.3: 0.25, 1.0: 0.2, 3.0: 0.2})
    # exact_accuracy = 1 - log_mae: higher is better, so the same choice
    accuracy = choose_weights(SWEEP, ["was", "del"], metric="exact_accuracy")
    assert [c.chosen for c in accuracy] == [1.0, 1.0]


def test_a_tie_goes_to_the_smaller_weight() -> None:
    """was has mean 0.2 at λ = 1 and λ = 3 (folders given largest first): λ = 1."""
    (choice,) = choose_weights(SWEEP[::-1], ["was"], metric="log_mae")
    assert choice.chosen == 1.0


def test_arm_weights_in_the_config_give_the_arm_its_weight() -> None:
    result = _results(0.3, {"was": [0.0, 0.0, 0.0]}, arm_weights=[["was", 10.0]])
    (choice,) = choose_weights([result, SWEEP[0]], ["was"], metric="log_mae")
    assert choice.means == {0.3: pytest.approx(0.25), 10.0: 0.0} and choice.chosen == 10.0


@pytest.mark.parametrize(
    ("results", "match"),
    [
        ([SWEEP[0], _results(1.0, {"was": [0.1, 0.1]})], r"no finished run for seeds \[2\]"),
        ([SWEEP[0], SWEEP[0]], r"the same λ = 0\.3"),
        ([SWEEP[0], _results(1.0, {"was": [0.1]}, seeds=[0])], "share their seeds"),
        ([_results(1.0, {"was": [0.1, float("nan"), 0.1]})], "seed 1 of arm 'was' has no"),
        ([], "at least one validation run folder"),
    ],
)
def test_incomplete_or_inconsistent_sweeps_are_refused(
    results: list[dict[str, Any]], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        choose_weights(results, ["was"], metric="log_mae")


def test_only_folders_scored_on_validation_are_read(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no results\.json"):
        read_validation_runs(tmp_path)
    folder = _folder(tmp_path, _results(0.3, {"was": [0.1] * 3}, evaluate_on="test"))
    with pytest.raises(ValueError, match="was scored on 'test'"):
        read_validation_runs(folder)


def test_the_command_prints_the_means_and_the_arm_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folders = [str(_folder(tmp_path, result)) for result in SWEEP]
    assert main(["choose-weights", *folders, "--arms", "was,del", "--metric", "log_mae"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "was: λ=0.3: 0.2500, λ=1: 0.2000, λ=3: 0.2000 -> λ = 1"
    assert out[-1] == "--arm-weights was=1,del=1"
    with pytest.raises(SystemExit) as exit_info:
        main(["choose-weights", str(tmp_path), "--metric", "log_mae"])
    assert exit_info.value.code == 2
    assert "no results.json" in capsys.readouterr().err
