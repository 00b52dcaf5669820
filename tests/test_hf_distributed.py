"""Exact across processes: two DDP processes (torchrun, gloo, CPU), each with gradient
accumulation, give the synchronised gradients of one process on the full batch, from the logits
and logits-free (the output layer's weight untied, so that only the loss reaches it: DDP's
default ``find_unused_parameters=True`` must not take it for unused).

Each of the 2 processes takes 2 micro-batches of 2 examples per optimizer step: 8 examples in
all, the whole data set, so the step covers the same examples as the single-process reference
whatever the sampler's order. The number share differs between micro-batches and processes, so
the plain ``compute_loss_func`` (no ``attach``) is visibly off: the test can fail.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from numtok.hf import NTLossForTrainer

from _hf_tiny import (
    EXAMPLES,
    build_dataset,
    build_model,
    build_tokenizer,
    collate,
    gradient_recorder,
    max_relative_difference,
    training_args,
)

WORKER = Path(__file__).resolve().parent / "_ddp_worker.py"
PROCESSES, MICRO_BATCH, STEPS, NTL_WEIGHT = 2, 2, 2, 1.0
TOLERANCE = 1e-5


def reference(output_dir: Path) -> dict[str, Any]:
    """One process, one batch of all examples, no accumulation."""
    from transformers import Trainer

    tokenizer = build_tokenizer()
    recorder = gradient_recorder()
    trainer = Trainer(
        model=build_model(tokenizer),
        args=training_args(output_dir),
        train_dataset=build_dataset(tokenizer),
        data_collator=lambda features: collate(features, tokenizer.pad_token_id),
        callbacks=[recorder],
    )
    NTLossForTrainer(tokenizer, ntl_weight=NTL_WEIGHT).attach(trainer)
    trainer.train()
    return {"gradients": recorder.gradients[0], "log": trainer.state.log_history[0]}


@pytest.mark.slow
def test_ddp_with_accumulation_gives_the_single_process_gradients(tmp_path: Path) -> None:
    assert len(EXAMPLES) == PROCESSES * MICRO_BATCH * STEPS
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={PROCESSES}",
        str(WORKER),
        str(tmp_path),
        str(NTL_WEIGHT),
        str(MICRO_BATCH),
        str(STEPS),
    ]
    finished = subprocess.run(
        command, env=environment, capture_output=True, text=True, timeout=600, check=False
    )
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(PROCESSES)]
    assert all(rank["world_size"] == PROCESSES for rank in ranks)

    expected = reference(tmp_path / "reference")
    for rank in ranks:
        for mode in ("attached", "logits_free"):
            exact = rank[mode]
            assert max_relative_difference(exact["gradients"], expected["gradients"]) < TOLERANCE
            for key in ("loss", "ce", "ntl"):
                assert exact["log"][key] == pytest.approx(expected["log"][key], rel=TOLERANCE)
        # Without the step-wide, all-process count of number positions NTL is weighted wrongly.
        plain = rank["plain"]["gradients"]
        assert max_relative_difference(plain, expected["gradients"]) > 1e-2
    # DDP synchronised the processes' gradients.
    for mode in ("attached", "logits_free"):
        assert (
            max_relative_difference(ranks[1][mode]["gradients"], ranks[0][mode]["gradients"]) == 0
        )
