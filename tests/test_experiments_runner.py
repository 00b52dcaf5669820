"""The runner of every comparison on toy models (one weight, a few SGD steps): the phases and
what they store, the choice of λ from validation alone, resuming, the weights it keeps and drops,
the rows built from the phases, and scoring shared by the processes of a torchrun launch."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from numtok_compare.config import RunConfig
from numtok_compare.runner import run_folder
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
    share_path,
    stored_from_every_process,
    trainable_state,
)
from numtok_compare.runner.scoring import WHOLE, Share, joined_shares
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
        (directory / CHECKPOINTS / "checkpoint-2").mkdir(parents=True, exist_ok=True)
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

    def score(
        self, answerer: nn.Linear, split: str, progress: Progress, share: Share = WHOLE
    ) -> dict[str, Any]:
        items = list(share.of(range(SPLITS[split]), 1))
        self.calls.append(f"score {split} {items}")
        weight = float(answerer.weight.detach().sum())
        progress(len(items))
        return {"answers": {"value": [weight + item for item in items]}}


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
    assert not any(call.startswith("score validation") for call in later)
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


@given(st.integers(0, 40), st.integers(1, 6), st.integers(1, 5))
def test_the_shares_are_whole_batches_in_order(items: int, batch_size: int, count: int) -> None:
    shares = [Share(index, count).of(range(items), batch_size) for index in range(count)]
    assert [item for share in shares for item in share] == list(range(items))
    assert all(share[0] % batch_size == 0 for share in shares if share)
    batches = [-(-len(share) // batch_size) for share in shares]
    assert max(batches) - min(batches) <= 1
    assert Share().of(range(items), batch_size) == range(items)


def test_the_shares_scores_join_per_item_and_refuse_a_value_of_the_whole_split() -> None:
    first = {"answers": {"greedy": [1.0, None]}, "texts": ["1", "a"], "readout": "greedy"}
    second = {"answers": {"greedy": [3.0]}, "texts": ["3"], "readout": "greedy"}
    assert joined_shares([first, second]) == {
        "answers": {"greedy": [1.0, None, 3.0]}, "texts": ["1", "a", "3"], "readout": "greedy"
    }  # fmt: skip
    with pytest.raises(ValueError, match=r"score\['minutes'\]"):
        joined_shares([{**first, "minutes": 1.0}, {**second, "minutes": 2.0}])


def _run_as(rank: int, run_dir: Path, send: Any) -> None:
    """A forked process of a two-process launch: run the phases as ``rank`` and send back what
    it did."""
    os.environ["RANK"] = str(rank)
    calls: list[str] = []
    phases, lines, reported = _run(run_dir, calls)
    send.send((phases, lines, reported, calls))


def test_under_torchrun_every_process_scores_its_share_and_the_first_stores_them_joined(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes (RANK 0 and 1 of WORLD_SIZE 2, forked) run the phases in one folder: each
    scores its half of each split's items, and the first stores exactly what one process scoring
    every item stores (but the minutes)."""
    alone, _, _ = _run(tmp_path / "one", [])
    monkeypatch.setattr(run_folder, "POLL_SECONDS", 0.01)
    monkeypatch.setenv("WORLD_SIZE", "2")
    context = multiprocessing.get_context("fork")
    pipes = [context.Pipe(duplex=False) for _ in range(2)]
    processes = [context.Process(target=_run_as, args=(rank, tmp_path / "two", send))
                 for rank, (_, send) in enumerate(pipes)]  # fmt: skip
    for process in processes:
        process.start()
    try:
        assert all(receive.poll(60) for receive, _ in pipes), "a process did not finish"
        done = [receive.recv() for receive, _ in pipes]
    finally:
        for process in processes:
            process.kill()
            process.join()
    # Each trained every job and scored its share: of 3 validation items 1 (the first) or 2,
    # of 2 test items 1; its progress counts them.
    for (_, lines, reported, _), validated in zip(done, (1, 2), strict=True):
        assert sum(line.endswith("trained and validation scored") for line in lines) == 7
        assert reported == 6 * 4 + 7 * validated + 5 * 1
    assert done[0][3].count("score validation [0]") == 7
    assert done[1][3].count("score validation [1, 2]") == 7
    assert [done[0][3].count("score test [0]"), done[1][3].count("score test [1]")] == [5, 5]

    def timeless(stored: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in stored.items() if k not in ("train_minutes", "score_minutes")}

    for rank in (0, 1):  # the first stored them and returned them; the other read them back
        shared = done[rank][0]
        assert [timeless(v) for v in shared.validation.values()] == [
            timeless(v) for v in alone.validation.values()
        ]
        assert [timeless(v) for v in shared.test.values()] == [
            timeless(v) for v in alone.test.values()
        ]
    assert not list((tmp_path / "two").rglob("*.part*"))  # the shares are deleted once joined
    one = json.loads((_directories(tmp_path / "one")[Job(1, "ce", 0.0)] / TEST).read_text())
    two = json.loads((_directories(tmp_path / "two")[Job(1, "ce", 0.0)] / TEST).read_text())
    assert list(two) == list(one) and timeless(two) == timeless(one)


def test_a_process_waiting_for_the_first_says_so_and_reads_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The second of two processes stores its share, waits (saying so on stderr) for the file
    the first writes (here a thread does), returns what it holds and deletes its share."""
    monkeypatch.setattr(run_folder, "POLL_SECONDS", 0.01)
    monkeypatch.setattr(run_folder, "NOTICE_SECONDS", 0.02)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    path = tmp_path / "validation.json"
    part = share_path(path, Share(1, 2))

    def first() -> None:
        assert json.loads(part.read_text()) == {"answers": {"value": [2, 3]}}
        path.write_text('{"answers": {"value": [0, 1, 2, 3]}}')

    def never(scored: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError("a process other than the first stored the scores")

    writer = threading.Timer(0.2, first)
    writer.start()
    stored = stored_from_every_process(
        lambda share: {"answers": {"value": list(share.of(range(4), 1))}}, never, path
    )
    writer.join()
    assert stored == {"answers": {"value": [0, 1, 2, 3]}} and not part.exists()
    assert "process 1 has waited 0 min for" in capsys.readouterr().err
