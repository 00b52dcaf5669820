"""One process of the DDP test (``test_hf_distributed.py``), launched by torchrun on CPU (gloo).

Each process trains one optimizer step of the tiny Llama on its shard of the data with gradient
accumulation, through the real Trainer, three times: with :meth:`NTLossForTrainer.attach` (exact),
attached with ``logits_free=True`` (exact, from the hidden states) and with the loss passed as
``compute_loss_func`` alone (the token-share approximation). It saves the synchronised gradients
and the logged CE/NTL of every run to ``<out>/rank<r>.pt``.

Usage: ``torchrun --nproc_per_node 2 tests/_ddp_worker.py OUT_DIR NTL_WEIGHT MICRO_BATCH STEPS``
"""

from __future__ import annotations

import gc
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

from numtok.hf import NTLossForTrainer

from _hf_tiny import (
    build_dataset,
    build_model,
    build_tokenizer,
    collate,
    gradient_recorder,
    training_args,
)


def train_once(out_dir: Path, ntl_weight: float, micro_batch: int, steps: int, mode: str) -> Any:
    """``mode``: "attached", "logits_free" (attached too) or "plain"."""
    from transformers import Trainer

    tokenizer = build_tokenizer()
    recorder = gradient_recorder()
    loss_fn = NTLossForTrainer(tokenizer, ntl_weight=ntl_weight, logits_free=mode == "logits_free")
    trainer = Trainer(
        model=build_model(tokenizer),
        args=training_args(
            out_dir / mode,
            per_device_train_batch_size=micro_batch,
            gradient_accumulation_steps=steps,
            ddp_backend="gloo",
        ),
        train_dataset=build_dataset(tokenizer),
        data_collator=lambda features: collate(features, tokenizer.pad_token_id),
        compute_loss_func=loss_fn,
        callbacks=[recorder],
    )
    if mode != "plain":
        loss_fn.attach(trainer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the plain run warns that it is approximate
        trainer.train()
    return {"gradients": recorder.gradients[0], "log": trainer.state.log_history[0]}


def main() -> None:
    out_dir = Path(sys.argv[1])
    ntl_weight, micro_batch, steps = float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(1)
    results = {
        mode: train_once(out_dir, ntl_weight, micro_batch, steps, mode)
        for mode in ("attached", "logits_free", "plain")
    }
    rank = torch.distributed.get_rank()
    results["world_size"] = torch.distributed.get_world_size()  # type: ignore[assignment]
    torch.save(results, out_dir / f"rank{rank}.pt")
    shut_down_gloo()


def shut_down_gloo() -> None:
    """Destroy the process group (the Trainers' accelerate made it) and with it gloo's worker
    threads, joined, while the interpreter is whole.

    Gloo runs each collective on a worker thread ("pt_gloo_runloop"), which lets go of the
    collective's tensors only after the caller's ``wait()`` has returned; a tensor that Python has
    already dropped is freed there, taking the GIL. A thread that does so after the interpreter
    has begun to finalize (the last such frees come 20-80 ms before the exit: a thread held up
    that long on a loaded machine; left running, this group was only destroyed with the modules,
    during finalization) is ended by Python 3.11 with ``pthread_exit``, whose unwinding through
    the work's noexcept destructor calls ``std::terminate``: "terminate called without an active
    exception", SIGABRT, after the results are saved. Freeing the group joins the threads, with
    the GIL released, so that such a pending free completes first. A Trainer left in a reference
    cycle would still hold its DDP-wrapped model, and through it the group: collected first, so
    that destroying frees it.
    """
    gc.collect()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
