"""The runner of every comparison on toy models (one weight, a few SGD steps): the phases and
what they store, the choice of λ from validation alone, resuming, the weights it keeps and drops,
and the rows built from the phases."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

from numtok_compare.config import RunConfig
from numtok_compare.runner.parallel import open_executor
from numtok_compare.runner.phases import (
    TEST,
    VALIDATION,
    Arm,
    Job,
    Phases,
    UntrainedArm,
    phase_rows,
    remaining_work,
    run_phases,
)
from numtok_compare.runner.run_folder import (
    CHECKPOINTS,
    WEIGHTS,
    load_trainable_state,
    save_atomically,
    stored_by_the_main_process,
    trainable_state,
)
from numtok_compare.runner.training_log import Progress, TrainingLog


@dataclass(frozen=True)
class ToyConfig(RunConfig):
    ARMS: ClassVar[tuple[str, ...]] = ("ce", "was", "base")


CONFIG = ToyConfig(
    seeds=(0, 1), arms=("ce", "was", "base"), steps=4, warmup_steps=1, learning_rate=0.1,
    log_every=2, checkpoint_every=2,
)  # fmt: skip
GRID = (0.5, 2.0)
SPLITS = {"validation": 3, "test": 2}


@dataclass
class ToyArm:
    """Plain SGD steps of the one weight towards ``target``; it leaves a checkpoint folder as
    the Trainer would, which the runner deletes once validation is stored."""

    answerer: nn.Linear
    target: float

    def fit(self, directory: Path, progress: Progress | None) -> TrainingLog:
        optimizer = torch.optim.SGD(self.answerer.parameters(), lr=CONFIG.learning_rate)
        (directory / CHECKPOINTS / "checkpoint-2").mkdir(parents=True)
        history = []
        for step in range(CONFIG.steps):
            loss = (self.answerer.weight.sum() - self.target) ** 2
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            value = float(loss.detach())
            history.append({"step": step + 1, "loss": value, "ce": value, "ntl": None})
            if progress is not None:
                progress(1)
        save_atomically(trainable_state(self.answerer), directory / WEIGHTS)
        return TrainingLog(history, [0.0] * CONFIG.steps)


class ToyModels:
    """A one-weight model per job: it starts at the seed, steps towards λ (CE: towards 0), and
    answers its weight plus the item's index. ``base`` does not train. Every call is counted."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def build(self, job: Job) -> Arm:
        self.calls.append(f"build {job.seed} {job.arm} {job.weight:g}")
        model = nn.Linear(1, 1, bias=False)
        with torch.no_grad():
            model.weight.fill_(float(job.seed))
        if job.arm == "base":
            return UntrainedArm(model)
        return ToyArm(model, 0.0 if job.arm == "ce" else job.weight)

    def load(self, job: Job, directory: Path) -> nn.Module:
        self.calls.append(f"load {job.seed} {job.arm}")
        model: nn.Linear = self.build(job).answerer
        if job.arm != "base":
            load_trainable_state(model, torch.load(directory / WEIGHTS, weights_only=True))
        return model

    def score(self, answerer: nn.Linear, split: str, progress: Progress) -> dict[str, Any]:
        self.calls.append(f"score {split}")
        weight = float(answerer.weight.detach().sum())
        progress(SPLITS[split])
        return {"answers": {"value": [weight + item for item in range(SPLITS[split])]}}


@dataclass
class ToySource:
    config: ToyConfig
    calls: list[str]

    def models(self, seed: int) -> ToyModels:
        return ToyModels(self.calls)


def _jobs() -> list[Job]:
    return [Job(seed, arm, weight) for seed in CONFIG.seeds for arm in CONFIG.arms
            if arm != "base" or seed == CONFIG.seeds[0]
            for weight in (GRID if arm == "was" else (0.0,))]  # fmt: skip


def _directories(run_dir: Path) -> dict[Job, Path]:
    return {job: run_dir / f"seed{job.seed}" / f"{job.arm}-{job.weight:g}" for job in _jobs()}


def _closest_to_one(validation: Mapping[Job, dict[str, Any]]) -> dict[str, Any]:
    """λ of ``was``: the one whose mean first answer over the seeds is closest to 1."""

    def distance(weight: float) -> float:
        answers = [validation[Job(seed, "was", weight)]["answers"]["value"][0]
                   for seed in CONFIG.seeds]  # fmt: skip
        return abs(float(sum(answers)) / len(answers) - 1.0)

    return {"chosen": {"ce": 0.0, "base": 0.0, "was": min(GRID, key=distance)}, "means": {}}


def _run(
    run_dir: Path, calls: list[str], *, test_splits: tuple[str, ...] = ("test",)
) -> tuple[Phases, list[str], int]:
    reported: list[int] = []

    class Bar:
        def update(self, amount: int) -> None:
            reported.append(amount)

    lines: list[str] = []
    with open_executor(1) as executor:
        phases = run_phases(
            ToySource(CONFIG, calls), _jobs(), _directories(run_dir), choose=_closest_to_one,
            test_splits=test_splits, executor=executor, bar=Bar(), log=lines.append,
        )  # fmt: skip
    return phases, lines, sum(reported)


def test_the_phases_train_validate_choose_and_test_once(tmp_path: Path) -> None:
    calls: list[str] = []
    directories = _directories(tmp_path)
    work = remaining_work(
        _jobs(), directories, steps=lambda job: 0 if job.arm == "base" else CONFIG.steps,
        items=SPLITS, test_splits=("test",),
    )  # fmt: skip
    assert (work.steps, work.items) == (6 * 4, 7 * 3 + 5 * 2)  # 7 jobs, 5 (seed, arm) tested
    phases, lines, reported = _run(tmp_path, calls)
    assert reported == work.steps + work.items
    # The choice reads the validation answers alone, and the test phase follows it.
    assert phases.choice == _closest_to_one(phases.validation)
    chosen = phases.choice["chosen"]["was"]
    answers = {w: phases.validation[Job(0, "was", w)]["answers"]["value"][0] for w in GRID}
    assert answers[0.5] != answers[2.0]  # the λ trained differently: there was a choice
    assert set(phases.validation) == set(_jobs())
    assert set(phases.test) == {(0, "ce"), (0, "was"), (0, "base"), (1, "ce"), (1, "was")}
    assert all(phases.test[(s, "was")]["weight"] == chosen for s in CONFIG.seeds)
    # Every job stores its validation; only the chosen ones a test; no weights are left.
    for job, directory in directories.items():
        assert (directory / VALIDATION).exists()
        assert (directory / TEST).exists() == (job.arm != "was" or job.weight == chosen)
        assert not (directory / WEIGHTS).exists() and not (directory / CHECKPOINTS).exists()
    # The test phase scores the weights training left, rebuilt from model.pt.
    for (seed, arm), tested in phases.test.items():
        validated = phases.validation[Job(seed, arm, tested["weight"])]
        assert tested["splits"]["test"]["answers"]["value"][0] == validated["answers"]["value"][0]
    assert sum(line.endswith("trained and validation scored") for line in lines) == 7
    assert sum(line.endswith("test splits scored") for line in lines) == 5
    # A rerun reads every phase back: nothing is built, trained or scored again.
    again: list[str] = []
    rerun, _, rerun_reported = _run(tmp_path, again)
    assert again == [] and rerun_reported == 0
    assert rerun.validation == phases.validation and rerun.test == phases.test


def test_validation_only_keeps_the_weights_a_later_test_phase_reads(tmp_path: Path) -> None:
    calls: list[str] = []
    phases, _, _ = _run(tmp_path, calls, test_splits=())
    assert phases.test == {} and not list(tmp_path.rglob(TEST))
    assert len(list(tmp_path.rglob(WEIGHTS))) == 6  # every trained job's; base has none
    later: list[str] = []
    tested, _, _ = _run(tmp_path, later, test_splits=("test",))
    # Nothing is trained or scored on validation again: each build is a load's rebuild.
    assert "score validation" not in later
    assert sum(c.startswith("build") for c in later) == sum(c.startswith("load") for c in later)
    assert [c for c in later if c.startswith("load")] == [
        "load 0 ce", "load 0 was", "load 0 base", "load 1 ce", "load 1 was"
    ]  # fmt: skip
    assert tested.choice == phases.choice and not list(tmp_path.rglob(WEIGHTS))


def test_rows_hold_each_arm_at_its_chosen_lambda_in_seed_order(tmp_path: Path) -> None:
    phases, _, _ = _run(tmp_path, [])
    rows = phase_rows(phases, seeds=(1, 0), splits=("validation", "test"))
    chosen = phases.choice["chosen"]["was"]
    was = [phases.validation[Job(seed, "was", chosen)]["answers"]["value"] for seed in (1, 0)]
    assert rows["answers"]["validation"]["was"]["value"] == was
    assert rows["answers"]["validation"]["base"]["value"] == [[0.0, 1.0, 2.0]]  # one row
    assert len(rows["answers"]["test"]["ce"]["value"]) == 2
    assert [(r["seed"], r["arm"], r["weight"]) for r in rows["runs"]] == list(_jobs())
    assert set(rows["test_minutes"]) == {"seed0/ce", "seed0/was", "seed0/base", "seed1/ce",
                                         "seed1/was"}  # fmt: skip
    assert rows["minutes"] == pytest.approx(
        sum(r["train_minutes"] + r["validation_minutes"] for r in rows["runs"])
        + sum(rows["test_minutes"].values())
    )
    assert rows["choice"] is phases.choice


def test_under_torchrun_the_first_process_scores_and_the_others_read_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RANK 0 computes and stores; any other rank never computes, waits for the file (written
    here by a thread, as the first process would) and returns what it holds."""
    import json
    import threading

    path = tmp_path / "validation.json"
    monkeypatch.setenv("RANK", "0")
    assert stored_by_the_main_process(lambda: {"answers": [1]}, path) == {"answers": [1]}
    assert json.loads(path.read_text()) == {"answers": [1]}

    def never() -> dict[str, Any]:
        raise AssertionError("a process other than the first scored")

    later = tmp_path / "test.json"
    monkeypatch.setenv("RANK", "1")
    writer = threading.Timer(0.05, lambda: later.write_text('{"splits": {}}'))
    writer.start()
    assert stored_by_the_main_process(never, later, poll_seconds=0.01) == {"splits": {}}
    writer.join()
