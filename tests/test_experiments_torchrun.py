"""numtok compare launched with torchrun trains each arm on all its processes (DDP, gloo on
CPU): two processes with 2 examples each train the weights one process trains with the same
global batch of 4, within 1e-4 relative (the Trainer's shuffling, sharded; its loss, and
NTLossForTrainer's, averaged over the processes' tokens). Each process scores its share of the
validation split (whole batches of 32: 40 examples, 32 and 8), and the first stores them joined:
exactly the answers one process scoring every example of the same weights gives."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from numtok_compare.finetune.comparison import FinetuneComparison, prepare
from numtok_compare.finetune.config import FinetuneConfig


@pytest.mark.slow  # three processes, two of them launched together, and a rescoring: about 30 s
def test_two_processes_train_the_weights_of_one(tiny_llama_dir: Path, tmp_path: Path) -> None:
    numtok = Path(sys.executable).parent / "numtok"
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    assert torchrun is not None and numtok.exists()
    common = ["compare", "--preset", "smollm2-arithmetic", "--model", str(tiny_llama_dir),
              "--seeds", "1", "--arms", "ce,was", "--threads", "1", "--steps", "3",
              "--train-examples", "40", "--eval-examples", "40", "--no-progress",
              "--validation-only"]  # fmt: skip
    launches = {
        "one": [str(numtok), *common, "--batch-size", "4"],
        "two": [torchrun, "--nproc_per_node", "2", str(numtok), *common, "--batch-size", "2"],
    }
    for name, command in launches.items():
        done = subprocess.run(
            [*command, "--out", str(tmp_path / name)], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-2000:]
        if name == "two":  # one process logs the run; each scores its share of every arm
            assert done.stdout.count("trained and validation scored") == 2
            for rank in (0, 1):
                assert done.stderr.count(f"numtok: process {rank} of 2 scored its share") == 2
    for arm in ("ce", "was"):
        one, two = (
            torch.load(tmp_path / name / "seed0" / arm / "model.pt", weights_only=True)
            for name in launches
        )
        assert one.keys() == two.keys()
        # It trained: LoRA's B matrices start at zero.
        assert any(float(one[key].abs().max()) > 0 for key in one if "lora_B" in key)
        for key, weights in one.items():
            scale = float(weights.abs().max())
            torch.testing.assert_close(two[key], weights, rtol=0, atol=1e-4 * scale)
    # The two processes' answers are one process's on the weights they trained, in order.
    run = tmp_path / "two"
    config = FinetuneConfig.from_dict(json.loads((run / "config.json").read_text()))
    comparison = FinetuneComparison(config, prepare(config))
    assert not list(run.rglob("*.part*"))
    for job in comparison.jobs():
        directory = comparison.directory(run, job)
        stored = json.loads((directory / "validation.json").read_text())
        alone = comparison.score(comparison.load(job, directory), "validation", lambda _: None)
        assert len(alone["texts"]) == 40
        assert {key: stored[key] for key in alone} == json.loads(json.dumps(alone))
