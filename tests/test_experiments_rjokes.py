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

from numtok import number_token_loss
from numtok.cli import main
from numtok.readout.distribution import number_distribution
from numtok_compare.presets import PRESETS
from numtok_compare.report import reanalyse
from numtok_compare.runner.phases import Job, score_test, train_and_validate
from numtok_compare.scratch.arm import ScoreRegressor, build_transformer_arm
from numtok_compare.scratch.config import RJokesConfig
from numtok_compare.scratch.readouts import CachedScorer, token_predictions
from numtok_compare.scratch.rjokes import (
    RJokesTask,
    build_tokenizer,
    prepare_training,
    run_rjokes,
)
from numtok_compare.scratch.tokenizer import WordTokenizer
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


def test_word_tokenizer() -> None:
    tokenizer = WordTokenizer.from_texts(
        ["The cat, the CAT 12!", "the dog's cat"], max_words=3, max_prompt_tokens=4
    )
    assert tokenizer.tokens[3:14] == ["<unk>", *"0123456789"]
    # "cat" and "the" 3 times each (ties alphabetically), then "!" first of the single ones
    assert tokenizer.tokens[14:] == ["cat", "the", "!"]
    ids = tokenizer.encode("the cat 1 2 zebra")
    assert ids[:2] == [15, 14] and ids[-1] == tokenizer.unknown_id
    assert tokenizer.encode_prompt("the cat the cat the cat")[-1] == tokenizer.separator_id
    assert len(tokenizer.encode_prompt("the cat the cat the cat")) == 5
    assert tokenizer.decode(tokenizer.encode("the cat 1 2")) == "the cat 12"
    assert tokenizer.number_vocab().digits == list("0123456789")
    inputs, labels = tokenizer.encode_example("the cat", "10")
    assert labels == [-100, -100, tokenizer.tokens.index("1"), tokenizer.tokens.index("0"), 2]
    assert inputs[2] == tokenizer.separator_id


def test_arms_share_the_trunk_and_compute_their_losses(data: RJokesData) -> None:
    config = SMOKE.with_overrides(arms=("ce", "was", "mse", "head", "gls"), ntl_weight=0.7)
    tokenizer, training = prepare_training(config, data)
    arms = {arm: build_transformer_arm(config, 3, arm, tokenizer, training) for arm in config.arms}
    trunk = arms["ce"].model.state_dict()
    head_model = arms["head"].model
    assert isinstance(head_model, ScoreRegressor)
    for name, arm in arms.items():
        model = arm.model
        state = (
            model.trunk.state_dict() if isinstance(model, ScoreRegressor) else model.state_dict()
        )
        assert all(torch.equal(state[k], v) for k, v in trunk.items()), name
    assert float(head_model.head.weight.detach().abs().sum()) == 0.0

    batch = training.batch(3, 0, config.batch_size)
    vocab = tokenizer.number_vocab()
    model = arms["was"].model
    with torch.no_grad():
        logits = model(batch.inputs, positions=batch.positions, allowed=batch.allowed)
    # The step computes logits at the answer tokens only; the reference, at every position.
    loss, ce, ntl = arms["was"].step(0, 1e-3)
    torch.testing.assert_close(ce, F.cross_entropy(logits.flatten(0, 1), batch.labels.flatten()))
    torch.testing.assert_close(ntl, number_token_loss(logits, batch.labels, vocab, kind="was"))
    torch.testing.assert_close(loss, ce + 0.7 * ntl)

    chosen = torch.as_tensor(training.batch_indices(3, 0, config.batch_size))
    columns = batch.example_offsets + training.answer_offsets[chosen]
    assert bool((batch.inputs[batch.example_rows, columns] == tokenizer.separator_id).all())
    with torch.no_grad():
        hidden = head_model.trunk.features(
            batch.inputs, positions=batch.positions, allowed=batch.allowed
        )
        expected = F.mse_loss(
            head_model(hidden[batch.example_rows, columns]), training.targets[chosen]
        )
    loss, ce, ntl = arms["head"].step(0, 1e-3)
    assert ce is None and ntl is None
    assert (arms["head"].has_ce, arms["head"].has_ntl) == (False, False)
    torch.testing.assert_close(loss, expected)
    scores = torch.tensor([s for _, s in data.train], dtype=torch.float32)
    torch.testing.assert_close(training.targets * training.score_std + training.score_mean, scores)


def test_the_head_arm_refuses_a_training_set_without_targets(data: RJokesData) -> None:
    from numtok_compare.scratch.batches import TrainingSet

    tokenizer = build_tokenizer(SMOKE, data)
    plain = TrainingSet([(text, str(score)) for text, score in data.train], tokenizer)
    with pytest.raises(
        TypeError,
        match=r"the head arm trains on a ScoredTrainingSet \(numeric targets\), got TrainingSet",
    ):
        build_transformer_arm(SMOKE, 0, "head", tokenizer, plain)


def test_cached_scorer_matches_unpadded_forward_passes(data: RJokesData) -> None:
    tokenizer, training = prepare_training(SMOKE, data)
    model = build_transformer_arm(SMOKE, 0, "ce", tokenizer, training).model.eval()
    prompts = [tokenizer.encode_prompt(text) for text, _ in data.test[:5]]
    assert len({len(p) for p in prompts}) > 1, "prompts of different lengths test the padding"
    scorer = CachedScorer(model, prompts, tokenizer.pad_id, "cpu")

    def alone(sequence: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return model(torch.tensor([sequence]))[0, -1]

    torch.testing.assert_close(scorer.start(), torch.stack([alone(p) for p in prompts]))
    parents, tokens = torch.tensor([4, 0, 0, 2]), torch.tensor([5, 6, 7, 8])
    sequences = [[*prompts[p], t] for p, t in zip(parents.tolist(), tokens.tolist(), strict=True)]
    torch.testing.assert_close(
        scorer.extend(parents, tokens), torch.stack([alone(s) for s in sequences])
    )
    parents, tokens = torch.tensor([3, 1]), torch.tensor([9, 10])
    sequences = [[*sequences[p], t] for p, t in zip(parents.tolist(), tokens.tolist(), strict=True)]
    torch.testing.assert_close(
        scorer.extend(parents, tokens), torch.stack([alone(s) for s in sequences])
    )


def test_token_readouts_are_the_distribution_summaries(data: RJokesData) -> None:
    tokenizer, training = prepare_training(SMOKE, data)
    model = build_transformer_arm(SMOKE, 0, "ce", tokenizer, training).model
    jokes = data.test[:20]
    predictions, mass, pruned = token_predictions(
        model, tokenizer, [text for text, _ in jokes], batch_size=7, max_new_tokens=6,
        max_digits=2, min_probability=0.0, device="cpu",
    )  # fmt: skip
    prompts = [tokenizer.encode_prompt(text) for text, _ in jokes]
    exact = number_distribution(
        CachedScorer(model, prompts, tokenizer.pad_id, "cpu"), tokenizer.number_vocab()
    )
    assert predictions["expected"] == pytest.approx(exact.mean.tolist())
    assert predictions["median"] == exact.median.tolist()
    assert mass == pytest.approx(exact.mass.tolist()) and pruned == [0.0] * 20
    assert len(predictions["greedy"]) == 20


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
