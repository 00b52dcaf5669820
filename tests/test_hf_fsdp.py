"""A patched model under FSDP2 and DDP: two processes (torchrun, gloo, CPU) each shard
(``fully_shard`` on every decoder layer and on the root) or replicate the tiny Llama, untied and
tied, patched before it is wrapped — by ``patch_model`` (logits-free, or with
``cross_entropy="model"``: the model's own CE and the number head), by
``NTLossForTrainer(logits_free=True).attach`` to a Trainer, or by ``NTLossForTrainer.attach`` to
TRL's SFTTrainer with either cross-entropy (their loss through ``trainer.compute_loss``, under
FSDP2) — and run the whole batch; the loss and every parameter's full gradient equal the
single-process reference, ``F.cross_entropy`` + λ·``number_token_loss`` on the unpatched
model's logits, within 1e-5. The output layer's weight is read inside the model's forward, where
FSDP2 holds it gathered."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _fsdp_worker import WRAPPERS
from numtok import NumberVocab

from _hf_tiny import build_tokenizer, max_relative_difference
from test_hf_patch import batch_of, gradients, reference_loss, tied_or_untied

WORKER = Path(__file__).resolve().parent / "_fsdp_worker.py"
PROCESSES, NTL_WEIGHT, TOLERANCE = 2, 1.0, 1e-5


@pytest.mark.slow  # two processes start torch, transformers and gloo: about 10 s
def test_fsdp2_and_ddp_give_the_single_process_loss_and_gradients(tmp_path: Path) -> None:
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={PROCESSES}", str(WORKER), str(tmp_path), str(NTL_WEIGHT),
    ]  # fmt: skip
    finished = subprocess.run(
        command, env=environment, capture_output=True, text=True, timeout=600, check=False
    )
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(PROCESSES)]
    tokenizer = build_tokenizer()
    vocab = NumberVocab.from_tokenizer(tokenizer)
    batch = batch_of(tokenizer)
    for tied in (False, True):
        model = tied_or_untied(tokenizer, tied)
        expected = reference_loss(model, batch, vocab)
        expected_grads = gradients(model, expected)
        for wrapper in WRAPPERS:
            for rank in ranks:
                run = rank[f"{wrapper}-{'tied' if tied else 'untied'}"]
                # Logits-free inside the wrapped forward; with the model's own cross-entropy
                # the model computes its logits, and the number head reads its hidden states.
                assert (run["logits"] is None) != wrapper.startswith("model-ce")
                assert run["sharded"] == wrapper.endswith("fsdp2")  # FSDP2's are DTensors
                torch.testing.assert_close(run["loss"], expected.detach(), rtol=1e-6, atol=0)
                assert max_relative_difference(run["gradients"], expected_grads) < TOLERANCE
