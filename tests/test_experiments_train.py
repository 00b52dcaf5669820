"""The arms trained from scratch: paired (the same initial weights), the loss on the answer columns,
and exact resumption after an interruption, in process and by killing a real run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("mathematics_dataset", reason="needs the harness: pip install ./compare[demo]")

from numtok_compare.objectives import ARMS, Objective
from numtok_compare.presets import PRESETS
from numtok_compare.runner.batches import answer_batch, training_batch
from numtok_compare.runner.phases import Job, train_and_validate
from numtok_compare.runner.run_folder import arm_directory
from numtok_compare.runner.trainer import objective_loss
from numtok_compare.scratch.arithmetic import ArithmeticTask, run_experiment
from numtok_compare.scratch.arm import number_vocab
from numtok_compare.scratch.config import ExperimentConfig
from numtok_compare.tasks.mathematics import MathData, load_data

SMOKE = PRESETS["smoke"].config


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("questions")


@pytest.fixture(scope="module")
def data(cache_dir: Path) -> MathData:
    return load_data(
        SMOKE.task,
        0,
        train_questions=SMOKE.train_questions,
        eval_questions=SMOKE.eval_questions,
        cache_dir=cache_dir,
    )


def test_every_arm_starts_from_the_same_weights(data: MathData) -> None:
    task = ArithmeticTask(SMOKE, data)

    def initial(seed: int, arm: str) -> dict[str, torch.Tensor]:
        return task.build(Job(seed, arm, SMOKE.weight_of(arm))).model.state_dict()

    states = [initial(7, arm) for arm in ("ce", "was", "mse")]
    for state in states[1:]:
        for name, tensor in states[0].items():
            assert torch.equal(state[name], tensor), name
    head = initial(7, "head")
    for name, tensor in head.items():
        if name.startswith("decoder."):
            assert torch.equal(states[0][name.replace("decoder.", "model.", 1)], tensor), name
    assert not head["head.weight"].any()
    other_seed = initial(8, "ce")
    embedding = "model.embed_tokens.weight"
    assert not torch.equal(other_seed[embedding], states[0][embedding])


@pytest.mark.parametrize("arm", [arm for arm in ARMS if arm != "head"])
def test_the_answer_columns_give_the_loss_of_the_whole_rows(
    arm: str, data: MathData, tmp_path: Path
) -> None:
    """A from-scratch arm trains on left-padded batches whose logits are kept at the answer
    columns only: its loss, through the Trainer (the model's own, attach()'s or the objective's),
    equals the arm's objective on every position of the right-padded rows."""
    config = SMOKE.with_overrides(ntl_weight=0.7)
    task = ArithmeticTask(config, data)
    built = task.build(Job(0, arm, config.weight_of(arm)))
    trainer = built.trainer(tmp_path)
    examples = task.examples[:8]
    pad_id = task.tokenizer.pad_token_id
    kept = answer_batch(examples, pad_id)
    assert kept["labels"].shape[1] == kept["logits_to_keep"] < kept["input_ids"].shape[1]
    torch.manual_seed(1)  # NTIL's Gumbel noise: the same draws for both
    loss = trainer.compute_loss(built.model, dict(kept))
    whole = training_batch(examples, pad_id)
    with torch.no_grad():
        logits = built.model(input_ids=whole["input_ids"], attention_mask=whole["attention_mask"])
    objective = Objective(arm, number_vocab(task.tokenizer), ntl_weight=config.weight_of(arm))
    torch.manual_seed(1)
    expected = objective_loss(objective)({"logits": logits.logits}, whole["labels"])
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    loss.backward()
    assert all(p.grad is not None and p.grad.isfinite().all() for p in built.model.parameters())


def _comparable(result: dict[str, Any]) -> dict[str, Any]:
    """What must not change when a run is interrupted and resumed (timings may): the logged
    losses, and the answers where the entry holds them (a job's, not a report row's)."""
    return {key: result[key] for key in ("seed", "arm", "history", "answers") if key in result}


class _InterruptError(Exception):
    pass


def test_interrupted_arm_resumes_to_identical_results(tmp_path: Path, data: MathData) -> None:
    config = SMOKE.with_overrides(steps=35, checkpoint_every=10, log_every=5)
    task = ArithmeticTask(config, data)
    job = Job(0, "was", config.weight_of("was"))
    reference = train_and_validate(task, job, tmp_path / "straight", lambda _: None)

    done = 0

    def interrupt_after_23_steps(steps: int) -> None:
        nonlocal done
        done += steps
        if done == 23:
            raise _InterruptError

    directory = tmp_path / "resumed"
    with pytest.raises(_InterruptError):
        train_and_validate(task, job, directory, interrupt_after_23_steps)
    checkpoint = directory / "checkpoints" / "checkpoint-20"
    assert checkpoint.exists() and not (directory / "validation.json").exists()

    resumed_steps: list[int] = []
    resumed = train_and_validate(task, job, directory, resumed_steps.append)
    # Restarted from the checkpoint at step 20, not from 0: the first report counts step 21
    # with the 20 steps before it.
    assert resumed_steps[0] == 21 and sum(resumed_steps) == 35
    assert _comparable(resumed) == _comparable(reference)
    assert json.loads((directory / "validation.json").read_text()) == json.loads(
        json.dumps(resumed)
    )
    assert not checkpoint.exists() and (directory / "model.pt").exists()


def _wait_for(path: Path, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.005)


@pytest.mark.slow
def test_killed_run_resumes_to_identical_results(tmp_path: Path, cache_dir: Path) -> None:
    """SIGKILL a real ``numtok`` process mid-arm, rerun the same command, compare with a run that
    was never interrupted."""
    flags = ["--task", "arithmetic__add_or_sub", "--steps", "150", "--batch-size", "8",
             "--train-examples", "400", "--eval-examples", "10", "--seeds", "1", "--arms",
             "ce,was", "--workers", "1", "--threads", "1", "--no-progress",
             "--cache-dir", str(cache_dir)]  # fmt: skip
    command = [sys.executable, "-m", "numtok.cli", "demo", *flags, "--out", str(tmp_path / "run")]
    environment = {**os.environ, "PYTHONHASHSEED": "0"}
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment
    )
    checkpoints = arm_directory(tmp_path / "run", 0, "was") / "checkpoints"
    _wait_for(checkpoints / "checkpoint-100", process, timeout=120)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert (arm_directory(tmp_path / "run", 0, "ce") / "validation.json").exists()
    assert not (arm_directory(tmp_path / "run", 0, "was") / "validation.json").exists()

    finished = subprocess.run(command, capture_output=True, env=environment, check=True)
    assert b"run folder" in finished.stdout

    config = PRESETS["demo"].config.with_overrides(
        steps=150, batch_size=8, train_questions=400, eval_questions=10, seeds=(0,),
        arms=("ce", "was"),
    )  # fmt: skip
    straight = run_experiment(
        config, tmp_path / "straight", cache_dir=cache_dir, show_progress=False
    )
    resumed = json.loads((tmp_path / "run" / "results.json").read_text())
    assert [_comparable(r) for r in resumed["runs"]] == [_comparable(r) for r in straight["runs"]]
    assert resumed["answers"] == straight["answers"]


def test_config_is_validated_before_any_work() -> None:
    with pytest.raises(ValueError, match="steps must be at least 1, got 0"):
        SMOKE.with_overrides(steps=0)
    with pytest.raises(ValueError, match=r"ntl_weight must be a finite number >= 0, got -0\.3"):
        SMOKE.with_overrides(ntl_weight=-0.3)
    with pytest.raises(ValueError, match="unknown device 'gpu'"):
        SMOKE.with_overrides(device="gpu")
    with pytest.raises(ValueError, match="arms must include 'ce'"):
        SMOKE.with_overrides(arms=("was",))
    with pytest.raises(ValueError, match=r"unknown: \['ntl'\]"):
        SMOKE.with_overrides(arms=("ce", "ntl"))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"torch\.cuda\.is_available\(\) is False"):
            SMOKE.with_overrides(device="cuda")
    assert ExperimentConfig.from_dict(SMOKE.to_dict()) == SMOKE
    assert SMOKE.fingerprint() == ExperimentConfig.from_dict(SMOKE.to_dict()).fingerprint()
    assert SMOKE.fingerprint() != SMOKE.with_overrides(steps=41).fingerprint()


def test_single_arms_take_their_own_weight() -> None:
    config = SMOKE.with_overrides(arms=("ce", "was", "del"), arm_weights=(("del", 2.5),))
    assert (config.weight_of("was"), config.weight_of("del")) == (SMOKE.ntl_weight, 2.5)
    assert config.weights_text() == f"λ: was {SMOKE.ntl_weight:g}, del 2.5"
    assert ExperimentConfig.from_dict(config.to_dict()) == config
    assert config.fingerprint() != config.with_overrides(arm_weights=(("del", 3.0),)).fingerprint()
    with pytest.raises(
        ValueError, match=r"arm_weights must be \(arm, λ\) pairs .* \('cat', 1\.0\)"
    ):
        SMOKE.with_overrides(arm_weights=(("cat", 1.0),))
    with pytest.raises(ValueError, match="the λ of was must be a finite number >= 0"):
        SMOKE.with_overrides(arm_weights=(("was", -1.0),))
    with pytest.raises(ValueError, match="names an arm twice"):
        SMOKE.with_overrides(arm_weights=(("was", 1.0), ("was", 2.0)))


def test_the_arm_weights_flag_reads_pairs() -> None:
    import argparse

    from numtok_compare.cli import _arm_weights

    assert _arm_weights("was=3, del=0.5") == (("was", 3.0), ("del", 0.5))
    for bad in ("was", "was=x", "was:3"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected arm=λ pairs"):
            _arm_weights(bad)


def test_the_users_training_arguments_reach_a_comparison_from_scratch(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--training-args FILE with a preset trained from scratch: its fields reach every arm's
    Trainer, its max_steps sets the comparison's steps, and the run folder records them."""
    from numtok.cli import main
    from numtok_compare.runner import trainer

    settings = tmp_path / "training.json"
    settings.write_text(
        json.dumps({"gradient_accumulation_steps": 2, "warmup_steps": 2, "max_steps": 6})
    )
    used: list[Any] = []
    original = trainer.training_arguments
    monkeypatch.setattr(
        trainer, "training_arguments", lambda *a: used.append(original(*a)) or used[-1]
    )
    out = tmp_path / "run"
    status = main(
        ["compare", "--preset", "smoke", "--seeds", "1", "--arms", "ce,was", "--workers", "1",
         "--no-progress", "--cache-dir", str(cache_dir), "--training-args", str(settings),
         "--out", str(out)]
    )  # fmt: skip
    assert status == 0
    assert {(a.gradient_accumulation_steps, a.warmup_steps, a.max_steps) for a in used} == {
        (2, 2, 6)
    }
    stored = json.loads((out / "config.json").read_text())
    assert stored["training_args"] == {"gradient_accumulation_steps": 2}
    assert stored["steps"] == 6 and stored["warmup_steps"] == 2
    results = json.loads((out / "results.json").read_text())
    assert all(run["history"][-1]["step"] == 6 for run in results["runs"])
