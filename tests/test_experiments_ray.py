"""``numtok compare --executor ray`` on a local Ray cluster (CPU): the same answers and report as
the run in one process, either executor resuming the other's folder, a worker killed mid-training
retried from its checkpoint, a failing job reported while the others finish, and a run folder the
workers cannot see refused before training. Ray starts a cluster of its own processes (about 10 s
each time), so every test here is slow."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray", reason="numtok-compare's ray extra is not installed")

pytestmark = pytest.mark.slow

NUMTOK = [sys.executable, "-m", "numtok.cli"]


def _flags(model: Path, *, steps: int = 3) -> list[str]:
    """A tiny fine-tuning comparison: 2 seeds, CE and NTL-WAS, a checkpoint every 2 steps."""
    return ["compare", "--preset", "smollm2-arithmetic", "--model", str(model), "--seeds", "2",
            "--arms", "ce,was", "--threads", "1", "--steps", str(steps), "--batch-size", "4",
            "--train-examples", "40", "--eval-examples", "6", "--no-progress"]  # fmt: skip


def _run(arguments: list[str], out: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [*NUMTOK, *arguments, "--out", str(out)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _report_without_timings(folder: Path) -> list[str]:
    """The report's lines but for the one naming the command, the workers and the wall time,
    the minutes of training and scoring left out."""
    return [re.sub(r"[\d.]+ minutes of training", "minutes of training", line)
            for line in (folder / "report.md").read_text().splitlines()
            if not line.startswith("`numtok")]  # fmt: skip


def test_a_comparison_on_ray_gives_the_answers_and_report_of_one_process(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    flags = _flags(tiny_llama_dir)
    _run(flags, tmp_path / "local")
    on_ray = _run([*flags, "--executor", "ray"], tmp_path / "ray")
    assert "trained and validation scored" in on_ray.stdout
    local, distributed = (json.loads((tmp_path / name / "results.json").read_text())
                          for name in ("local", "ray"))  # fmt: skip
    assert distributed["answers"] == local["answers"]
    assert distributed["comparisons"] == local["comparisons"]
    assert distributed["executor"] == {"ray": "local"} and "executor" not in local
    assert _report_without_timings(tmp_path / "ray") == _report_without_timings(tmp_path / "local")
    assert "Ray tasks (local cluster)" in (tmp_path / "ray" / "report.md").read_text()
    # Either executor resumes the other's folder: nothing is trained again.
    for name, executor in (("local", "ray"), ("ray", "local")):
        again = _run([*flags, "--executor", executor], tmp_path / name)
        assert "trained and validation scored" not in again.stdout
        rerun = json.loads((tmp_path / name / "results.json").read_text())
        assert rerun["answers"] == local["answers"]


def _processes(holding: bytes) -> list[int]:
    """The processes whose command line holds ``holding``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if holding in command:
                found.append(int(entry.name))
    return found


def _task_workers() -> list[int]:
    """The processes of Ray workers running a job now (Ray titles them ``ray::_run_job`` or
    ``ray::_run_job_on_processes``)."""
    return _processes(b"ray::_run_job")


def _on_ray_until_a_checkpoint(flags: list[str], out: Path) -> subprocess.Popen[str]:
    """The command on Ray, running, once seed 0's CE job has written its checkpoint at step 50
    (``trainer_state.json`` is a checkpoint's last file: one without it is not resumed)."""
    process = subprocess.Popen(
        [*NUMTOK, *flags, "--executor", "ray", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    checkpoint = out / "seed0" / "ce" / "checkpoints" / "checkpoint-50" / "trainer_state.json"
    deadline = time.monotonic() + 300
    while not checkpoint.exists():
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"{checkpoint} did not appear"
        time.sleep(0.01)
    return process


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds Ray's workers through /proc")
def test_a_worker_killed_in_training_is_retried_from_its_last_checkpoint(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    """SIGKILL the workers training the first jobs once a checkpoint is written: Ray runs the
    jobs again, each resumes at the checkpoint's step (its log says so), and the answers equal an
    undisturbed run's."""
    flags = [*_flags(tiny_llama_dir, steps=100), "--seeds", "1"]
    undisturbed = _run(flags, tmp_path / "undisturbed")
    assert "resuming" not in undisturbed.stderr
    out = tmp_path / "killed"
    process = _on_ray_until_a_checkpoint(flags, out)
    killed = _task_workers()
    assert killed, "no Ray worker was running a job"
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr[-3000:]
    # At the checkpoint of step 50, or a later one where the kill came late (a slow machine).
    resumed = dict(re.findall(r"seed 0 (\w+) λ=\S+: resuming at step (\d+)", stderr))
    assert int(resumed.get("ce", 0)) >= 50, stderr[-3000:]
    answers = [json.loads((folder / "results.json").read_text())["answers"]
               for folder in (tmp_path / "undisturbed", out)]  # fmt: skip
    assert answers[0] == answers[1]
    assert f"seed 0 ce λ=0 at step {resumed['ce']}" in (out / "report.md").read_text()


@pytest.fixture(scope="module")
def local_ray() -> Any:
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    yield ray
    ray.shutdown()


def test_a_job_that_fails_is_reported_with_its_error_after_the_others_finish(
    local_ray: Any,
) -> None:
    from numtok_compare.runner.parallel import JobsFailedError, RayCluster
    from numtok_compare.runner.ray_executor import RayExecutor

    class Bar:
        def update(self, amount: int) -> None:
            pass

    finished: list[tuple[int, Any]] = []
    executor = RayExecutor(RayCluster(cpus=1.0))
    jobs = [(math.sqrt, (4.0,)), (math.sqrt, (-1.0,)), (math.sqrt, (9.0,))]
    with pytest.raises(JobsFailedError) as failed:
        executor.run(jobs, Bar(), lambda index, result: finished.append((index, result)))
    assert sorted(finished) == [(0, 2.0), (2, 3.0)]
    assert failed.value.failures == [("sqrt", "ValueError: math domain error")]
    assert "1 job(s) failed, the others finished: sqrt: ValueError: math domain error" in str(
        failed.value
    )


def test_a_run_folder_a_node_cannot_read_is_refused(
    local_ray: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver's file must come back from every node; a node that reads other text (another
    machine's folder of the same name) is named in the refusal."""
    import numtok_compare.runner.ray_executor as ray_executor

    ray_executor.check_shared_folder(tmp_path / "run")  # one machine: every node sees it
    assert not list((tmp_path / "run").iterdir())  # the probe is removed
    monkeypatch.setattr(ray_executor, "_read_probe", lambda path: "another machine's file")
    with pytest.raises(ValueError, match=r"is not on storage every Ray node sees \(1 of 1 nodes"):
        ray_executor.check_shared_folder(tmp_path / "run")


def test_ctrl_c_cancels_the_tasks_and_the_folder_resumes_without_ray(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    """SIGINT to the driver once a job has a checkpoint: the command says how to resume and ends
    with status 130, no Ray worker is left running a job, and the same command on the local
    executor finishes the folder (resuming what was cut) with the answers of an undisturbed
    run."""
    flags = [*_flags(tiny_llama_dir, steps=100), "--seeds", "1"]
    undisturbed = _run(flags, tmp_path / "undisturbed")
    out = tmp_path / "interrupted"
    process = _on_ray_until_a_checkpoint(flags, out)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr[-3000:]
    assert f"interrupted; rerun the same command to resume from {out}" in stderr
    deadline = time.monotonic() + 30  # the cancelled workers end as Ray shuts down
    while _task_workers():
        assert time.monotonic() < deadline, "a Ray worker still runs a job of the cancelled run"
        time.sleep(0.1)
    assert not (out / "results.json").exists()
    _run(flags, out)
    answers = [json.loads((folder / "results.json").read_text())["answers"]
               for folder in (tmp_path / "undisturbed", out)]  # fmt: skip
    assert answers[0] == answers[1] and undisturbed.returncode == 0


def test_a_seed_whose_data_fails_is_reported_while_the_other_seed_finishes(
    tmp_path: Path,
) -> None:
    """The arithmetic comparison draws each seed's own questions: with seed 1's cached training
    answers broken, its jobs fail in their workers (not retried: the error is theirs), seed 0's
    are trained and stored, and the command ends with one line naming each failed job."""
    cache = tmp_path / "cache"
    flags = ["compare", "--preset", "smoke", "--seeds", "2", "--arms", "ce,was", "--steps", "5",
             "--train-examples", "20", "--eval-examples", "2", "--threads", "1", "--no-progress",
             "--cache-dir", str(cache)]  # fmt: skip
    _run([*flags, "--workers", "1"], tmp_path / "generated")
    (broken,) = cache.glob("mathematics/*/seed1-*.json")
    stored = json.loads(broken.read_text())
    stored["train"][0][1] = "x"
    broken.write_text(json.dumps(stored))
    out = tmp_path / "run"
    done = subprocess.run(
        [*NUMTOK, *flags, "--executor", "ray", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        "numtok: error: 2 job(s) failed, the others finished: seed 1 ce λ=0.3: ValueError: "
        "could not convert string to float: 'x'; seed 1 was λ=0.3: ValueError: could not convert "
        "string to float: 'x' (rerun the same command to run the failed ones again)"
    )
    assert all((out / "seed0" / arm / "validation.json").exists() for arm in ("ce", "was"))
    assert not (out / "seed1" / "ce" / "validation.json").exists()


def test_a_job_on_two_processes_trains_the_weights_of_one(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    """--job-processes 2: each job's Ray task launches torchrun, and its two processes (gloo on
    CPU) with 2 examples each train the weights one process trains with batches of 4, within 1e-4
    relative, as a comparison launched under torchrun does (test_experiments_torchrun.py); the
    report is written from the first process's answers."""
    import torch

    flags = [*_flags(tiny_llama_dir), "--seeds", "1", "--validation-only"]
    _run([*flags, "--batch-size", "4"], tmp_path / "one")
    on_two = _run(
        [*flags, "--batch-size", "2", "--executor", "ray", "--job-processes", "2"], tmp_path / "two"
    )
    assert on_two.stdout.count("trained and validation scored") == 2
    for arm in ("ce", "was"):
        one, two = (torch.load(tmp_path / name / "seed0" / arm / "model.pt", weights_only=True)
                    for name in ("one", "two"))  # fmt: skip
        assert one.keys() == two.keys()
        assert any(float(one[key].abs().max()) > 0 for key in one if "lora_B" in key)
        for key, weights in one.items():
            scale = float(weights.abs().max())
            torch.testing.assert_close(two[key], weights, rtol=0, atol=1e-4 * scale)
    assert (tmp_path / "two" / "report.md").exists()


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the processes through /proc")
def test_a_killed_worker_takes_its_jobs_processes_with_it_and_the_retry_resumes(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    """--job-processes 2: SIGKILL the Ray worker of a job training on two processes once it has a
    checkpoint; its torchrun and both processes end with it (none trains on beside the retry),
    and the retry resumes on two processes and finishes the run."""
    flags = [*_flags(tiny_llama_dir, steps=100), "--seeds", "1", "--batch-size", "2",
             "--job-processes", "2"]  # fmt: skip
    out = tmp_path / "killed"
    process = _on_ray_until_a_checkpoint(flags, out)
    launched = _processes(b"numtok_compare.runner.distributed_job")
    assert launched, "no process of the job's torchrun was found"
    for pid in _task_workers():
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while set(launched) & set(_processes(b"numtok_compare.runner.distributed_job")):
        assert time.monotonic() < deadline, "the killed job's processes still run"
        time.sleep(0.1)
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr[-3000:]
    resumed = re.findall(r"seed 0 ce λ=\S+: resuming at step (\d+)", stderr)
    assert len(resumed) == 2 and int(resumed[0]) >= 50, stderr[-3000:]  # one line a process
    assert (out / "results.json").exists()
