"""Every route under DeepSpeed ZeRO-2 and ZeRO-3, exact: two processes (torchrun, gloo,
``DS_ACCELERATOR=cpu``) each train one optimizer step of the tiny Llama, untied and tied, with
2 micro-batches of 2 examples (gradient accumulation 2), through each route of
``tests/_deepspeed_worker.py``: ``NTLossForTrainer.attach`` to the Trainer (from the logits and
logits-free) and to TRL's SFTTrainer (TRL's and numtok's cross-entropy), ``patch_model`` (numtok's
and the model's cross-entropy) in the Trainer and in a plain ``deepspeed.initialize`` loop, and
the number head beside the model's own loss in a plain loop. The step's loss and every
parameter's update equal one process on the whole batch, ``F.cross_entropy`` + λ·
``number_token_loss`` of the unpatched model's logits and one SGD step, within 1e-5 (relative
to the largest update). Under ZeRO-3 every parameter is partitioned (none kept whole), the
Trainer's models come out of ``deepspeed.zero.Init`` already partitioned, and the output layer's
weight is gathered where numtok reads it inside the forward (``numtok.hf._zero3``).

deepspeed (the ``dev`` extra's pin, installed with ``DS_BUILD_OPS=0``: pure Python) builds its
CPU shared-memory communication op with the C++ compiler the first time a process group starts
(cached in ``~/.cache/torch_extensions``); one stage's launch takes about 1-2 minutes on 2 cores.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from _deepspeed_worker import LEARNING_RATE, ROUTES
from numtok import NumberVocab, number_token_loss

from _hf_tiny import EQUAL_SHARES, EXAMPLES, build_dataset, build_model, build_tokenizer, collate

WORKER = Path(__file__).resolve().parent / "_deepspeed_worker.py"
PROCESSES, NTL_WEIGHT, TOLERANCE = 2, 1.0, 1e-5


def _save_models(folder: Path) -> None:
    tokenizer = build_tokenizer()
    for tied in (False, True):
        model = build_model(tokenizer)
        if tied:
            model.config.tie_word_embeddings = True
            model.tie_weights()
        model.save_pretrained(folder / ("tied" if tied else "untied"))


def _reference(models: Path, tied: bool, examples: list[tuple[str, str]]) -> dict[str, Any]:
    """One process, the whole batch: the loss and the parameters after one SGD step."""
    from transformers import LlamaForCausalLM

    tokenizer = build_tokenizer()
    model = LlamaForCausalLM.from_pretrained(models / ("tied" if tied else "untied"))
    batch = collate(build_dataset(tokenizer, examples), tokenizer.pad_token_id)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    labels = batch["labels"]
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
    vocab = NumberVocab.from_tokenizer(tokenizer)
    loss = ce + NTL_WEIGHT * number_token_loss(logits, labels, vocab, shift=True)
    named = dict(model.named_parameters())
    grads = torch.autograd.grad(loss, list(named.values()))
    before = {name: p.detach().clone() for name, p in named.items()}
    after = {n: before[n] - LEARNING_RATE * g for n, g in zip(named, grads, strict=True)}
    return {"loss": loss.item(), "before": before, "after": after}


def _relative_update_error(run: dict[str, torch.Tensor], reference: dict[str, Any]) -> float:
    """``max |Δ_run − Δ_ref| / max |Δ_ref|`` over all parameters, Δ the step's update."""
    before, after = reference["before"], reference["after"]
    assert run.keys() == after.keys()
    scale = max(float((after[n] - before[n]).abs().max()) for n in after)
    return max(float((run[n] - after[n]).abs().max()) for n in after) / scale


@pytest.mark.slow  # two processes start DeepSpeed and run 18 steps: 1-2 minutes per stage
@pytest.mark.parametrize("stage", [2, 3], ids=["zero2", "zero3"])
def test_every_route_gives_the_single_process_step(tmp_path: Path, stage: int) -> None:
    models = tmp_path / "models"
    _save_models(models)
    environment = {
        **os.environ,
        "DS_ACCELERATOR": "cpu",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": os.pathsep.join([str(WORKER.parent), os.environ.get("PYTHONPATH", "")]),
    }
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={PROCESSES}", str(WORKER), str(tmp_path), str(models), str(stage),
        str(NTL_WEIGHT),
    ]  # fmt: skip
    finished = subprocess.run(
        command, env=environment, capture_output=True, text=True, timeout=1200, check=False
    )
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-5000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(PROCESSES)]
    assert all(rank["world_size"] == PROCESSES for rank in ranks)
    figures = {}
    for tied in (False, True):
        varied, equal = (
            _reference(models, tied, examples) for examples in (EXAMPLES, EQUAL_SHARES)
        )
        for route in ROUTES:
            name = f"{route}-{'tied' if tied else 'untied'}"
            # attach counts the step's number positions; the per-micro-batch means of
            # patch_model and of a plain loop are exact where the shares are equal.
            expected = equal if route.startswith(("patch", "loop")) else varied
            loss_error = max(abs(r[name]["loss"] - expected["loss"]) for r in ranks)
            loss_error /= expected["loss"]
            update_error = max(
                _relative_update_error(r[name]["parameters"], expected) for r in ranks
            )
            figures[name] = f"loss {loss_error:.1e}, update {update_error:.1e}"
            assert loss_error < TOLERANCE, (name, figures[name])
            assert update_error < TOLERANCE, (name, figures[name])
            # Under ZeRO-3 the Trainer's models came out of zero.Init partitioned.
            partitioned = stage == 3 and not route.startswith("loop")
            assert all(r[name]["partitioned_before_numtok"] == partitioned for r in ranks), name
    rows = [f"{name}: {figure}" for name, figure in figures.items()]
    print(f"ZeRO-{stage}, max relative difference to one process:", *rows, sep="\n  ")
