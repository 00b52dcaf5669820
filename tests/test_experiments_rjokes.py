"""The rJokes comparison on a small generated data folder: data and splits, the word tokenizer,
paired arms and their losses, the cached readouts against unpadded forward passes, metrics,
a whole run with its report, resumption, and the command line."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("matplotlib", reason="needs the harness: pip install ./compare[demo]")

from numtok import last_number, predict_numbers
from numtok.cli import main
from numtok_compare.presets import PRESETS
from numtok_compare.regression_head import RegressionHead
from numtok_compare.report import reanalyse
from numtok_compare.runner.phases import Job, score_test, train_and_validate
from numtok_compare.runner.scoring import generate_answers
from numtok_compare.scratch.config import RJokesConfig
from numtok_compare.scratch.rjokes import GREEDY_TOKENS, RJokesTask, run_rjokes
from numtok_compare.scratch.tokenizer import encode_example
from numtok_compare.tasks.rjokes import (
    RJokesData,
    evaluation_subset,
    find_data_dir,
    load_rjokes,
    read_jokes,
)

SMOKE: RJokesConfig = PRESETS["rjokes-smoke"].config  # type: ignore[assignment]
WORDS = [
    "cat",
    "dog",
    "priest",
    "rabbi",
    "bar",
    "walks",
    "into",
    "says",
    "why",
    "knock",
    "who",
    "there",
    "pun",
    "wife",
    "doctor",
]


def write_jokes(path: Path, count: int, seed: int) -> None:
    """Jokes of 3-40 words; the score counts the words 'pun' and 'priest' (0-11), so it can be
    learned."""
    rng = random.Random(seed)
    lines = []
    for _ in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 40))]
        if rng.random() < 0.2:
            words.append(str(rng.randint(0, 99)))  # digits inside the joke text
        score = min(11, sum(w in ("pun", "priest") for w in words))
        lines.append(f"{score}\t{' '.join(words).capitalize()}!\n")
    with gzip.open(path, "wt", encoding="utf-8") as file:
        file.writelines(lines)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("rjokes")
    write_jokes(directory / "dev.tsv.gz", 300, seed=1)
    write_jokes(directory / "test.tsv.gz", 200, seed=2)
    return directory


@pytest.fixture(scope="module")
def data(data_dir: Path) -> RJokesData:
    return load_rjokes(data_dir, validation_jokes=SMOKE.validation_jokes)


def test_validation_is_a_fixed_held_out_slice(data_dir: Path, data: RJokesData) -> None:
    assert len(data.train) == 280 and len(data.validation) == 20 and len(data.test) == 200
    pool = read_jokes(data_dir / "dev.tsv.gz")
    assert sorted(data.train + data.validation) == sorted(pool)
    again = load_rjokes(data_dir, validation_jokes=20)
    assert again.validation == data.validation and again.digest == data.digest
    subset = evaluation_subset(data.test, 50)
    assert len(subset) == 50 and set(subset) <= set(evaluation_subset(data.test, 120))
    assert evaluation_subset(data.test, 0) == data.test


def test_a_train_file_is_preferred_and_plain_tsv_is_read(tmp_path: Path) -> None:
    write_jokes(tmp_path / "dev.tsv.gz", 30, seed=3)
    (tmp_path / "train.tsv").write_text("3\tA priest, a pun.\n0\tKnock knock.\n1\tWho is there?\n")
    write_jokes(tmp_path / "test.tsv.gz", 10, seed=4)
    loaded = load_rjokes(tmp_path, validation_jokes=1)
    assert len(loaded.train) + len(loaded.validation) == 3
    assert loaded.files[0].endswith("train.tsv")


def test_missing_or_bad_data_is_a_clear_error(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.delenv("NUMTOK_RJOKES_DIR", raising=False)
    with pytest.raises(ValueError, match=r"lacks train\.tsv\(\.gz\) or dev\.tsv\(\.gz\) and test"):
        find_data_dir(tmp_path)
    monkeypatch.setenv("NUMTOK_RJOKES_DIR", str(tmp_path / "elsewhere"))
    with pytest.raises(ValueError, match=r"github\.com/orionw/rJokesData"):
        find_data_dir(None)
    (tmp_path / "dev.tsv").write_text("1\tfine\nhigh\tno score\n")
    with pytest.raises(ValueError, match=r"dev\.tsv:2: expected 'score<TAB>joke'"):
        read_jokes(tmp_path / "dev.tsv")
    write_jokes(tmp_path / "test.tsv.gz", 5, seed=0)
    (tmp_path / "dev.tsv").write_text("1\tfine\n2\talso fine\n")
    with pytest.raises(ValueError, match=r"validation_jokes must be between 1 and 1 .* got 2"):
        load_rjokes(tmp_path, validation_jokes=2)


def test_arms_share_the_trunk_and_the_head_reads_standardised_scores(
    data: RJokesData, tmp_path: Path
) -> None:
    config = SMOKE.with_overrides(arms=("ce", "was", "head"), ntl_weight=0.7)
    task = RJokesTask(config, data)
    arms = {arm: task.build(Job(3, arm, config.weight_of(arm))) for arm in config.arms}
    trunk = arms["ce"].model.model.state_dict()
    head = arms["head"].model
    assert isinstance(head, RegressionHead) and not head.head.weight.any()
    for state in (arms["was"].model.model.state_dict(), head.decoder.state_dict()):
        assert all(torch.equal(state[name], tensor) for name, tensor in trunk.items())
    batch = arms["head"].collate(task.examples[:16])
    scores = torch.tensor([score for _, score in data.train[:16]], dtype=torch.float32)
    mean, std = task.scale
    torch.testing.assert_close(batch["targets"] * std + mean, scores)
    loss = arms["head"].trainer(tmp_path).compute_loss(head, dict(batch))
    inputs = {key: batch[key] for key in ("input_ids", "attention_mask", "labels")}
    torch.testing.assert_close(loss, F.mse_loss(head.predict(**inputs), batch["targets"]))


def test_token_readouts_are_the_distribution_summaries_and_the_greedy_text(
    data: RJokesData,
) -> None:
    """Scored in chunks of ``eval_batch_size`` jokes, the readouts are those of one call of
    predict_numbers over every joke, and the greedy answers those of generate()."""
    config = SMOKE.with_overrides(eval_batch_size=7, min_probability=0.0, eval_jokes=20)
    task = RJokesTask(config, data)
    model = task.build(Job(0, "ce", 0.0)).model.eval()
    scored = task.score(model, "test", lambda _: None)
    examples = [
        encode_example(task.tokenizer, text, str(score), max_prompt_tokens=SMOKE.max_prompt_tokens)
        for text, score in task.jokes["test"]
    ]
    exact = predict_numbers(model, task.tokenizer, [list(e.prompt) for e in examples])
    assert scored["answers"]["expected"] == pytest.approx(exact.mean.tolist())
    assert scored["answers"]["median"] == exact.median.tolist()
    assert scored["mass"] == pytest.approx(exact.mass.tolist()) and scored["pruned"] == [0.0] * 20
    texts = generate_answers(model, task.tokenizer, examples, 5, GREEDY_TOKENS)
    assert scored["answers"]["greedy"] == [last_number(text) for text in texts]


@pytest.fixture(scope="module")
def smoke_run(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    run_dir = tmp_path_factory.mktemp("run")
    results = run_rjokes(SMOKE, run_dir, data_dir=data_dir, show_progress=False)
    return run_dir, results


def test_run_writes_rows_report_and_plot(smoke_run: tuple[Path, Any]) -> None:
    """The one report writer's rows and analysis: every seed's prediction for every scored
    joke of validation (which the gate reads) and test, each arm against CE and every token arm
    against the regression head, by the crossed analysis; a rebuild from the rows is the same."""
    run_dir, results = smoke_run
    assert (run_dir / "report.md").exists() and (run_dir / "report.png").stat().st_size > 0
    stored = json.loads((run_dir / "results.json").read_text())
    assert stored == results
    answers = stored["answers"]
    assert set(answers) == {"validation", "test"}
    readouts = {arm: set(by_readout) for arm, by_readout in answers["test"].items()}
    assert readouts == {**{arm: {"greedy", "expected", "median"} for arm in ("ce", "was", "mse")},
                        "head": {"head"}}  # fmt: skip
    for split, by_arm in answers.items():
        items = len(stored["references"][split])
        assert items == SMOKE.eval_jokes
        for by_readout in by_arm.values():
            assert all(np.shape(rows) == (len(SMOKE.seeds), items) for rows in by_readout.values())
    compared = {(c["arm"], c["readout"], c["baseline_arm"], c["baseline"])
                for c in stored["comparisons"] if c["split"] == "test"}  # fmt: skip
    assert ("was", "expected", "ce", "expected") in compared
    assert ("was", "expected", "head", "head") in compared
    assert ("ce", "greedy", "head", "head") in compared
    assert ("head", "head", "ce", "expected") in compared
    assert stored["gate"]["constant"] in ("mean", "median", "mode")
    assert len(stored["gate"]["arms"]) == 10  # 3 token arms × 3 readouts, and the head
    learnt = {(e["arm"], e["readout"]): e["learnt"] for e in stored["gate"]["arms"]}
    for c in stored["comparisons"]:
        gated = learnt[(c["arm"], c["readout"])] and learnt[(c["baseline_arm"], c["baseline"])]
        assert c["verdict"] == (c["interval_verdict"] if gated else "no verdict")
    report = (run_dir / "report.md").read_text()
    assert report.startswith("# rJokes from scratch: ce, was, mse, head")
    assert "## Learnability gate (validation)" in report and "BERT-base" in report
    assert "| was | expected | head | mse |" in report
    again = reanalyse(run_dir, run_dir / "again")
    assert again == results
    assert (run_dir / "again" / "report.md").read_text() == report


def test_rerun_reads_finished_arms_back(smoke_run: tuple[Path, Any], data_dir: Path) -> None:
    run_dir, results = smoke_run
    stamps = {p: p.stat().st_mtime_ns for p in run_dir.glob("seed*/*/*.json")}
    assert len(stamps) == 2 * len(SMOKE.seeds) * len(SMOKE.arms)  # validation.json, test.json
    again = run_rjokes(SMOKE, run_dir, data_dir=data_dir, show_progress=False)
    assert again["answers"] == results["answers"]
    assert stamps == {p: p.stat().st_mtime_ns for p in run_dir.glob("seed*/*/*.json")}
    with pytest.raises(ValueError, match="holds a run with other settings"):
        run_rjokes(SMOKE.with_overrides(steps=31), run_dir, data_dir=data_dir)


def test_progress_counts_steps_and_scored_jokes(data: RJokesData, tmp_path: Path) -> None:
    config = SMOKE.with_overrides(steps=12, checkpoint_every=5)
    task = RJokesTask(config, data)
    for arm in ("was", "head"):
        job, directory = Job(0, arm, config.weight_of(arm)), tmp_path / arm
        validated: list[int] = []
        train_and_validate(task, job, directory, validated.append)
        assert sum(validated) == 12 + config.eval_jokes
        tested: list[int] = []
        score_test(task, job, directory, ["test"], tested.append)
        assert sum(tested) == config.eval_jokes


def test_command_line(data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(
        ["compare", "--preset", "rjokes-smoke", "--seeds", "1", "--arms", "ce,head",
         "--workers", "1", "--no-progress", "--data-dir", str(data_dir),
         "--out", str(tmp_path / "run")]
    )  # fmt: skip
    assert status == 0
    output = capsys.readouterr().out
    assert "learnability gate (validation rmse" in output and "primary endpoint" in output
    assert json.loads((tmp_path / "run" / "results.json").read_text())["config"]["seeds"] == [0]
    for flags, message in (
        (
            ["--task", "rjokes", "--train-examples", "5"],
            "--train-examples does not apply to a comparison of task 'rjokes' (it takes "
            "--eval-examples)",
        ),
        (["--task", "rjokes", "--data-dir", str(tmp_path)], "lacks train.tsv(.gz)"),
        (["--preset", "demo", "--task", "rjokes"], "does not fit the preset 'demo'"),
        (
            ["--preset", "rjokes", "--adaptation", "lora"],
            "--adaptation does not apply to the rJokes",
        ),
        (["--task", "rjokes", "--arms", "ce,ntl"], "arms must be chosen from"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(["repro", *flags, "--out", str(tmp_path / "refused")])
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err
        assert not (tmp_path / "refused").exists()


def test_demo_runs_rjokes_when_its_data_is_found_else_arithmetic(
    data_dir: Path, tmp_path: Path, monkeypatch: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # --train-examples applies to arithmetic only: which error comes tells which task the demo
    # chose.
    flags = ["--train-examples", "5", "--steps", "0", "--out", str(tmp_path / "run")]
    monkeypatch.setenv("NUMTOK_RJOKES_DIR", str(data_dir))
    with pytest.raises(SystemExit):
        main(["demo", *flags])
    assert "--train-examples does not apply to a comparison of task 'rjokes'" in (
        capsys.readouterr().err
    )
    monkeypatch.setenv("NUMTOK_RJOKES_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(SystemExit):
        main(["demo", *flags])
    error = capsys.readouterr().err
    assert "running the arithmetic comparison, since the rJokes data folder" in error
    assert "steps must be at least 1, got 0" in error
    with pytest.raises(SystemExit):
        main(["demo", "--data-dir", str(tmp_path / "nowhere"), "--out", str(tmp_path / "run")])
    assert "lacks train.tsv(.gz)" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_validation_only_scores_the_validation_split() -> None:
    """demo and compare spell it one way: --validation-only sets evaluate_on."""
    import numtok_compare.commands as harness
    from numtok_compare.cli import _build_config, _parser

    def config(*flags: str, preset: str = "rjokes-smoke") -> Any:
        return _build_config(_parser().parse_args(["demo", *flags]), preset, harness)

    assert config().evaluate_on == "test"
    assert config("--validation-only").evaluate_on == "validation"
    assert config("--validation-only", preset="smoke").evaluate_on == "validation"
