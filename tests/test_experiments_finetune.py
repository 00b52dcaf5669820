"""The fine-tuning presets' harness (numtok_compare.finetune) on a tiny random Llama saved as
a model folder (no download): the arithmetic splits, the examples and their batches, the answer
positions the loss reads, a whole run of each task (every arm, the report, the regression head),
resuming, and the command line."""

from __future__ import annotations

import gzip
import json
import random
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch

from numtok_compare.finetune.comparison import run_finetune
from numtok_compare.finetune.config import FinetuneConfig
from numtok_compare.finetune.data import load_finetune_data
from numtok_compare.finetune.examples import encode
from numtok_compare.presets import PRESETS
from numtok_compare.report import reanalyse
from numtok_compare.runner.batches import prompt_batch, training_batch
from numtok_compare.runner.run_folder import prepare_run_dir
from numtok_compare.tasks.arithmetic import arithmetic_splits

from _hf_tiny import build_tokenizer

SIZES = {"train": 40, "validation": 8, "test": 8, "test_harder": 6}


@pytest.fixture(scope="module")
def jokes_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("jokes")
    rng = random.Random(0)
    for name, count in (("dev.tsv.gz", 60), ("test.tsv.gz", 20)):
        lines = [
            f"{rng.randint(0, 11)}\tjoke {i} about {rng.randint(0, 99)} cats" for i in range(count)
        ]
        with gzip.open(folder / name, "wt") as file:
            file.write("\n".join(lines) + "\n")
    return folder


def small(tiny_llama_dir: Path, **changes: Any) -> FinetuneConfig:
    settings: dict[str, Any] = {
        "model": str(tiny_llama_dir), "steps": 3, "batch_size": 4, "train_examples": SIZES["train"],
        "validation_examples": SIZES["validation"], "test_examples": SIZES["test"],
        "harder_examples": SIZES["test_harder"], "seeds": (0, 1), "eval_batch_size": 4,
        "threads": 1, "max_prompt_tokens": 12, "max_new_tokens": 4, "warmup_steps": 1,
        "learning_rate": 1e-2,
    }  # fmt: skip
    return FinetuneConfig(**{**settings, **changes})


def test_arithmetic_splits_are_disjoint_correct_and_fixed() -> None:
    splits = arithmetic_splits(SIZES)
    assert {k: len(v) for k, v in splits.items()} == SIZES
    questions = [q.question for split in splits.values() for q in split]
    assert len(set(questions)) == len(questions)
    for split, entries in splits.items():
        for entry in entries:
            a, sign, b = entry.question.removeprefix("What is ").removesuffix("?").split()
            assert int(entry.answer) == (int(a) + int(b) if sign == "+" else int(a) - int(b))
            assert int(entry.answer) >= 0
            widths = {len(a), len(b)}
            assert widths <= ({4} if split == "test_harder" else {2, 3})
    assert arithmetic_splits(SIZES) == splits
    assert arithmetic_splits({"test": 5})["test"] == splits["test"][:5]
    with pytest.raises(ValueError, match="sizes names splits"):
        arithmetic_splits({"dev": 3})


def test_examples_train_on_the_answer_only() -> None:
    tokenizer = build_tokenizer()
    examples = [encode(tokenizer, "What is 12 + 30?", "42"), encode(tokenizer, "1+1=", "2")]
    assert examples[0].answer[-1] == tokenizer.eos_token_id and examples[0].value == 42.0
    batch = training_batch(examples, pad_id=0)
    for row, example in enumerate(examples):
        answer = batch["labels"][row][batch["labels"][row] != -100].tolist()
        assert answer == list(example.answer)
        assert int(batch["attention_mask"][row].sum()) == len(example.prompt) + len(example.answer)
    prompts = prompt_batch([e.prompt for e in examples], pad_id=0)
    assert prompts["input_ids"][1, -len(examples[1].prompt) :].tolist() == list(examples[1].prompt)
    assert prompts["attention_mask"][1, 0] == 0


def test_generated_data_has_a_content_digest(tiny_llama_dir: Path) -> None:
    """The pre-registration pins the examples themselves, generated ones included: the same
    settings give the same digest, other examples another."""
    tokenizer = build_tokenizer()
    config = small(tiny_llama_dir)
    digest = load_finetune_data(config, tokenizer).content_digest
    assert len(digest) == 16 and digest == load_finetune_data(config, tokenizer).content_digest
    other = config.with_overrides(train_examples=SIZES["train"] + 1)
    assert load_finetune_data(other, tokenizer).content_digest != digest


def test_the_fresh_4_digit_split_repeats_no_question_of_another_split() -> None:
    """Drawn after every other split, with a seed of its own: adding it changed none of them,
    and it shares no question with test_harder, the split whose result it tests afresh."""
    sizes = {**SIZES, "test_fresh_4_digit": 50}
    splits = arithmetic_splits(sizes)
    assert {k: v for k, v in splits.items() if k != "test_fresh_4_digit"} == arithmetic_splits(
        SIZES
    )
    fresh = {q.question for q in splits["test_fresh_4_digit"]}
    assert len(fresh) == 50 and not fresh & {q.question for q in splits["test_harder"]}
    operands = [
        q.question.removeprefix("What is ").removesuffix("?").split()[::2]
        for q in splits["test_fresh_4_digit"]
    ]
    assert all(len(a) == len(b) == 4 for a, b in operands)


def test_a_whole_arithmetic_run_reports_and_resumes(
    tiny_llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = small(tiny_llama_dir, arms=("base", "ce", "was", "mse", "del", "gls"))
    results = run_finetune(config, tmp_path / "run", log=lambda _: None)
    runs = {(run["seed"], run["arm"]) for run in results["runs"]}
    # base is scored once (seed 0) and pairs with every seed of CE.
    assert runs == {(s, a) for s in (0, 1) for a in config.arms if a != "base"} | {(0, "base")}
    assert set(results["answers"]) == {"validation", "test", "test_harder"}
    assert len(results["answers"]["test"]["base"]["greedy"]) == 1
    assert len(results["answers"]["test"]["was"]["greedy"]) == 2
    assert len(results["answers"]["test"]["was"]["greedy"][0]) == SIZES["test"]
    was = next(r for r in results["runs"] if (r["seed"], r["arm"]) == (0, "was"))
    ce = next(r for r in results["runs"] if (r["seed"], r["arm"]) == (0, "ce"))
    assert was["history"][-1]["ntl"] >= 0 and was["history"] != ce["history"]
    compared = [c for c in results["comparisons"] if c["arm"] == "del" and c["split"] == "test"]
    assert {c["metric"] for c in compared} >= {"exact_accuracy", "log_mae", "within_1_percent"}
    assert all(set(c) >= {"difference", "low", "high", "df", "mde", "verdict", "reason",
                          "parsed_share"} for c in compared)  # fmt: skip
    # One interval per comparison, its verdict from it; a verdict needs both arms to have
    # learnt on validation (the gate is per comparison).
    learnt = {(e["arm"], e["readout"]): e["learnt"] for e in results["gate"]["arms"]}
    for c in results["comparisons"]:
        gated = learnt[(c["arm"], c["readout"])] and learnt[(c["baseline_arm"], c["baseline"])]
        assert c["verdict"] == (c["interval_verdict"] if gated else "no verdict")
        if c["verdict"] in ("better", "worse"):
            assert c["low"] > 0 or c["high"] < 0
    run_dir = tmp_path / "run"
    report = (run_dir / "report.md").read_text()
    assert report.index("## Primary endpoint") < report.index("## Learnability gate")
    assert "## test_harder" in report and "| del | greedy | CE greedy | log_mae |" in report
    assert (run_dir / "report.png").stat().st_size > 0
    assert not list(run_dir.rglob("model.pt"))  # dropped once the test splits were scored
    # The rows hold everything the analysis reads: rebuilt from them, the report is the same.
    again_from_rows = reanalyse(run_dir, tmp_path / "again")
    assert again_from_rows == results
    assert (tmp_path / "again" / "report.md").read_text() == report
    assert (tmp_path / "again" / "results.json").read_text() == (
        run_dir / "results.json"
    ).read_text()

    import numtok_compare.finetune.comparison as runner

    def refuse(*_: Any, **__: Any) -> None:
        raise AssertionError("a finished arm was trained or scored again")

    monkeypatch.setattr(runner, "build_arm", refuse)
    monkeypatch.setattr(runner, "score_split", refuse)
    again = run_finetune(config, run_dir, log=lambda _: None)
    assert again["answers"] == results["answers"] and again["comparisons"] == results["comparisons"]
    model_json = run_dir / "model.json"
    model_json.write_text(json.dumps({"folder": "elsewhere", "digest": "0" * 12}))
    with pytest.raises(ValueError, match="holds arms of another model"):
        run_finetune(config, run_dir, log=lambda _: None)


def test_an_interrupted_run_resumes_where_it_stopped(
    tiny_llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed while scoring the test split: what finished is read back, the rest is done, and
    the result equals an uninterrupted run's."""
    config = small(tiny_llama_dir, arms=("ce", "was"), seeds=(0,), test_splits=("test",))
    straight = run_finetune(config, tmp_path / "straight", log=lambda _: None)
    import numtok_compare.finetune.comparison as runner

    calls: list[str] = []
    original = runner.score_split

    def stop_at_the_test_split(trained: Any, tokenizer: Any, cfg: Any, examples: Any) -> Any:
        calls.append("score")
        if len(calls) == 3:  # validation of ce and was, then the first test split
            raise KeyboardInterrupt
        return original(trained, tokenizer, cfg, examples)

    monkeypatch.setattr(runner, "score_split", stop_at_the_test_split)
    with pytest.raises(KeyboardInterrupt):
        run_finetune(config, tmp_path / "resumed", log=lambda _: None)
    assert len(list((tmp_path / "resumed").rglob("model.pt"))) == 2
    monkeypatch.setattr(runner, "score_split", original)
    trained: list[str] = []
    train = runner.build_arm
    monkeypatch.setattr(
        runner, "build_arm", lambda *a, **k: trained.append(a[1].arm) or train(*a, **k)
    )
    resumed = run_finetune(config, tmp_path / "resumed", log=lambda _: None)
    assert trained == [] and resumed["answers"] == straight["answers"]


@pytest.mark.parametrize("arm", ["was", "head"])
def test_an_arm_killed_while_training_continues_from_its_checkpoint(
    tiny_llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arm: str
) -> None:
    """Fine-tuning trains with the transformers Trainer: killed after its checkpoint at step 2
    of 4, an arm (LoRA adapters, or a head with a learning rate of its own) continues from step 2
    on the batches it had not seen, and its answers and logged losses equal an uninterrupted
    run's."""
    config = small(
        tiny_llama_dir, arms=("ce", arm), seeds=(0,), test_splits=("test",), steps=4,
        checkpoint_every=2, log_every=1, adaptation="lora", lora_rank=2,
        **({"max_value": 99, "readout": "expected", "head_learning_rate": 3e-2}
           if arm == "head" else {}),
    )  # fmt: skip
    import numtok_compare.finetune.arm as train
    import numtok_compare.runner.batches as batches_module

    batches: list[list[float]] = []
    original = train.training_batch

    def recorded(examples: Any, pad_id: int) -> Any:
        batches.append([e.value for e in examples])
        return original(examples, pad_id)

    def record_with(collate: Any) -> None:
        # The token arms' batches (finetune.arm's name) and the head's (regression_batch's call).
        monkeypatch.setattr(train, "training_batch", collate)
        monkeypatch.setattr(batches_module, "training_batch", collate)

    record_with(recorded)
    straight = run_finetune(config, tmp_path / "straight", log=lambda _: None)
    straight_batches = list(batches)
    checkpoint = tmp_path / "resumed" / "seed0" / arm / "checkpoints" / "checkpoint-2"

    def stop_after_the_checkpoint(examples: Any, pad_id: int) -> Any:
        if checkpoint.exists():
            raise KeyboardInterrupt
        return recorded(examples, pad_id)

    batches.clear()
    record_with(stop_after_the_checkpoint)
    with pytest.raises(KeyboardInterrupt):
        run_finetune(config, tmp_path / "resumed", log=lambda _: None)
    batches.clear()
    record_with(recorded)
    resumed = run_finetune(config, tmp_path / "resumed", log=lambda _: None)
    # Steps 3 and 4 of the arm (and the data loader's one batch of look-ahead), nothing of ce's,
    # as the uninterrupted run made them.
    assert batches == straight_batches[-3:]
    assert resumed["answers"] == straight["answers"]
    histories = [{(r["seed"], r["arm"]): r["history"] for r in run["runs"]}
                 for run in (straight, resumed)]  # fmt: skip
    assert histories[0] == histories[1] and len(histories[0][(0, arm)]) == 4
    # The resumed arm says where it resumed, in its row and in the report; the others began at 0.
    assert [run.get("resumed_at") for run in resumed["runs"]] == [
        2 if run["arm"] == arm else None for run in resumed["runs"]
    ]
    report = (tmp_path / "resumed" / "report.md").read_text()
    assert (
        f"Resumed from a checkpoint (an interrupted run or a lost worker): seed 0 {arm} λ="
        in (report)
        and "at step 2." in report
    )
    assert "Resumed from" not in (tmp_path / "straight" / "report.md").read_text()
    assert not list((tmp_path / "resumed").rglob("checkpoint-*"))


def test_rjokes_with_the_regression_head_and_the_readouts(
    tiny_llama_dir: Path, jokes_dir: Path, tmp_path: Path
) -> None:
    config = small(
        tiny_llama_dir, task="rjokes", arms=("ce", "was", "head"), seeds=(0,), max_value=11,
        metric="rmse", head_learning_rate=0.05,
    )  # fmt: skip
    results = run_finetune(config, tmp_path / "run", data_dir=jokes_dir, log=lambda _: None)
    assert set(results["answers"]["test"]["ce"]) == {"greedy", "expected", "median", "mode"}
    head = results["answers"]["test"]["head"]["head"][0]
    assert len(head) == SIZES["test"] and all(isinstance(v, float) for v in head)
    baselines = {c["baseline"] for c in results["comparisons"] if c["arm"] == "head"}
    assert baselines == {"expected", "greedy"}
    # Every token arm by every readout against the head too (the paper's regression claim).
    against_head = {
        (c["arm"], c["readout"]) for c in results["comparisons"]
        if (c["split"], c["baseline_arm"]) == ("test", "head")
    }  # fmt: skip
    assert against_head == {
        (a, r) for a in ("ce", "was") for r in ("greedy", "expected", "median", "mode")
    }
    assert any("cut to its first 12 tokens" in note for note in results["data"]["notes"])
    # The constant answers: the training jokes' mean, median and mode score for every joke.
    from transformers import AutoTokenizer

    data = load_finetune_data(config, AutoTokenizer.from_pretrained(tiny_llama_dir), jokes_dir)
    train = [e.value for e in data.splits["train"]]
    truth = torch.tensor([e.value for e in data.splits["test"]], dtype=torch.float64)
    constants = results["constants"]["test"]
    assert constants["mean"]["value"] == pytest.approx(sum(train) / len(train))
    assert constants["median"]["value"] == statistics.median(train)
    for name in ("mean", "median", "mode"):
        errors = truth - constants[name]["value"]
        metrics = constants[name]["metrics"]
        assert metrics["rmse"] == pytest.approx(float(errors.square().mean().sqrt()))
        assert metrics["mae"] == pytest.approx(float(errors.abs().mean()))
        assert metrics["pearson"] is None  # a constant answer does not correlate
    report = (tmp_path / "run" / "report.md").read_text()
    assert f"| training mean | {constants['mean']['value']:.4g} |" in report


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="arms must include 'ce'"):
        FinetuneConfig(arms=("was",))
    with pytest.raises(ValueError, match="adaptation must be one of"):
        FinetuneConfig(adaptation="qlora")
    with pytest.raises(ValueError, match="data names the JSON Lines of task 'jsonl'"):
        FinetuneConfig(task="jsonl")
    with pytest.raises(ValueError, match="give one of the two"):
        FinetuneConfig(weight_grid=(0.3, 1.0), arm_weights=(("was", 1.0),))
    with pytest.raises(ValueError, match="readout must be one of the readouts this run has"):
        FinetuneConfig(readout="expected")  # no max_value: no distribution readouts
    with pytest.raises(ValueError, match="test_splits of task 'rjokes'"):
        FinetuneConfig(task="rjokes", test_splits=("test_harder",))
    with pytest.raises(ValueError, match="metric must be one of"):
        FinetuneConfig(metric="r2")
    with pytest.raises(ValueError, match="max_value must have at most max_digits"):
        FinetuneConfig(max_value=100, max_digits=2)
    chosen = FinetuneConfig(weight_grid=(0.3, 1.0), seeds=(4, 5), test_splits=("test",))
    assert FinetuneConfig.from_dict(chosen.to_dict()) == chosen
    assert chosen.weights_of("was") == (0.3, 1.0) and chosen.weights_of("gls") == (0.0,)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_has_one_serialisation_and_one_fingerprint(name: str) -> None:
    """From scratch or fine-tuning, a preset's settings round-trip through JSON, hash to 12 hex
    digits, and a stored setting the config does not know is refused, not dropped."""
    config = PRESETS[name].config
    stored = json.loads(json.dumps(config.to_dict()))
    assert type(config).from_dict(stored) == config
    assert len(config.fingerprint()) == 12
    assert config.fingerprint() != config.with_overrides(steps=config.steps + 1).fingerprint()
    with pytest.raises(ValueError, match=r"unknown settings \['layers'\]"):
        type(config).from_dict({**stored, "layers": 2})


def test_a_run_folder_with_arm_weights_resumes(tmp_path: Path) -> None:
    """Settings with ``arm_weights`` (the test run after a validation sweep) are recorded as JSON
    holds them, so the same settings find their own folder again (the pairs were stored as
    lists and compared as tuples: every run with --arm-weights refused its own folder)."""
    config = FinetuneConfig(arm_weights=(("was", 0.3), ("del", 1.0)))
    prepare_run_dir(config, tmp_path)
    prepare_run_dir(config, tmp_path)
    stored = json.loads((tmp_path / "config.json").read_text())
    assert FinetuneConfig.from_dict(stored) == config
    with pytest.raises(ValueError, match="differing: arm_weights"):
        prepare_run_dir(config.with_overrides(arm_weights=(("was", 1.0),)), tmp_path)


def test_command_line(
    tiny_llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from numtok.cli import main

    out = tmp_path / "cli"
    arguments = ["compare", "--preset", "smollm2-arithmetic", "--model", str(tiny_llama_dir),
                 "--steps", "2", "--seeds", "1", "--arms", "base,ce", "--threads", "1",
                 "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(arguments) == 0
    printed = capsys.readouterr().out
    assert "report.md" in printed and "learnability gate" in printed
    assert "one seed cannot give a verdict" in printed and "degrees of freedom" not in printed
    report = (out / "report.md").read_text()
    assert "**One seed cannot give a verdict**" in report and "0 degrees" not in report
    assert json.loads((out / "config.json").read_text())["steps"] == 2
    with pytest.raises(SystemExit):
        main([*arguments[:5], "--workers", "3"])
    assert "--workers does not apply" in capsys.readouterr().err


def test_the_users_training_arguments_reach_every_arms_trainer(
    tiny_llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """--training-args FILE: its TrainingArguments fields reach the Trainer (2 micro-batches a
    step, a cosine schedule to a floor after a warm-up), its max_steps and warmup_steps set the
    comparison's settings (a flag would override them), the run folder records them, and a
    rerun with other training settings is refused."""
    from numtok.cli import main
    from numtok_compare.runner import trainer

    settings = tmp_path / "training.yaml"
    settings.write_text(
        "gradient_accumulation_steps: 2\nlr_scheduler_type: cosine_with_min_lr\n"
        "lr_scheduler_kwargs: {min_lr_rate: 0.1}\nwarmup_steps: 1\nmax_steps: 3\n"
    )
    used: list[Any] = []
    original = trainer.training_arguments
    monkeypatch.setattr(
        trainer, "training_arguments", lambda *a: used.append(original(*a)) or used[-1]
    )
    out = tmp_path / "run"
    arguments = ["compare", "--preset", "smollm2-arithmetic", "--model", str(tiny_llama_dir),
                 "--seeds", "2", "--arms", "ce,was", "--threads", "1", "--batch-size", "2",
                 "--out", str(out), "--no-progress", "--training-args", str(settings)]  # fmt: skip
    assert main([*arguments, "--validation-only"]) == 0
    assert {(a.gradient_accumulation_steps, a.lr_scheduler_type,
             a.lr_scheduler_kwargs["min_lr_rate"], a.warmup_steps, a.max_steps,
             a.per_device_train_batch_size)
            for a in used} == {(2, "cosine_with_min_lr", 0.1, 1, 3, 2)}  # fmt: skip
    stored = json.loads((out / "config.json").read_text())
    assert stored["training_args"] == {
        "gradient_accumulation_steps": 2, "lr_scheduler_type": "cosine_with_min_lr",
        "lr_scheduler_kwargs": {"min_lr_rate": 0.1},
    }  # fmt: skip
    assert stored["steps"] == 3 and stored["warmup_steps"] == 1
    results = json.loads((out / "results.json").read_text())
    assert all(run["history"][-1]["step"] == 3 for run in results["runs"])
    capsys.readouterr()
    settings.write_text("gradient_accumulation_steps: 1\nwarmup_steps: 1\n")
    with pytest.raises(SystemExit):
        main([*arguments, "--steps", "3", "--validation-only"])
    assert "holds a run with other settings (differing: training_args)" in capsys.readouterr().err
    for text, message in [
        ("seed: 3\n", "seed: each arm takes its seed from --seeds"),
        ("not_a_field: 1\n", "not used by the HfArgumentParser: ['not_a_field']"),
        ("- 1\n", "must hold a mapping of TrainingArguments fields, got list"),
        ("a: [\n", "not YAML"),
    ]:
        settings.write_text(text)
        with pytest.raises(SystemExit):
            main(arguments)
        assert message in capsys.readouterr().err


@pytest.mark.parametrize("name", ["smollm2-arithmetic", "smollm2-rjokes"])
def test_a_long_preset_differs_from_its_short_one_in_the_budget_only(name: str) -> None:
    from dataclasses import fields

    from numtok_compare.presets import check_preset

    short, long = check_preset(name).config, check_preset(f"{name}-long").config
    assert isinstance(short, FinetuneConfig) and isinstance(long, FinetuneConfig)
    differing = {f.name for f in fields(short) if getattr(short, f.name) != getattr(long, f.name)}
    budget = {"steps", "warmup_steps", "train_examples", "seeds", "test_examples"}
    assert budget <= differing <= budget | {"harder_examples"}
    assert long.steps >= 10 * short.steps and long.train_examples >= 5 * short.train_examples
    assert long.seeds[: len(short.seeds)] == short.seeds  # the short run's seeds, and more


@pytest.mark.slow  # scores 150 validation jokes with every readout: about 20 s
def test_the_long_rjokes_preset_runs_on_cpu_with_two_steps(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    """The GPU budget's preset, dry-run: its settings train, score and report (here on a tiny
    model and made-up jokes, enough for its validation split, for two steps on one seed)."""
    from numtok.cli import main

    jokes_dir = tmp_path / "jokes"
    jokes_dir.mkdir()
    for name, count in (("dev.tsv.gz", 400), ("test.tsv.gz", 30)):
        with gzip.open(jokes_dir / name, "wt") as file:
            file.write("".join(f"{i % 12}\tjoke {i} about cats\n" for i in range(count)))
    out = tmp_path / "long"
    arguments = ["compare", "--preset", "smollm2-rjokes-long", "--model", str(tiny_llama_dir),
                 "--data-dir", str(jokes_dir), "--steps", "2", "--seeds", "1", "--threads", "1",
                 "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(arguments) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["steps"] == 2 and set(results["answers"]) == {"validation", "test"}
